"""A fork that an interrupt cannot split: the child is never stopped between `fork()` and the
signal handlers it sets for itself.

Python runs a signal handler at the next bytecode after the signal arrives. A Ctrl-C that
reaches a child in its first few bytecodes (before it ignores SIGINT or restores the default)
raises KeyboardInterrupt there, and the child unwinds through the parent's own code: its
`except` blocks, its exit messages, its cleanup of the parent's workers. `fork_held` forks with
SIGINT and SIGTERM blocked; the parent unblocks them at once (a signal that came meanwhile is
then delivered to it as usual), the child only when its own handlers are set
(`release_in_child`), so whatever arrived meanwhile meets those handlers.
"""

from __future__ import annotations

import os
import signal

STOP_SIGNALS = frozenset((signal.SIGINT, signal.SIGTERM))


def fork_held() -> tuple[int, frozenset[int]]:
    """`os.fork()` with SIGINT and SIGTERM blocked across it: (pid, the mask to restore). The
    parent's mask is restored before this returns; the child's stays blocked until it calls
    `release_in_child(mask)`, once its handlers are set. OSError as `os.fork` raises it."""
    before = frozenset(signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS))
    try:
        pid = os.fork()
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
        raise
    if pid:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
    return pid, before


def release_in_child(before: frozenset[int]) -> None:
    """In a child of `fork_held`, once its handlers are set: the mask it was forked with."""
    signal.pthread_sigmask(signal.SIG_SETMASK, before)
