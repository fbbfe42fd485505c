"""User-facing error types; the CLI maps each to one exit code (cli/main.py)."""

from __future__ import annotations


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
