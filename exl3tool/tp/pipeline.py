"""One reader, many consumers, a few shared buffers: each block is read once into a pooled
buffer and handed to every consumer; the buffer goes back to the pool when the last consumer
is done with it (a reference count per block). The reader runs at most `depth - 1` blocks
ahead of the slowest consumer, so memory is `depth` buffers whatever the source size.

pread, numpy copies, hashing and writes release the GIL, so the reader and the consumers
(one thread each) overlap on as many cores as there are. The blocks may be an iterator that
plans them as it goes (`tp.blocks.iter_blocks`): the reader thread draws them, so the first
blocks are read (and written) while the later ones are still planned.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Generic, TypeVar

import numpy as np

from exl3tool.io.workers import Worker, join_all, start_all

B = TypeVar("B")
Read = Callable[[B, np.ndarray], None]  # fill the buffer with the block's bytes
Take = Callable[[B, np.ndarray], None]  # one consumer's work on a block that was read


class _Pool(Generic[B]):
    def __init__(self, depth: int, size: int, consumers: int, done: Callable[[B], None]) -> None:
        # One lock, two wait queues: a freed buffer wakes the reader only, a published block
        # the consumers only (with one queue, every release woke every waiting consumer too).
        lock = threading.Lock()
        self._space = threading.Condition(lock)  # the reader waits here for a free buffer
        self._published = threading.Condition(lock)  # consumers wait here for the next block
        self._free = [np.empty(size, dtype=np.uint8) for _ in range(depth)]
        self._ready: dict[int, list] = {}  # block index -> [block, buffer, consumers left]
        self._count: int | None = None  # blocks in all, once the reader has seen the last
        self._consumers = consumers
        self._done = done
        self.failed = False

    def acquire(self) -> np.ndarray | None:
        with self._space:
            while not self.failed and not self._free:
                self._space.wait()
            return None if self.failed else self._free.pop()

    def publish(self, b: int, block: B, buf: np.ndarray) -> None:
        with self._published:
            self._ready[b] = [block, buf, self._consumers]
            self._published.notify_all()

    def end(self, count: int) -> None:
        with self._published:
            self._count = count
            self._published.notify_all()

    def get(self, b: int) -> tuple[B, np.ndarray] | None:
        """Block `b` and its buffer; None after the last block, or once a thread failed."""
        with self._published:
            while not self.failed and b not in self._ready and self._count is None:
                self._published.wait()
            if self.failed or b not in self._ready:
                return None
            entry = self._ready[b]
            return entry[0], entry[1]

    def release(self, b: int) -> None:
        with self._published:
            entry = self._ready[b]
            entry[2] -= 1
            if entry[2] == 0:
                del self._ready[b]
                self._free.append(entry[1])
                self._done(entry[0])
                self._space.notify()

    def fail(self) -> None:
        with self._published:
            self.failed = True
            self._published.notify_all()
            self._space.notify_all()


def run_pipeline(
    blocks: Iterable[B],
    read: Read[B],
    consumers: Sequence[Take[B]],
    *,
    size: int,
    depth: int,
    threaded: bool,
    done: Callable[[B], None],
    meanwhile: Callable[[], None] | None = None,
) -> None:
    """Read every block into a `size`-byte buffer and give it to each consumer, in order.

    `threaded`: the reader and each consumer in a thread of their own, `depth` buffers;
    otherwise one buffer, everything in this thread. `done(block)` runs once per block, after
    its last consumer. `meanwhile()` runs in this thread while the others work (first, when
    not threaded). The first error of any thread is raised here, the others stop."""
    if not threaded:
        if meanwhile is not None:
            meanwhile()
        buf = np.empty(size, dtype=np.uint8)
        for blk in blocks:
            read(blk, buf)
            for take in consumers:
                take(blk, buf)
            done(blk)
        return
    pool: _Pool[B] = _Pool(max(2, depth), size, len(consumers), done)

    def reader() -> None:
        b = 0
        for blk in blocks:
            buf = pool.acquire()
            if buf is None:
                return
            read(blk, buf)
            pool.publish(b, blk, buf)
            b += 1
        pool.end(b)

    def consumer(take: Take[B]) -> None:
        b = 0
        while (got := pool.get(b)) is not None:
            take(got[0], got[1])
            pool.release(b)
            b += 1

    errors: list[BaseException] = []

    def guarded(fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)
            pool.fail()  # the others stop waiting

    targets = [reader, *(lambda c=c: consumer(c) for c in consumers)]
    threads = [Worker(partial(guarded, t), f"exl3slice-{i}") for i, t in enumerate(targets)]
    start_all(threads, pool.fail)
    try:
        if meanwhile is not None:
            meanwhile()
    except BaseException:
        pool.fail()
        join_all(threads, pool.fail)
        raise
    join_all(threads, pool.fail)  # an interrupt stops them, and is raised once they are done
    if errors:
        raise errors[0]
