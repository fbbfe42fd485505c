"""One function computed by a forked child while the parent goes on (a second core); validate's
R7 read-ahead. io/forkpool is its sibling for a pool of workers.

The child only computes: it returns plain data through a pipe (checks send findings as
`checks/rows`), and the parent decides what to do with it. Whenever the child cannot be used
(no fork, one core, `--threads 1`, other threads running, the child died, raised, was killed or
went silent for `TIMEOUT_S` while awaited) the parent runs the same function itself, so results
never depend on whether a child ran. The child is always reaped: `close` (also on an exception or an interrupt in the
parent) kills it if it still runs and waits for it; SIGINT and SIGTERM kill the child outright.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from exl3tool.io.forking import fork_held, release_in_child

T = TypeVar("T")
TIMEOUT_S = 120.0  # of silence while the parent waits: it then runs the function itself
_CHUNK = 1 << 20
_NONE = object()


def can_fork(threads: int | None) -> bool:
    """Whether a forked child may run next to this process: Linux, more than one core usable,
    not `--threads 1`, and no other thread (a fork copies locks other threads may hold)."""
    if threads == 1 or sys.platform != "linux" or not hasattr(os, "fork"):
        return False
    return len(os.sched_getaffinity(0)) > 1 and threading.active_count() == 1


class Forked(Generic[T]):
    """`fn()` computed by a forked child (when `parallel`) or else by `result` itself."""

    def __init__(self, fn: Callable[[], T], parallel: bool) -> None:
        self._fn = fn
        self._pid = 0
        self._fd = -1
        if parallel:
            self._start()

    def _start(self) -> None:
        r, w = os.pipe()
        try:
            pid, mask = fork_held()
        except OSError:  # no memory or process slots for a child: the parent computes it
            os.close(r)
            os.close(w)
            return
        if pid == 0:  # the child: compute, write, leave without running any of the parent's exits
            code = 1
            try:
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                release_in_child(mask)
                os.close(r)
                data = pickle.dumps(self._fn(), protocol=pickle.HIGHEST_PROTOCOL)
                view = memoryview(data)
                while view:
                    view = view[os.write(w, view[:_CHUNK]) :]
                code = 0
            except BaseException:  # the parent computes it again (and reports what it raises)
                pass
            finally:
                os._exit(code)
        os.close(w)
        self._pid, self._fd = pid, r

    @property
    def started(self) -> bool:
        """Whether a child is computing the value (else `result` computes it here)."""
        return self._pid != 0

    def result(self) -> T:
        """The child's value, or `fn()` computed here when the child gave none."""
        got = self.from_child(_NONE)
        return self._fn() if got is _NONE else got

    def from_child(self, default: Any) -> Any:
        """The child's value, or `default` when it gave none (nothing is computed here)."""
        data = self._collect() if self._pid else None
        if data is None:
            return default
        return pickle.loads(data)  # our own child's bytes, over a pipe only it could write

    def _collect(self) -> bytes | None:
        """The child's bytes; None when it failed or sent nothing for TIMEOUT_S (counted from
        when the parent asks, and again from each chunk: a long run of the parent's own never
        makes a finished child late)."""
        chunks: list[bytes] = []
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                return None
            if not poller.poll(left * 1000):
                continue
            chunk = os.read(self._fd, _CHUNK)
            if not chunk:
                break
            chunks.append(chunk)
            deadline = time.monotonic() + TIMEOUT_S
        status = self._reap(kill=False)
        return b"".join(chunks) if status == 0 else None

    def _reap(self, kill: bool) -> int:
        """Wait for the child (killed first when `kill`); its exit code, -1 when unknown. The
        pid is forgotten only once reaped, so an interrupt here still leaves `close` to do it."""
        fd, self._fd = self._fd, -1  # cleared first: never closed twice
        if fd >= 0:
            os.close(fd)
        pid = self._pid
        if not pid:
            return -1
        if kill:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:  # reaped elsewhere (a SIGCHLD handler): no status
            status = -1
        self._pid = 0
        return -1 if status == -1 else os.waitstatus_to_exitcode(status)

    def close(self) -> None:
        """Kill the child if it still runs and reap it (idempotent)."""
        if self._pid or self._fd >= 0:
            self._reap(kill=True)

    def __enter__(self) -> Forked[T]:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
