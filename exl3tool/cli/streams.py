"""The standard streams as the field hands them over: closed, in a non-UTF-8 encoding, to a
pipe whose reader has gone, or with a terminal width of 0. Set up before any output."""

from __future__ import annotations

import contextlib
import os
import sys

EPIPE_EXIT = 128 + 13  # as a process ended by SIGPIPE reports itself


def prepare() -> None:
    """A closed stdout or stderr writes nowhere (instead of failing on its first write); a
    stream that cannot encode a character (an ASCII or Latin-1 locale meeting "…" or "§")
    writes it as an escape; COLUMNS=0, which would make every table zero wide, is ignored."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None:
            setattr(sys, name, open(os.devnull, "w", encoding="utf-8"))  # noqa: SIM115
            continue
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("_", "-")
        if encoding not in ("utf-8", "utf8") and hasattr(stream, "reconfigure"):
            with contextlib.suppress(OSError, ValueError):
                stream.reconfigure(errors="backslashreplace")
    if os.environ.get("COLUMNS", "").strip() in ("0", "+0", "-0"):
        del os.environ["COLUMNS"]


def flush() -> None:
    """Flush stdout now, so that a reader that has gone is noticed inside the command."""
    sys.stdout.flush()


def reader_gone() -> int:
    """The exit code when stdout's reader went away (EPIPE); later writes go nowhere, so the
    interpreter's own flush at exit cannot fail again."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return EPIPE_EXIT
