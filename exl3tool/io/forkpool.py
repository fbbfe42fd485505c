"""Work units run by forked worker processes: hashing that neither the GIL nor one address
space serialises.

A pool of threads hashes in parallel only between the GIL's hand-overs (one per tensor), and
every page drop of a shared mapping stalls each thread of the process (a TLB shootdown). On 16
cores both cost about half the hashing throughput; forked workers have neither
(benchmarks/identity_process_probe.py: 36 GB of GLM-5.2-shaped shards hashed in 1.2 s by 16
processes, 2.6 s by 16 threads).

`ForkPool` forks the workers at once; each calls `start(progress)` once, then runs
`work(unit)` for units it takes from a shared pipe of unit indices (so a slow unit holds back
only its own worker) and sends each result back; the parent's reader threads pass them to
`accept`. The first error of any worker (its exception, pickled, or its death by a signal:
WorkerDied) is raised by `wait()`; the other workers are then killed. Workers never return to
the caller's code: they leave with `os._exit` and ignore SIGINT (the parent stops them).
Linux only (`available()`). Unlike io/forked, this forks while other threads run (a progress
bar's refresh thread): a lock one of them held at the fork stays held in the worker, so a worker
touches nothing but its units, their files and its pipes, and its sys.stdout and sys.stderr are
/dev/null (a message Python itself prints there cannot wait for a lock of the parent's).
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import signal
import struct
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from exl3tool.io.forking import fork_held, release_in_child
from exl3tool.rules.errors import InputError

_HEAD = struct.Struct("<cI")  # a frame: its kind and the length of its pickled body
_INDEX = struct.Struct("<I")  # a unit index on the task pipe (4 bytes: reads are atomic)
_MAX_UNITS = 1 << 32  # indices 0 .. 2^32 - 1
_PROGRESS, _RESULT, _ERROR, _DONE = b"P", b"R", b"E", b"Z"


class WorkerDied(InputError):
    """A worker process ended without its results (killed by a signal, out of memory): the
    input was not read (exit 3)."""


def available() -> bool:
    """Whether work can be forked here (Linux, fork allowed)."""
    return sys.platform.startswith("linux") and hasattr(os, "fork")


def resident_bytes() -> int:
    """This process's resident memory (0 where /proc/self/statm cannot be read)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class _Forward:
    """A worker's progress: `advance(n)` is sent to the parent, which advances its own bar."""

    def __init__(self, send: Callable[[bytes, Any], None]) -> None:
        self._send = send

    def advance(self, n: int) -> None:
        self._send(_PROGRESS, n)


class ForkPool:
    """`workers` processes that run every unit of `units` (see the module docstring)."""

    def __init__(
        self,
        workers: int,
        units: Sequence[Any],
        start: Callable[[Any], Callable[[Any], Any]],
        accept: Callable[[Any], None],
        progress: Any,
    ) -> None:
        if len(units) > _MAX_UNITS:
            raise ValueError(f"{len(units)} units: a pool takes at most {_MAX_UNITS}")
        self._accept = accept
        self._progress = progress
        self._errors: list[BaseException] = []
        self._children: dict[int, int] = {}  # pid -> read end of its result pipe
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        task_r, self._task_w = os.pipe()
        # The indices are fed from the start and each worker's reader starts as soon as it is
        # forked: the first workers hash while the others are still forked (a fork copies this
        # process's page tables: benchmarks/fork_cost.py). The feeder never closes its end
        # (a worker forked later would close the fd number again, maybe reused by then): the
        # parent does, once the feeder is done, and the workers then see EOF.
        self._feeder = threading.Thread(
            target=_feed, args=(self._task_w, len(units)), name="exl3fork-feed", daemon=True
        )
        try:
            self._feeder.start()
            for _ in range(min(max(workers, 1), len(units))):  # none for no units
                if self._errors:  # a worker failed already: no more of them
                    break
                out_r, out_w = os.pipe()
                try:
                    with warnings.catch_warnings():  # 3.12+: "multi-threaded, use of fork()"
                        warnings.simplefilter("ignore", DeprecationWarning)
                        pid, mask = fork_held()
                except OSError:
                    os.close(out_r)
                    os.close(out_w)
                    if not self._children:
                        raise
                    break  # as many workers as the system allows
                if pid == 0:  # pragma: no cover (a worker; coverage is not collected there)
                    _worker(task_r, out_w, units, start, (self._task_w, out_r), mask)
                os.close(out_w)
                with self._lock:
                    self._children[pid] = out_r
                reader = threading.Thread(
                    target=self._read, args=(pid, out_r), name=f"exl3fork-{pid}", daemon=True
                )
                reader.start()
                self._threads.append(reader)
        except BaseException:
            os.close(task_r)
            self.close()
            raise
        os.close(task_r)  # only the workers read the indices now (a feed with none left: EPIPE)
        self.pids = tuple(self._children)  # the workers forked (fewer where fork failed)
        self.size = len(self.pids)

    def _read(self, pid: int, fd: int) -> None:
        """Pass one worker's frames on until it is done; a worker that ends early is an error."""
        done = False
        try:
            with os.fdopen(fd, "rb") as pipe:
                while not done:
                    head = pipe.read(_HEAD.size)
                    if len(head) < _HEAD.size:
                        break
                    kind, n = _HEAD.unpack(head)
                    data = pipe.read(n)
                    if len(data) < n:
                        break
                    body = pickle.loads(data)
                    if kind == _RESULT:
                        self._accept(body)
                    elif kind == _PROGRESS:
                        self._progress.advance(body)
                    elif kind == _ERROR:
                        self._fail(body)
                        return
                    else:
                        done = True
        except BaseException as exc:  # the parent's own failure to accept a result
            self._fail(exc)
            return
        status = self._reap_one(pid)
        if not done:
            how = (
                f"was killed by signal {os.WTERMSIG(status)}"
                if status is not None and os.WIFSIGNALED(status)
                else "ended"
            )
            self._fail(WorkerDied(f"a hashing worker (pid {pid}) {how} before it was done"))

    def cancel(self) -> None:
        """Kill every worker now, from any thread (a reader's too): the units they had not sent
        are lost; `wait` then raises WorkerDied and `close` reaps them."""
        self._kill()

    def _fail(self, exc: BaseException) -> None:
        self._errors.append(exc)
        self._kill()

    def _kill(self) -> None:
        with self._lock:  # never a reaped pid: the system may have given it to another process
            for pid in self._children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def _reap_one(self, pid: int) -> int | None:
        """Wait for a worker whose pipe has closed; its exit status (None if already reaped)."""
        with self._lock:
            if self._children.pop(pid, None) is None:
                return None
            try:
                return os.waitpid(pid, 0)[1]
            except ChildProcessError:
                return None

    def _end_feed(self) -> None:
        """Once every index is written (or no worker reads any more), close the feed: EOF."""
        if self._feeder.ident is not None:  # started
            self._feeder.join()
        fd, self._task_w = self._task_w, -1  # cleared first: never closed twice
        if fd >= 0:
            os.close(fd)

    def wait(self) -> None:
        """Until every worker is done; the first error is raised."""
        self._end_feed()
        for t in self._threads:
            t.join()
        self._reap()
        if self._errors:
            raise self._errors[0]

    def close(self) -> None:
        """Stop and reap every worker (after an error or an interrupt in the parent)."""
        self._kill()
        self._end_feed()  # the killed workers closed their read ends: the feed ends in EPIPE
        for t in self._threads:  # a reader ends at its worker's death; then its pid may go
            t.join()
        self._reap()

    def _reap(self) -> None:
        for pid in list(self._children):
            self._reap_one(pid)


def _feed(fd: int, count: int) -> None:
    """Every unit index, in order, on the task pipe (its owner closes it: EOF for the workers)."""
    step = 1024  # 4 KiB writes: each is atomic, so every read of 4 bytes gets one index
    with contextlib.suppress(OSError):  # EPIPE: every worker is gone (an error), none to feed
        for lo in range(0, count, step):
            os.write(fd, b"".join(_INDEX.pack(i) for i in range(lo, min(count, lo + step))))


def _worker(  # pragma: no cover (runs in the forked process)
    task: int,
    out: int,
    units: Sequence[Any],
    start: Callable[[Any], Callable[[Any], Any]],
    parent_fds: tuple[int, ...],
    mask: frozenset[int],
) -> None:
    """A forked worker's whole life (from `fork_held`, SIGINT and SIGTERM still blocked): units
    from `task`, frames to `out`, then `os._exit`. `parent_fds`: the parent's ends, closed here."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops its workers
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        release_in_child(mask)
        for fd in parent_fds:
            os.close(fd)
        gc.disable()  # a collection would touch (and copy) every object the parent holds
        sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (the worker's life)
        pipe = os.fdopen(out, "wb", buffering=1 << 16)

        def send(kind: bytes, body: Any) -> None:
            data = pickle.dumps(body, pickle.HIGHEST_PROTOCOL)
            pipe.write(_HEAD.pack(kind, len(data)))
            pipe.write(data)

        try:
            work = start(_Forward(send))
            while len(raw := os.read(task, _INDEX.size)) == _INDEX.size:
                send(_RESULT, work(units[_INDEX.unpack(raw)[0]]))
                pipe.flush()
            send(_DONE, None)
        except BaseException as exc:
            try:
                pickle.loads(pickle.dumps(exc))  # one the parent could not rebuild is sent as text
                send(_ERROR, exc)
            except Exception:
                send(_ERROR, RuntimeError(f"{type(exc).__name__}: {exc}"))
        pipe.flush()
        code = 0
    finally:
        os._exit(code)
