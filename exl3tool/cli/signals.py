"""SIGINT and SIGTERM at any moment: the stack unwinds (temp directories and atomic writers
clean up), then one quiet line and exit 130 (Ctrl-C) or 143 (SIGTERM). Installed by the
console entry point before the heavy imports: a Ctrl-C during most of start-up is quiet too (not
in the interpreter's own first milliseconds, before any of exl3tool runs)."""

from __future__ import annotations

import _imp
import contextlib
import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

from exl3tool.rules.errors import Interrupted, defer_interrupt

_fired = False


def _handler(signum: int, frame: FrameType | None) -> None:
    global _fired
    if _fired:  # a second signal while cleaning up: leave now
        os._exit(128 + signum)
    if _unsafe(frame) and _again(signum):  # raised here, it could leave a lock held
        return
    _fired = True
    _pending[:] = [signum]  # until the command ends: see `received`
    if defer_interrupt(signum):  # a cleanup under way: raised when it is done
        return
    raise Interrupted(signum)


_pending: list[int] = []


def received() -> int | None:
    """The signal this process received and has not acted on by the end of its command: sent
    again after an import the command then finished, or raised where Python could only print
    it (a `__del__`, a weakref callback) and went on. The command then ends as interrupted."""
    return _pending[0] if _pending else None


def _unraisable(info: Any) -> None:
    """`sys.unraisablehook`: an Interrupted raised where Python cannot propagate it is sent
    again (to land elsewhere), not printed as a traceback; anything else as Python would."""
    global _fired
    exc = info.exc_value
    if isinstance(exc, Interrupted):
        _fired = False
        if not _again(exc.signum):
            _fired = True  # the retries are spent: the command ends as interrupted
        return
    sys.__unraisablehook__(info)


def finish() -> None:
    """The command is over: signals are ignored from here. Interpreter shutdown would set them
    back to the default action, which kills the process without its message or exit code."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(ValueError, OSError):  # not the main thread
            signal.signal(sig, signal.SIG_IGN)


# The import system's own frames: an exception raised between its acquiring a lock and the
# `try` that releases it (CPython has no guard there) leaves the lock held for good, and the
# next thread that imports waits on it forever (a slice interrupted while a worker thread
# imported blake3 hung so).
_IMPORT_FILES = frozenset(
    ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>")
)
RETRY_S = 0.005
MAX_RETRIES = 200  # then raised anyway (one second: no import takes that long)
_retries = [0]


# Where an exception cannot be raised safely: a class body's `__set_name__` as the innermost
# frame (type() turns it into a RuntimeError traceback), and `Thread.start` (interrupted
# between two releases of its lock: "release unlocked lock", or a thread that runs unjoined).
# A wait elsewhere in threading (join_all's) is where an interrupt normally lands: raised.
_UNSAFE_NAMES = frozenset(("__set_name__", "__init_subclass__"))


def _unsafe(frame: FrameType | None) -> bool:
    """Whether the main thread is inside the import system (or its global lock is held), in
    `Thread.start`, or in a frame where an exception cannot be raised safely."""
    if frame is not None and frame.f_code.co_name in _UNSAFE_NAMES:
        return True
    while frame is not None:
        code = frame.f_code
        if code.co_filename in _IMPORT_FILES:
            return True
        if code.co_name == "start" and code.co_filename == threading.__file__:
            return True
        frame = frame.f_back
    return _imp.lock_held()


def _again(signum: int) -> bool:
    """Deliver `signum` to this process again in RETRY_S (a timer thread: a handler must not
    wait); False once the retries are spent. Also where no other thread runs yet: a lock left
    held blocks the threads the command starts later (a slice's workers hung so)."""
    if _retries[0] >= MAX_RETRIES:
        return False
    _retries[0] += 1
    _pending[:] = [signum]
    timer = threading.Timer(RETRY_S, os.kill, (os.getpid(), signum))
    timer.daemon = True
    timer.start()
    return True


def install() -> None:
    """Route SIGINT and SIGTERM to `Interrupted` (main thread only, as Python requires)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _handler)
    sys.unraisablehook = _unraisable


def say(exc: BaseException) -> int:
    """Write the one line for an interruption; its exit code (the mapping of actions.errors)."""
    from exl3tool.actions import errors

    try:
        sys.stderr.write(f"exl3tool: {errors.message(exc)}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    return errors.exit_code(exc)
