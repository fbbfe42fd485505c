"""A resource budget for the checks (issue 15 item 2): work is sized by what an artifact holds
(its tensors), never by a count it declares. A declared count whose slots exceed the tensors
present by far is one CK098 finding, and the check that would enumerate it is skipped."""

from __future__ import annotations

from exl3tool.rules.crash import CK_DECLARED_COUNT
from exl3tool.rules.registry import Findings

# Declared slots a check may enumerate beyond 4 per tensor present: a few missing layers or
# experts of a real checkpoint stay findings per tensor; 10^9 declared experts do not.
MAX_EXTRA_SLOTS = 200_000


def within_budget(declared: int, present: int) -> bool:
    return declared <= MAX_EXTRA_SLOTS + 4 * present


def check_declared(
    declared: int, present: int, what: str, findings: Findings, **where: str | None
) -> bool:
    """True when enumerating `declared` slots is affordable; else one CK098 finding."""
    if within_budget(declared, present):
        return True
    findings.add(
        CK_DECLARED_COUNT,
        f"{what} declare {declared} slots but the artifact holds {present} tensors; "
        "the checks of each slot were skipped",
        **where,
    )
    return False
