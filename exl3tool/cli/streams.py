"""The standard streams as the field hands them over: closed, in a non-UTF-8 encoding, to a
pipe whose reader has gone, or with a terminal width of 0. Set up before any output."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

EPIPE_EXIT = 128 + 13  # as a process ended by SIGPIPE reports itself


def prepare() -> None:
    """A closed stdout or stderr writes nowhere (instead of failing on its first write); a
    stream that cannot encode a character (an ASCII or Latin-1 locale meeting "…" or "§")
    writes it as an escape; COLUMNS of 0 or less, which would make every table zero wide, is
    ignored; stderr never ends the command (`_QuietStderr`)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None:
            setattr(sys, name, open(os.devnull, "w", encoding="utf-8"))  # noqa: SIM115
            continue
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("_", "-")
        if encoding not in ("utf-8", "utf8") and hasattr(stream, "reconfigure"):
            with contextlib.suppress(OSError, ValueError):
                stream.reconfigure(errors="backslashreplace")
    try:
        if int(os.environ.get("COLUMNS", "x")) <= 0:
            del os.environ["COLUMNS"]
    except ValueError:
        pass  # not a number: the terminal libraries ignore it themselves
    if sys.stderr is not None and not isinstance(sys.stderr, _QuietStderr):
        sys.stderr = _QuietStderr(sys.stderr)


class _QuietStderr:
    """stderr that goes quiet when its reader has gone: a message that cannot be shown is not
    a reason to lose the command's exit code or its stdout (exit 141 is stdout's alone)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._gone()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._gone()

    def _gone(self) -> None:
        _to_devnull(self._stream)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def flush() -> None:
    """Flush stdout now, so that a reader that has gone is noticed inside the command."""
    sys.stdout.flush()


def reader_gone() -> int:
    """The exit code when stdout's reader went away (EPIPE); later writes go nowhere, so the
    interpreter's own flush at exit cannot fail again."""
    _to_devnull(sys.stdout)
    return EPIPE_EXIT


def _to_devnull(stream: Any) -> None:
    """Point the file descriptor under `stream` at /dev/null: what is still buffered, and
    every later write, goes nowhere without an error."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
