"""One output file of the slicer, written through an aligned staging buffer.

Every byte is copied (or gathered, for column slices) once into the stage; each full stage is
hashed and written in one call, so the digests are of the bytes written. Where the file system
takes it the file is written with O_DIRECT: the data goes from the stage to the disk, not
through the page cache (no kernel copy, no fresh page-cache pages: on a VM each one can cost
tens of microseconds to fault in; and the publishing fsync finds little left to do). The last
partial block, or everything where O_DIRECT is refused, is written through the page cache,
whose writeback is started every `writeback` bytes. Durability stays with the caller: the
publisher fsyncs every file (io/atomic.py).

An O_DIRECT write returns only when the device has the data, so a stream's stages are written
by threads of their own (`Stages`): the stream gathers and hashes the next stage while earlier
ones are on their way to the disk. Each stage is written at its own offset (`pwrite`), so
`writers` threads can keep that many writes of one stream in flight.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

try:
    import fcntl
except ImportError:  # not POSIX: never O_DIRECT
    fcntl = None  # type: ignore[assignment]

ALIGN = 4096  # O_DIRECT offset, length and address granularity (and a page)
SMALL_COPY = 64 << 10  # pieces up to this size are copied without releasing the GIL
# bytes per write through the page cache: 8 MiB writes measured 5-7x the CPU of 256 KiB ones
# on the 2-core VM (Linux 6.18, ext4; 20 vs 3.6 CPU-s for a 2 GB TP 2 slice)
BUFFERED_WRITE = 256 << 10
_O_DIRECT = getattr(os, "O_DIRECT", 0)


def stage_buffer(size: int) -> np.ndarray:
    """A page-aligned buffer of `size` rounded down to whole ALIGN blocks (at least one)."""
    n = max(ALIGN, size // ALIGN * ALIGN)
    raw = np.empty(n + ALIGN, dtype=np.uint8)
    skip = -raw.ctypes.data % ALIGN
    return raw[skip : skip + n]


def _set_direct(fd: int, on: bool) -> bool:
    """Turn O_DIRECT on or off for `fd`; False where it cannot be (no such flag, or refused)."""
    if not _O_DIRECT or fcntl is None:
        return False
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, (flags | _O_DIRECT) if on else (flags & ~_O_DIRECT))
    except OSError:
        return False
    return True


class Stages:
    """A stream's page-aligned stage buffers (`size` bytes, at most `depth`, made when first
    needed) and the `writers` threads that write the full ones, in submission order (with one
    writer, one at a time). `depth` 1: every write runs in the caller's thread. The first error
    of a write is raised by the next `take`, `submit` or `drain`; the writes that start after it
    are skipped (their buffers come back)."""

    def __init__(self, size: int, depth: int = 2, writers: int = 1) -> None:
        self.size = size
        self._depth = max(1, depth)
        self._writers = max(1, min(writers, self._depth - 1)) if self._depth > 1 else 0
        self._made = 0
        self._free: list[np.ndarray] = []
        self._jobs: deque[tuple[np.ndarray, Callable[..., None], tuple[Any, ...]]] = deque()
        self._busy = 0  # jobs taken by a writer and not yet ended
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._threads: list[threading.Thread] = []
        self._closed = False

    def take(self) -> np.ndarray:
        """A free stage: a new one while fewer than `depth` exist, else the next one written."""
        with self._cond:
            while True:
                self._raise()
                if self._free:
                    return self._free.pop()
                if self._made < self._depth:
                    self._made += 1
                    break
                self._cond.wait()
        return stage_buffer(self.size)

    def give(self, buf: np.ndarray) -> None:
        """Return a stage that was taken and not submitted."""
        with self._cond:
            self._free.append(buf)
            self._cond.notify_all()

    def submit(self, buf: np.ndarray, fn: Callable[..., None], *args: Any) -> None:
        """Run `fn(*args)` (a write of bytes held in `buf`), then free `buf`."""
        if not self._writers:
            try:
                self._raise()
                fn(*args)
            finally:
                self._free.append(buf)
            return
        with self._cond:
            self._raise()
            self._jobs.append((buf, fn, args))
            if len(self._threads) < min(self._writers, len(self._jobs) + self._busy):
                t = threading.Thread(target=self._run, name="exl3slice-write", daemon=True)
                self._threads.append(t)
                t.start()
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._closed:
                    self._cond.wait()
                if not self._jobs:
                    return
                buf, fn, args = self._jobs.popleft()
                self._busy += 1
                failed = self._error is not None
            try:
                if not failed:
                    fn(*args)
            except BaseException as exc:
                with self._cond:
                    if self._error is None:
                        self._error = exc
            with self._cond:
                self._busy -= 1
                self._free.append(buf)
                self._cond.notify_all()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def drain(self, *, check: bool = True) -> None:
        """Wait until every submitted write has ended; its first error raised with `check`."""
        with self._cond:
            while self._jobs or self._busy:
                self._cond.wait()
            if check:
                self._raise()

    def close(self) -> None:
        """Stop the writing threads once the writes submitted have ended (errors not raised)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for t in self._threads:
            t.join()
        self._threads = []


class StagedFile:
    """A new file at `path` (created exclusively) fed with `put` / `put_rows` through `stages`;
    `close` writes the rest. `hashers` see every byte in order (in the caller's thread);
    `kick(fd, offset, nbytes)` starts writeback of page-cache writes (every `writeback` bytes
    of them)."""

    def __init__(
        self,
        path: os.PathLike[str] | str,
        stages: Stages,
        hashers: list,
        kick: Callable[[int, int, int], None],
        writeback: int,
        direct: bool = True,
    ) -> None:
        self._stages = stages
        self._stage: np.ndarray | None = stages.take()
        try:
            self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except BaseException:
            stages.give(self._stage)
            raise
        self._direct = direct and _set_direct(self._fd, True)
        self._hashers = hashers
        self._kick = kick
        self._every = writeback
        self._pos = 0  # bytes in the stage
        self._queued = 0  # bytes handed to the writers: the next stage's offset
        self.size = 0  # bytes written (by the writing threads until `close` returns)
        self._lock = threading.Lock()  # the writers' shared state below
        self._buffered = 0  # bytes written through the page cache
        self._kicked = 0  # of those, when writeback was last started

    def put(self, data: memoryview | bytes) -> None:
        n = len(data)
        if n <= SMALL_COPY and self._pos + n < len(self._stage):  # type: ignore[arg-type]
            view = memoryview(data)
            if view.format == "B" and view.ndim == 1:
                # a small piece (a scale vector, a marker, a header) is copied holding the GIL:
                # numpy releases it for copies past 500 bytes, and taking it back can wait a
                # whole switch interval behind the other threads of the pass
                memoryview(self._stage)[self._pos : self._pos + n] = view  # type: ignore[arg-type]
                self._pos += n
                return
        src = np.frombuffer(data, dtype=np.uint8)
        i, n = 0, len(src)
        while i < n:
            stage = self._stage
            assert stage is not None
            k = min(n - i, len(stage) - self._pos)
            stage[self._pos : self._pos + k] = src[i : i + k]
            self._pos += k
            i += k
            if self._pos == len(stage):
                self._flush()

    def put_rows(self, buf: np.ndarray, offset: int, run: int, count: int, stride: int) -> None:
        """Gather `count` runs of `run` bytes, `stride` apart from `offset` of `buf`."""
        r = 0
        while r < count:
            stage = self._stage
            assert stage is not None
            k = min(count - r, (len(stage) - self._pos) // run)
            at = offset + r * stride
            if k == 0:  # not one whole row fits: this row goes in by pieces
                self.put(memoryview(buf)[at : at + run])
                r += 1
                continue
            rows = np.lib.stride_tricks.as_strided(buf[at:], shape=(k, run), strides=(stride, 1))
            np.copyto(stage[self._pos : self._pos + k * run].reshape(k, run), rows)
            self._pos += k * run
            r += k
            if self._pos == len(stage):
                self._flush()

    def _hashed(self) -> tuple[np.ndarray, memoryview, int]:
        """The current stage, its bytes (hashed) and their offset in the file; the stage is no
        longer this file's to fill."""
        stage = self._stage
        assert stage is not None
        data = memoryview(stage)[: self._pos]
        for h in self._hashers:
            h.update(data)
        offset = self._queued
        self._queued += self._pos
        self._stage, self._pos = None, 0
        return stage, data, offset

    def _flush(self) -> None:
        """Hash the full stage (whole ALIGN blocks), hand it to the writers, take the next."""
        stage, data, offset = self._hashed()
        self._stages.submit(stage, self._write, data, offset)
        self._stage = self._stages.take()

    def _write(self, data: memoryview, offset: int) -> None:
        """Write `data` at `offset` (in a writer thread; other stages of this file may be
        written at the same time)."""
        fd = self._fd
        assert fd is not None
        while len(data):
            direct = self._direct
            try:
                n = os.pwrite(fd, data if direct else data[:BUFFERED_WRITE], offset)
            except OSError as exc:  # O_DIRECT refused after all: through the page cache
                if not (direct and exc.errno == errno.EINVAL):
                    raise
                self._direct_off()
                continue
            data = data[n:]
            offset += n
            if len(data) and direct:  # a short direct write: the rest unaligned
                self._direct_off()
            self._written(n, buffered=not direct)

    def _direct_off(self) -> None:
        """Write through the page cache from now on (every writer of this file)."""
        with self._lock:
            if self._direct and _set_direct(self._fd, False):  # type: ignore[arg-type]
                self._direct = False
            if self._direct:
                raise OSError(errno.EINVAL, "O_DIRECT cannot be turned off")

    def _written(self, n: int, buffered: bool) -> None:
        """Count `n` bytes written; start writeback of every `writeback` bytes written through
        the page cache."""
        with self._lock:
            self.size += n
            if buffered:
                self._buffered += n
                if self._buffered - self._kicked >= self._every:
                    self._kick_rest()

    def _kick_rest(self) -> None:
        # writes land at their own offsets, so this starts writeback of the whole file so far
        # (sync_file_range with nbytes 0: up to its end); pages already clean cost nothing
        self._kick(self._fd, 0, 0)  # type: ignore[arg-type]
        self._kicked = self._buffered

    def close(self) -> None:
        """Write what is staged once every earlier write has ended (the partial last block
        goes through the page cache, which turns O_DIRECT off for the file), and close it."""
        if self._fd is None:
            return
        stage, data, offset = self._hashed()
        try:
            self._stages.drain()
            head = len(data) // ALIGN * ALIGN
            if head:
                self._write(data[:head], offset)
            if len(data) > head:
                if self._direct:
                    self._direct_off()
                self._write(data[head:], offset + head)
            if self._buffered > self._kicked:
                self._kick_rest()
        finally:
            self._stages.give(stage)
        fd, self._fd = self._fd, None  # cleared first: never closed twice
        os.close(fd)

    def abort(self) -> None:
        if self._fd is None:
            return
        self._stages.drain(check=False)
        if self._stage is not None:
            self._stages.give(self._stage)
            self._stage = None
        fd, self._fd = self._fd, None  # cleared first: never closed twice
        with contextlib.suppress(OSError):
            os.close(fd)
