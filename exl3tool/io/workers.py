"""The one worker pool: threads for I/O and hashing (hashlib, blake3 and pread release the GIL).

`run_threads` runs callables in named daemon threads and joins them; the first exception any
of them raised is re-raised in the caller's thread. `map_threads` is `map` over a pool of
`workers` threads, results in input order.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def run_threads(targets: Sequence[Callable[[], object]], name: str = "exl3tool") -> None:
    """Run each target in its own thread (inline when there is one) and wait for all."""
    if len(targets) == 1:
        targets[0]()
        return
    errors: list[BaseException] = []

    def guarded(target: Callable[[], object]) -> None:
        try:
            target()
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)

    pool = [
        threading.Thread(target=guarded, args=(t,), name=f"{name}-{i}", daemon=True)
        for i, t in enumerate(targets)
    ]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]


def map_threads(
    fn: Callable[[T], R], items: Iterable[T], workers: int, name: str = "exl3tool"
) -> list[R]:
    """[fn(x) for x in items], computed by up to `workers` threads; the first error is raised."""
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

    run_threads([worker] * max(1, min(workers, len(todo))), name)
    return results  # type: ignore[return-value]
