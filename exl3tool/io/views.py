"""Tensor payloads read with pread into buffers (never mmap, never `safe_open().get_tensor()`).

Why not mmap: a page of a mapping whose file was truncated under it raises SIGBUS on access,
which kills the process with no report (issue 15). `pread` of a shrunk file returns fewer bytes
instead; that becomes `InputChanged` (exit 3, the file named). Every open file keeps the
(dev, ino, size, mtime_ns) seen at open; `verify_unchanged` compares them with the file now and
with what its path names now (a shard replaced by a rename after it was opened).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from exl3tool.io import native
from exl3tool.io.dtypes import numpy_dtype
from exl3tool.io.safetensors import FileStamp, SafetensorsFile, TensorInfo
from exl3tool.rules.errors import InputError

# native/spans.c: `gather`'s packing in C (the same bytes and positions; absent without a C
# compiler, unused with EXL3TOOL_PURE_SCAN=1).
_Gather = Callable[
    [int, int, list[tuple[int, int]], int],
    tuple[bytearray, list[int], list[tuple[int, int, int]]] | None,
]
_native_gather: _Gather | None = None
if native.ENABLED:
    with contextlib.suppress(ImportError):
        from exl3tool.io._spans import gather as _native_gather

if TYPE_CHECKING:  # numpy is imported by `array()` only: hashing never needs it
    import numpy as np


class InputChanged(InputError):
    """An input changed, shrank or was replaced while it was read (exit 3, the file named)."""


def same_content(a: FileStamp, b: FileStamp) -> bool:
    """The stability proof of issue 15: same (dev, ino, size, mtime_ns). ctime is left out: a
    chmod or a new hard link changes it without touching the bytes."""
    return (a.dev, a.ino, a.size, a.mtime_ns) == (b.dev, b.ino, b.size, b.mtime_ns)


# A file changed within this long before it was read may change again within the same tick of
# the file system's clock and keep its whole stamp, ctime included.
RACY_NS = 1_000_000_000


def changed_lately(stamp: FileStamp, read_at_ns: int) -> bool:
    """Whether the file of `stamp` changed within RACY_NS before `read_at_ns` (wall-clock ns,
    taken before it was read): bytes read from it ahead of its header (by a worker) are then
    not used, as its stamp cannot prove that they are the header's."""
    return stamp.ctime_ns >= read_at_ns - RACY_NS


def stamp_of_path(path: Path) -> FileStamp | None:
    """The stamp of the file `path` names now, or None if gone. A final symlink is followed, as
    `open` did (Hugging Face cache snapshots link into blobs/): a link re-pointed at another
    file still shows as "replaced" (another dev/ino)."""
    try:
        return FileStamp.of(os.stat(path))
    except OSError:
        return None


def verify_stamp(path: Path, expected: FileStamp, what: str = "was read") -> None:
    """InputChanged unless `path` still names a file with the `expected` stamp."""
    now = stamp_of_path(path)
    if now is None:
        raise InputChanged(f"{path}: removed after it {what}")
    if not same_content(now, expected):
        raise InputChanged(f"{path}: changed after it {what} ({_diff(expected, now)})")


def _diff(a: FileStamp, b: FileStamp) -> str:
    parts = []
    if (a.dev, a.ino) != (b.dev, b.ino):
        parts.append("replaced by another file")
    if a.size != b.size:
        parts.append(f"size {a.size} -> {b.size}")
    if a.mtime_ns != b.mtime_ns:
        parts.append("modified")
    return ", ".join(parts) or "changed"


class PayloadFile:
    """An open input file: byte ranges are read with pread, so a shrinking file is an error,
    never a signal. `buffer` returns a private copy; `read_into` fills a reusable buffer."""

    def __init__(self, path: Path, expected: FileStamp | None = None) -> None:
        self.path = Path(path)
        # O_NONBLOCK: a FIFO posing as a shard must not hang us; only regular files are read.
        self._fd: int | None = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        try:
            st = os.fstat(self._fd)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(errno.EINVAL, "not a regular file", str(path))
            self.stamp = FileStamp.of(st)
            if expected is not None and not same_content(expected, self.stamp):
                what = _diff(expected, self.stamp)
                raise InputChanged(f"{path}: changed after its header was read ({what})")
        except BaseException:
            fd, self._fd = self._fd, None  # cleared first: never closed twice
            os.close(fd)
            raise
        self.size = self.stamp.size

    def _fileno(self) -> int:
        if self._fd is None:
            raise ValueError(f"{self.path}: file is closed")
        return self._fd

    def read_into(self, buf: memoryview, start: int) -> memoryview:
        """Fill all of `buf` from offset `start`; InputChanged if the file ends before."""
        fd = self._fileno()
        want = len(buf)
        try:  # the usual case: one call fills it (an error is raised by the loop's retry)
            got = os.preadv(fd, [buf], start)
        except OSError:
            got = 0
        while got < want:
            try:
                n = os.preadv(fd, [buf[got:]], start + got)
            except OSError as exc:
                raise InputChanged(f"{self.path}: read failed: {exc.strerror or exc}") from exc
            if n <= 0:
                end = start + want
                raise InputChanged(
                    f"{self.path}: shrank while it was read (range [{start}, {end}) ends past "
                    f"byte {start + got}; {self.size} bytes at open)"
                )
            got += n
        return buf

    def buffer(self, start: int, end: int) -> memoryview:
        """A private copy of bytes [start, end)."""
        if not 0 <= start <= end:
            raise InputChanged(f"{self.path}: invalid range [{start}, {end})")
        if end > self.size:
            raise InputChanged(f"{self.path}: range [{start}, {end}) beyond {self.size} bytes")
        if start == end:
            return memoryview(b"")
        return self.read_into(memoryview(bytearray(end - start)), start)

    def verify_unchanged(self) -> None:
        """InputChanged if the open file or what its path names differs from the stamp at open."""
        now = FileStamp.of(os.fstat(self._fileno()))
        if not same_content(now, self.stamp):
            raise InputChanged(f"{self.path}: changed while it was read ({_diff(self.stamp, now)})")
        verify_stamp(self.path, self.stamp, "was opened")

    def advise_random(self) -> None:
        self._advise("POSIX_FADV_RANDOM")

    def advise_sequential(self) -> None:
        self._advise("POSIX_FADV_SEQUENTIAL")

    def _advise(self, name: str) -> None:
        advice = getattr(os, name, None)
        if self._fd is not None and advice is not None:
            with contextlib.suppress(OSError):
                os.posix_fadvise(self._fd, 0, 0, advice)

    def close(self) -> None:
        fd, self._fd = self._fd, None  # cleared first: an interrupt after os.close returns
        if fd is not None:  # must not leave the number to be closed again (maybe reused)
            os.close(fd)

    def __enter__(self) -> PayloadFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


GATHER_GAP = 64 << 10  # bytes of gap still worth reading through (one pread instead of two)


class TensorReader:
    """Opens each shard once and serves payload bytes and numpy arrays by tensor."""

    def __init__(self) -> None:
        self._maps: dict[Path, PayloadFile] = {}  # the name of the mmap era (subclasses use it)

    def _map(self, st: SafetensorsFile) -> PayloadFile:
        f = self._maps.get(st.path)
        if f is None:
            try:
                f = PayloadFile(st.path, st.stamp)
            except OSError as exc:
                raise InputChanged(f"{st.path}: cannot reopen: {exc.strerror or exc}") from exc
            self._maps[st.path] = f
        return f

    def file(self, st: SafetensorsFile) -> PayloadFile:
        """The open file of shard `st` (opened on first use, checked against its header stamp)."""
        return self._map(st)

    def payload(self, st: SafetensorsFile, info: TensorInfo) -> memoryview:
        return self._map(st).buffer(st.data_start + info.begin, st.data_start + info.end)

    def array(self, st: SafetensorsFile, info: TensorInfo) -> np.ndarray:
        """A read-only numpy copy of the tensor (BF16/FP8 as raw unsigned ints)."""
        import numpy as np

        dt = numpy_dtype(info.dtype)
        buf = self.payload(st, info)
        arr = np.frombuffer(buf, dtype=dt, count=info.numel).reshape(info.shape)
        arr.flags.writeable = False
        return arr

    def gather(
        self, st: SafetensorsFile, spans: list[tuple[int, int]]
    ) -> tuple[bytearray, list[int]]:
        """Many small payload spans of one shard ([begin, end) relative to its data section) in
        one packed buffer: returns (data, pos), span i at data[pos[i] : pos[i] + its length].
        Each pos keeps its begin's alignment mod 16 (word views stay possible); spans closer than
        GATHER_GAP are read with one pread."""
        f = self._map(st)
        base = st.data_start
        got = _native_gather(f._fileno(), base, spans, GATHER_GAP) if _native_gather else None
        if got is not None:
            data, pos, short = got
            for offset, n, at in short:  # the file gave less: read again, InputChanged if so
                f.read_into(memoryview(data)[at : at + n], offset)
            return data, pos
        order = sorted(range(len(spans)), key=spans.__getitem__)
        runs: list[list[int]] = []  # [begin, end] of each pread, relative to the data section
        run_of = [0] * len(spans)
        last: list[int] = [0, -GATHER_GAP - 1]
        for i in order:
            b, e = spans[i]
            if b - last[1] <= GATHER_GAP:
                if e > last[1]:
                    last[1] = e
            else:
                last = [b, e]
                runs.append(last)
            run_of[i] = len(runs) - 1
        data = bytearray(sum(e - b + 16 for b, e in runs))
        view = memoryview(data)
        shift: list[int] = []  # packed position minus relative begin, per run
        at = 0
        fd, preadv = f._fileno(), os.preadv
        for b, e in runs:
            at += (b - at) % 16  # the same alignment mod 16 as in the data section
            if e > b:
                buf = view[at : at + e - b]
                try:  # one call per run (58,000 on GLM-5.2), read_into only when it fell short
                    got = preadv(fd, [buf], base + b)
                except OSError:
                    got = -1
                if got != e - b:
                    f.read_into(buf, base + b)
            shift.append(at - b)
            at += e - b
        return data, [s[0] + shift[r] for s, r in zip(spans, run_of, strict=True)]

    def verify_unchanged(self) -> None:
        for f in self._maps.values():
            f.verify_unchanged()

    def close(self) -> None:
        for f in self._maps.values():
            f.close()
        self._maps.clear()

    def __enter__(self) -> TensorReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
