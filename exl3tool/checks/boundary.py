"""The exception boundary of a check family (issue 15 item 3): an exception escaping a family's
checks becomes one finding of that family's `check-crashed` rule, with the exception and the
innermost exl3tool source line as its location, instead of a traceback.

What passes through: exl3tool's own user-facing errors (InputError: a file changed while read,
exit 3) and interrupts (BaseException, not Exception)."""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterator
from pathlib import Path

from exl3tool.rules import crash
from exl3tool.rules.errors import Exl3ToolError
from exl3tool.rules.registry import Findings, Rule

_PACKAGE = Path(__file__).resolve().parents[1]
MAX_MESSAGE = 200  # characters of the exception text kept (hostile names can be long)


def where(exc: BaseException) -> str:
    """`module.py:line in function` of the innermost frame inside exl3tool."""
    last = None
    for fr in traceback.extract_tb(exc.__traceback__):
        try:
            rel = Path(fr.filename).resolve().relative_to(_PACKAGE)
        except ValueError:
            continue
        if rel == Path("checks/boundary.py"):
            continue
        last = f"exl3tool/{rel.as_posix()}:{fr.lineno} in {fr.name}"
    return last or "outside exl3tool"


def crash_message(exc: BaseException) -> str:
    text = str(exc).encode("unicode_escape", "replace").decode("ascii")
    if len(text) > MAX_MESSAGE:
        text = text[:MAX_MESSAGE] + "..."
    return f"{type(exc).__name__}: {text} (at {where(exc)}); the checks after it were skipped"


# artifact kind (formats.detect.Kind values) -> its family's crash rule
_BY_KIND = {
    "exl3": crash.EX_CRASH,
    "safetensors": crash.EX_CRASH,
    "r7": crash.R7_CRASH,
    "rank-sliced": crash.RS_CRASH,
    "msrt-base": crash.MB_CRASH,
    "cartridge": crash.CA_CRASH,
}
# exl3tool's own errors (a file changed while read: exit 3) and unreadable inputs pass through
PASSTHROUGH: tuple[type[BaseException], ...] = (Exl3ToolError, PermissionError, IsADirectoryError)


def crash_rule(kind: str) -> Rule:
    """The crash rule of an artifact kind's family (checkpoint container when unknown)."""
    return _BY_KIND.get(kind, crash.CK_CRASH)


@contextlib.contextmanager
def family_boundary(findings: Findings, rule: Rule, file: str | None = None) -> Iterator[None]:
    """Run a family's checks; an unexpected exception becomes one finding of `rule`."""
    try:
        yield
    except PASSTHROUGH:
        raise
    except Exception as exc:  # the boundary: anything else is a bug the artifact triggered
        findings.add(rule, crash_message(exc), file=file)
