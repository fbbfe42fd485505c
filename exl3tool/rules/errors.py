"""User-facing error types; the CLI maps each to one exit code (cli/main.py)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator


class Exl3ToolError(Exception):
    """Base of every error exl3tool reports to a user instead of a traceback."""

    exit_code = 1


class UsageError(Exl3ToolError):
    """The command line asks for something impossible (exit 2)."""

    exit_code = 2


class InputError(Exl3ToolError):
    """A given path cannot be read at all (exit 3)."""

    exit_code = 3


class OutputError(Exl3ToolError):
    """An output cannot be written (existing target without --force, disk full, ...)."""

    exit_code = 1


def missing_extra(module: str, extra: str, what: str) -> UsageError:
    """The one-line error for a command whose optional dependency is not installed (exit 2)."""
    return UsageError(f"{what} needs {module}: pip install 'exl3tool[{extra}]'")


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived (the CLI's handlers raise it). It unwinds like
    KeyboardInterrupt, so temp directories and atomic writers clean up; exit 128 + signal."""

    def __init__(self, signum: int = 2) -> None:
        super().__init__(signum)  # args stay (signum,): it pickles across worker processes
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


# Interrupts held back while a cleanup runs (`interrupts_deferred`): the CLI's handler asks
# `defer_interrupt` first.
_deferring = [0]
_held: list[int] = []


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold interrupts back for the block (a cleanup one must not cut short: removing a
    temporary tree, publishing an output): a SIGINT or SIGTERM that comes meanwhile is raised
    as Interrupted when the outermost such block ends. A second signal still ends the process
    at once (the CLI's rule). Only the main thread, where Python runs signal handlers, holds
    them back: elsewhere the block is plain."""
    threading = sys.modules.get("threading")  # no thread without it: this is the main one
    if threading is not None and threading.current_thread() is not threading.main_thread():
        yield
        return
    _deferring[0] += 1
    try:
        yield
    finally:
        _deferring[0] -= 1
        if not _deferring[0] and _held:
            signum = _held[0]
            _held.clear()
            raise Interrupted(signum)


def defer_interrupt(signum: int) -> bool:
    """For a signal handler: True when `signum` is held for the end of a deferred block."""
    if _deferring[0]:
        _held.append(signum)
        return True
    return False
