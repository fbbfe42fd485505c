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
