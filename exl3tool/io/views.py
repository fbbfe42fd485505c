"""Zero-copy access to tensor payloads through mmap (never `safe_open().get_tensor()`)."""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from exl3tool.io.dtypes import numpy_dtype
from exl3tool.io.safetensors import SafetensorsFile, TensorInfo

if TYPE_CHECKING:  # numpy is imported by `array()` only: hashing never needs it
    import numpy as np


class MappedFile:
    """A read-only mmap of a whole file; payload slices are memoryviews into it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # O_NONBLOCK: a FIFO posing as a shard must not hang us; only regular files are mapped.
        with open(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise OSError(errno.EINVAL, "not a regular file", str(path))
            self.size = st.st_size
            self._mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if self.size else None

    def buffer(self, start: int, end: int) -> memoryview:
        if self._mm is None or end > self.size:
            if start == end:
                return memoryview(b"")
            raise ValueError(f"{self.path}: range [{start}, {end}) beyond {self.size} bytes")
        return memoryview(self._mm)[start:end]

    def release(self, start: int, end: int) -> None:
        """Unmap [start, end) from this process (pages stay in the page cache): keeps the
        resident set small while streaming through files larger than memory."""
        if self._mm is None or not hasattr(self._mm, "madvise") or end <= start:
            return
        page = mmap.PAGESIZE
        lo = start - start % page
        hi = min(end + (-end % page), self.size + (-self.size % page))
        with contextlib.suppress(OSError, ValueError):
            self._mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def advise_random(self) -> None:
        """Scattered small reads: stop the kernel's readahead around every fault."""
        if self._mm is not None and hasattr(mmap, "MADV_RANDOM"):
            with contextlib.suppress(OSError, ValueError):
                self._mm.madvise(mmap.MADV_RANDOM)

    def advise_sequential(self) -> None:
        if self._mm is not None and hasattr(self._mm, "madvise"):
            self._mm.madvise(mmap.MADV_SEQUENTIAL)

    def close(self) -> None:
        if self._mm is not None:
            with contextlib.suppress(BufferError):  # a live view; the GC closes it later
                self._mm.close()
            self._mm = None

    def __enter__(self) -> MappedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TensorReader:
    """Maps each shard once and serves payload bytes and numpy views by tensor."""

    def __init__(self) -> None:
        self._maps: dict[Path, MappedFile] = {}

    def _map(self, st: SafetensorsFile) -> MappedFile:
        m = self._maps.get(st.path)
        if m is None:
            m = self._maps[st.path] = MappedFile(st.path)
        return m

    def payload(self, st: SafetensorsFile, info: TensorInfo) -> memoryview:
        return self._map(st).buffer(st.data_start + info.begin, st.data_start + info.end)

    def array(self, st: SafetensorsFile, info: TensorInfo) -> np.ndarray:
        """A read-only numpy view of the tensor (BF16/FP8 as raw unsigned ints)."""
        import numpy as np

        dt = numpy_dtype(info.dtype)
        buf = self.payload(st, info)
        return np.frombuffer(buf, dtype=dt, count=info.numel).reshape(info.shape)

    def close(self) -> None:
        for m in self._maps.values():
            m.close()
        self._maps.clear()

    def __enter__(self) -> TensorReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
