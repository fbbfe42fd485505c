"""SIGINT and SIGTERM at any moment: the stack unwinds (temp directories and atomic writers
clean up), then one quiet line and exit 130 (Ctrl-C) or 143 (SIGTERM). Installed by the
console entry point before the heavy imports, so a Ctrl-C during start-up is quiet too."""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

from exl3tool.rules.errors import Interrupted, defer_interrupt

_fired = False


def _handler(signum: int, _frame: FrameType | None) -> None:
    global _fired
    if _fired:  # a second signal while cleaning up: leave now
        os._exit(128 + signum)
    _fired = True
    if defer_interrupt(signum):  # a cleanup under way: raised when it is done
        return
    raise Interrupted(signum)


def install() -> None:
    """Route SIGINT and SIGTERM to `Interrupted` (main thread only, as Python requires)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _handler)


def say(exc: BaseException) -> int:
    """Write the one line for an interruption; its exit code (the mapping of actions.errors)."""
    from exl3tool.actions import errors

    try:
        sys.stderr.write(f"exl3tool: {errors.message(exc)}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    return errors.exit_code(exc)
