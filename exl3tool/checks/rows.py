"""Findings as plain tuples, to cross a process boundary (io/forked) and back: a pickled Rule
would be a copy, not the rule, so rows name rules by code."""

from __future__ import annotations

from collections.abc import Iterable

from exl3tool.rules.registry import Finding, Location, Severity, get_rule

Row = tuple[str, str, "str | None", "str | None", "str | None", "str | None"]


def rows(findings: Iterable[Finding]) -> tuple[Row, ...]:
    """Findings as plain tuples (rules by code: a pickled Rule would be a copy, not the rule)."""
    out = []
    for f in findings:
        loc, sev = f.location, f.severity
        out.append((f.rule.code, f.message, loc.file, loc.tensor, loc.pointer, sev and sev.value))
    return tuple(out)


def from_rows(items: Iterable[Row]) -> list[Finding]:
    return [
        Finding(get_rule(code), msg, Location(file, tensor, ptr), Severity(sev) if sev else None)
        for code, msg, file, tensor, ptr, sev in items
    ]
