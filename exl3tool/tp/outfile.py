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
by a thread of their own (`Stages`): the stream gathers and hashes the next stage while the
last one is on its way to the disk (writes in submission order, one at a time per stream).
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
    needed) and the one thread that writes the full ones, in submission order. `depth` 1:
    every write runs in the caller's thread. The first error of a write is raised by the next
    `take`, `submit` or `drain`; the writes after it are skipped (their buffers come back)."""

    def __init__(self, size: int, depth: int = 2) -> None:
        self.size = size
        self._depth = max(1, depth)
        self._made = 0
        self._free: list[np.ndarray] = []
        self._jobs: deque[tuple[np.ndarray, Callable[..., None], tuple[Any, ...]]] = deque()
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
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
        if self._depth == 1:
            try:
                self._raise()
                fn(*args)
            finally:
                self._free.append(buf)
            return
        with self._cond:
            self._raise()
            self._jobs.append((buf, fn, args))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="exl3slice-write", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._closed:
                    self._cond.wait()
                if not self._jobs:
                    return
                buf, fn, args = self._jobs[0]
                failed = self._error is not None
            try:
                if not failed:
                    fn(*args)
            except BaseException as exc:
                with self._cond:
                    self._error = exc
            with self._cond:
                self._jobs.popleft()
                self._free.append(buf)
                self._cond.notify_all()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def drain(self, *, check: bool = True) -> None:
        """Wait until every submitted write has ended; its first error raised with `check`."""
        with self._cond:
            while self._jobs:
                self._cond.wait()
            if check:
                self._raise()

    def close(self) -> None:
        """Stop the writing thread once the writes submitted have ended (errors not raised)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


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
        self.size = 0  # bytes written (by the writing thread until `close` returns)
        self._kicked = 0

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

    def _hashed(self) -> tuple[np.ndarray, memoryview]:
        """The current stage and its bytes, hashed; the stage is no longer this file's to fill."""
        stage = self._stage
        assert stage is not None
        data = memoryview(stage)[: self._pos]
        for h in self._hashers:
            h.update(data)
        self._stage, self._pos = None, 0
        return stage, data

    def _flush(self) -> None:
        """Hash the full stage (whole ALIGN blocks), hand it to the writer, take the next."""
        stage, data = self._hashed()
        self._stages.submit(stage, self._write, data)
        self._stage = self._stages.take()

    def _write(self, data: memoryview) -> None:
        fd = self._fd
        assert fd is not None
        while len(data):
            try:
                n = os.write(fd, data if self._direct else data[:BUFFERED_WRITE])
            except OSError as exc:  # O_DIRECT refused after all: through the page cache
                if not (self._direct and exc.errno == errno.EINVAL):
                    raise
                self._direct = not _set_direct(fd, False)
                if self._direct:
                    raise
                continue
            data = data[n:]
            self.size += n
            if len(data) and self._direct:  # a short direct write: the rest unaligned
                self._direct = not _set_direct(fd, False)
        if not self._direct and self.size - self._kicked >= self._every:
            self._kick(fd, self._kicked, self.size - self._kicked)
            self._kicked = self.size

    def _write_last(self, data: memoryview) -> None:
        """The whole ALIGN blocks as usual, the partial one through the page cache."""
        head = len(data) // ALIGN * ALIGN
        if head:
            self._write(data[:head])
        if len(data) > head:
            if self._direct:
                self._direct = not _set_direct(self._fd, False)  # type: ignore[arg-type]
            self._write(data[head:])
        if self.size > self._kicked:
            self._kick(self._fd, self._kicked, self.size - self._kicked)  # type: ignore[arg-type]
            self._kicked = self.size

    def close(self) -> None:
        """Write what is staged, wait for every write of this file, and close it."""
        if self._fd is None:
            return
        stage, data = self._hashed()
        self._stages.submit(stage, self._write_last, data)
        self._stages.drain()
        os.close(self._fd)
        self._fd = None

    def abort(self) -> None:
        if self._fd is None:
            return
        self._stages.drain(check=False)
        if self._stage is not None:
            self._stages.give(self._stage)
            self._stage = None
        with contextlib.suppress(OSError):
            os.close(self._fd)
        self._fd = None
