"""One reader, many consumers, a few shared buffers: each block is read once into a pooled
buffer and handed to every consumer; the buffer goes back to the pool when the last consumer
is done with it (a reference count per block). The reader runs at most `depth - 1` blocks
ahead of the slowest consumer, so memory is `depth` buffers whatever the source size.

pread, numpy copies, hashing and writes release the GIL, so the reader and the consumers
(one thread each) overlap on as many cores as there are.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import numpy as np

from exl3tool.io.workers import run_threads

B = TypeVar("B")
Read = Callable[[B, np.ndarray], None]  # fill the buffer with the block's bytes
Take = Callable[[B, np.ndarray], None]  # one consumer's work on a block that was read


class _Pool(Generic[B]):
    def __init__(self, depth: int, size: int, consumers: int, done: Callable[[B], None]) -> None:
        self._cond = threading.Condition()
        self._free = [np.empty(size, dtype=np.uint8) for _ in range(depth)]
        self._ready: dict[int, list] = {}  # block index -> [buffer, consumers left]
        self._consumers = consumers
        self._done = done
        self.failed = False

    def acquire(self) -> np.ndarray | None:
        with self._cond:
            while not self.failed and not self._free:
                self._cond.wait()
            return None if self.failed else self._free.pop()

    def publish(self, b: int, buf: np.ndarray) -> None:
        with self._cond:
            self._ready[b] = [buf, self._consumers]
            self._cond.notify_all()

    def get(self, b: int) -> np.ndarray | None:
        with self._cond:
            while not self.failed and b not in self._ready:
                self._cond.wait()
            return None if self.failed else self._ready[b][0]

    def release(self, b: int, block: B) -> None:
        with self._cond:
            entry = self._ready[b]
            entry[1] -= 1
            if entry[1] == 0:
                del self._ready[b]
                self._free.append(entry[0])
                self._done(block)
                self._cond.notify_all()

    def fail(self) -> None:
        with self._cond:
            self.failed = True
            self._cond.notify_all()


def run_pipeline(
    blocks: Sequence[B],
    read: Read[B],
    consumers: Sequence[Take[B]],
    *,
    size: int,
    depth: int,
    threaded: bool,
    done: Callable[[B], None],
) -> None:
    """Read every block into a `size`-byte buffer and give it to each consumer, in order.

    `threaded`: the reader and each consumer in a thread of their own, `depth` buffers;
    otherwise one buffer, everything in this thread. `done(block)` runs once per block, after
    its last consumer. The first error of any thread is raised here, the others stop."""
    if not threaded:
        buf = np.empty(size, dtype=np.uint8)
        for blk in blocks:
            read(blk, buf)
            for take in consumers:
                take(blk, buf)
            done(blk)
        return
    pool: _Pool[B] = _Pool(max(2, depth), size, len(consumers), done)

    def reader() -> None:
        for b, blk in enumerate(blocks):
            buf = pool.acquire()
            if buf is None:
                return
            read(blk, buf)
            pool.publish(b, buf)

    def consumer(take: Take[B]) -> None:
        for b, blk in enumerate(blocks):
            buf = pool.get(b)
            if buf is None:
                return
            take(blk, buf)
            pool.release(b, blk)

    def guarded(fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException:
            pool.fail()  # the others stop waiting; run_threads re-raises this one
            raise

    targets = [lambda: guarded(reader)]
    targets += [lambda c=c: guarded(lambda: consumer(c)) for c in consumers]
    run_threads(targets, "exl3slice")
