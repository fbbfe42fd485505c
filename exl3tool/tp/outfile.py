"""One output file of the slicer, written through an aligned staging buffer.

Every byte is copied (or gathered, for column slices) once into the stage; each full stage is
hashed and written in one call, so the digests are of the bytes written. Where the file system
takes it the file is written with O_DIRECT: the data goes from the stage to the disk, not
through the page cache (no kernel copy, no fresh page-cache pages: on a VM each one can cost
tens of microseconds to fault in; and the publishing fsync finds little left to do). The last
partial block, or everything where O_DIRECT is refused, is written through the page cache,
whose writeback is started every `writeback` bytes. Durability stays with the caller: the
publisher fsyncs every file (io/atomic.py).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable

import numpy as np

try:
    import fcntl
except ImportError:  # not POSIX: never O_DIRECT
    fcntl = None  # type: ignore[assignment]

ALIGN = 4096  # O_DIRECT offset, length and address granularity (and a page)
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


class StagedFile:
    """A new file at `path` (created exclusively) fed with `put` / `put_rows`; `close` writes the
    rest. `hashers` see every byte in order; `kick(fd, offset, nbytes)` starts writeback of
    page-cache writes (every `writeback` bytes of them)."""

    def __init__(
        self,
        path: os.PathLike[str] | str,
        stage: np.ndarray,
        hashers: list,
        kick: Callable[[int, int, int], None],
        writeback: int,
        direct: bool = True,
    ) -> None:
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self._direct = direct and _set_direct(self._fd, True)
        self._stage = stage
        self._hashers = hashers
        self._kick = kick
        self._every = writeback
        self._pos = 0  # bytes in the stage
        self.size = 0  # bytes written
        self._kicked = 0

    def put(self, data: memoryview | bytes) -> None:
        src = np.frombuffer(data, dtype=np.uint8)
        stage, i, n = self._stage, 0, len(src)
        while i < n:
            k = min(n - i, len(stage) - self._pos)
            stage[self._pos : self._pos + k] = src[i : i + k]
            self._pos += k
            i += k
            if self._pos == len(stage):
                self._flush()

    def put_rows(self, buf: np.ndarray, offset: int, run: int, count: int, stride: int) -> None:
        """Gather `count` runs of `run` bytes, `stride` apart from `offset` of `buf`."""
        stage, r = self._stage, 0
        while r < count:
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

    def _flush(self) -> None:
        """Write the full stage (whole ALIGN blocks)."""
        self._write(memoryview(self._stage)[: self._pos])
        self._pos = 0

    def _write(self, data: memoryview) -> None:
        for h in self._hashers:
            h.update(data)
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

    def close(self) -> None:
        """Write what is staged (the last partial block through the page cache) and close."""
        if self._fd is None:
            return
        head = self._pos // ALIGN * ALIGN
        view = memoryview(self._stage)
        if head:
            self._write(view[:head])
        if self._pos > head:
            if self._direct:
                self._direct = not _set_direct(self._fd, False)
            self._write(view[head : self._pos])
        self._pos = 0
        if self.size > self._kicked:
            self._kick(self._fd, self._kicked, self.size - self._kicked)
        os.close(self._fd)
        self._fd = None

    def abort(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
