"""The one worker pool: threads for I/O and hashing (hashlib, blake3 and pread release the GIL).

`run_threads` runs callables in named daemon threads (`Worker`) and waits for them all
(`join_all`: an interrupt asks them to stop and is raised once they have); the first exception
any of them raised is re-raised in the caller's thread. `map_threads` is `map` over a pool of
`workers` threads, results in input order. `Background` computes one value beside the caller.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Worker(threading.Thread):
    """A daemon thread that tells when its target has returned (`finished`). Waiting on that,
    unlike `join`, survives an interrupt: CPython 3.11's `join`, interrupted, marks a thread
    that still runs as stopped, and every later `join` of it returns at once."""

    def __init__(self, target: Callable[[], object], name: str) -> None:
        super().__init__(name=name, daemon=True)
        self._work = target
        self.finished = threading.Event()

    def run(self) -> None:
        try:
            self._work()
        finally:
            self.finished.set()


def join_all(threads: Iterable[Worker], stop: Callable[[], None] | None = None) -> None:
    """Wait for every thread. An exception while waiting (an interrupt) calls `stop` once (which
    asks the threads to end early) and is raised only when every thread has ended: the
    caller's cleanup (removing a temporary output) never races a thread still writing."""
    pending: BaseException | None = None
    for t in threads:
        while True:
            try:
                t.finished.wait()
                break
            except BaseException as exc:
                if pending is None:
                    pending = exc
                    if stop is not None:
                        stop()
    if pending is not None:
        raise pending


def start_all(threads: Sequence[Worker], stop: Callable[[], None] | None = None) -> None:
    """Start every thread. An interrupt while starting them calls `stop` and is raised once the
    ones already started have ended (`join_all`)."""
    started: list[Worker] = []
    try:
        for t in threads:
            t.start()
            started.append(t)
    except BaseException:
        if stop is not None:
            stop()
        join_all(started)
        raise


def run_threads(
    targets: Sequence[Callable[[], object]],
    name: str = "exl3tool",
    stop: Callable[[], None] | None = None,
) -> None:
    """Run each target in its own thread (inline when there is one) and wait for all (see
    `join_all`: an interrupt calls `stop`, then waits all the same)."""
    if len(targets) == 1:
        targets[0]()
        return
    errors: list[BaseException] = []

    def guarded(target: Callable[[], object]) -> None:
        try:
            target()
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)

    pool = [Worker(partial(guarded, t), f"{name}-{i}") for i, t in enumerate(targets)]
    start_all(pool, stop)
    join_all(pool, stop)
    if errors:
        raise errors[0]


class Background(Generic[T]):
    """`fn()` computed in a daemon thread while the caller goes on; `result()` waits for it.
    Only for work that writes nothing a caller cleans up: a caller that fails meanwhile (an
    interrupt) leaves it, and the process's exit ends it."""

    def __init__(self, fn: Callable[[], T], name: str = "exl3tool-bg") -> None:
        self._value: T | None = None
        self._error: BaseException | None = None

        def run() -> None:
            try:
                self._value = fn()
            except BaseException as exc:  # re-raised by `result`, in the caller's thread
                self._error = exc

        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()

    def result(self) -> T:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


def map_threads(
    fn: Callable[[T], R],
    items: Iterable[T],
    workers: int,
    name: str = "exl3tool",
    stop: Callable[[], None] | None = None,
) -> list[R]:
    """[fn(x) for x in items], computed by up to `workers` threads; the first error is raised.
    An interrupt while waiting takes no new item, calls `stop` (to end the items under way
    early) and is raised once every thread has ended (`join_all`)."""
    todo = list(items)
    results: list[R | None] = [None] * len(todo)
    lock = threading.Lock()
    queue = iter(range(len(todo)))
    failed: list[bool] = []

    def worker() -> None:
        while not failed:
            with lock:
                i = next(queue, None)
            if i is None:
                return
            try:
                results[i] = fn(todo[i])
            except BaseException:
                failed.append(True)
                raise

    def halt() -> None:
        failed.append(True)
        if stop is not None:
            stop()

    run_threads([worker] * max(1, min(workers, len(todo))), name, halt)
    return results  # type: ignore[return-value]
