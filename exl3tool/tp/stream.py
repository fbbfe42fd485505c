"""Streaming copy of planned slices into safetensors parts: one pass over the source, bounded memory.

Each output stream (one per rank for the per-rank layout, one for the rank-sliced layout) is a
list of parts whose headers are known from the plan. The source is walked in batches of
`BATCH` payload bytes; inside a batch every stream copies its slices in order (streams run in a
thread pool: numpy copies, hashing and `write` release the GIL). Contiguous runs are written
straight from the source mmap; strided runs (column slices of a trellis) are gathered row by
row into a reusable buffer. Each part is hashed (sha256 + blake3, `identity.engine.new_hasher`)
as it is written, and the source pages of a finished batch are dropped from this process.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from exl3tool.formats.checkpoint import Checkpoint
from exl3tool.identity.engine import new_hasher
from exl3tool.io.safetensors import FileStamp
from exl3tool.io.st_writer import TensorSpec, build_header
from exl3tool.tp.slices import TensorSlice

CHUNK = 8 << 20  # bytes per write / per gather buffer
BATCH = 64 << 20  # source payload bytes per lock-step batch
_PAGE = mmap.PAGESIZE


@dataclass
class Part:
    """One output safetensors file: its relative path and its tensors in payload order."""

    path: str
    slices: list[TensorSlice]
    size: int = 0
    sha256: str = ""
    blake3: str = ""

    def header(self) -> bytes:
        return build_header([TensorSpec(s.target_name, s.dtype, s.shape) for s in self.slices])


def split_parts(
    slices: Sequence[TensorSlice], max_size: int, name: Callable[[int], str]
) -> list[Part]:
    """Greedy shards in order: a part is closed before a tensor would push it over `max_size`
    (a tensor larger than the limit gets a part of its own)."""
    parts: list[Part] = []
    cur: list[TensorSlice] = []
    size = 0
    for s in slices:
        if cur and size + s.nbytes > max_size:
            parts.append(Part(name(len(parts)), cur))
            cur, size = [], 0
        cur.append(s)
        size += s.nbytes
    if cur or not parts:
        parts.append(Part(name(len(parts)), cur))
    return parts


class FileMaps:
    """Read-only whole-file maps by path; `drop` unmaps ranges from this process."""

    def __init__(self) -> None:
        self._maps: dict[Path, mmap.mmap | None] = {}

    def get(self, path: Path) -> mmap.mmap | None:
        if path not in self._maps:
            with open(path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                self._maps[path] = (
                    mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else None
                )
        return self._maps[path]

    def drop(self, path: Path, start: int, end: int) -> None:
        _drop(self._maps.get(path), start, end)

    def close(self) -> None:
        for mm in self._maps.values():
            _close(mm)
        self._maps.clear()


def _drop(mm: mmap.mmap | None, start: int, end: int) -> None:
    """Unmap [start, end) from this process (the page cache keeps it): bounded RSS."""
    if mm is None or end <= start:
        return
    lo = start - start % _PAGE
    hi = min(end + (-end % _PAGE), len(mm) + (-len(mm) % _PAGE))
    with contextlib.suppress(OSError, ValueError, AttributeError):
        mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


def _close(mm: mmap.mmap | None) -> None:
    if mm is not None:
        with contextlib.suppress(BufferError):  # a live view; the GC closes it later
            mm.close()


class SourceMaps:
    """Read-only maps of the source shards, with their stamps for change detection."""

    def __init__(self, ckpt: Checkpoint) -> None:
        self.ckpt = ckpt
        self._maps: dict[str, mmap.mmap | None] = {}
        self.stamps: dict[str, FileStamp] = {}

    def get(self, label: str) -> mmap.mmap | None:
        if label not in self._maps:
            st = self.ckpt.shards[label]
            with open(st.path, "rb") as fh:
                stamp = FileStamp.of(os.fstat(fh.fileno()))
                self.stamps[label] = stamp
                self._maps[label] = (
                    mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if stamp.size else None
                )
        return self._maps[label]

    def drop(self, label: str, start: int, end: int) -> None:
        _drop(self._maps.get(label), start, end)

    def changed(self) -> list[str]:
        """Labels of shards whose (dev, ino, size, mtime, ctime) differ from when mapped."""
        out = []
        for label, stamp in self.stamps.items():
            try:
                now = FileStamp.of(os.stat(self.ckpt.shards[label].path))
            except OSError:
                out.append(label)
                continue
            if now != stamp:
                out.append(label)
        return out

    def close(self) -> None:
        for mm in self._maps.values():
            _close(mm)
        self._maps.clear()


def _write_all(fd: int, data) -> None:
    mv = memoryview(data)
    while len(mv):
        n = os.write(fd, mv)
        mv = mv[n:]


@dataclass
class _Stream:
    """The writer of one stream of parts; only one thread touches it at a time."""

    root: Path
    parts: list[Part]
    hash_files: bool = True
    _part: int = -1
    _left: int = 0
    _fd: int | None = None
    _hashers: list = field(default_factory=list)
    _buf: np.ndarray | None = None
    _pos: list[int] = field(default_factory=list)  # next slice index per part

    def _open_next(self) -> None:
        self._close_current()
        self._part += 1
        part = self.parts[self._part]
        path = self.root / part.path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self._hashers = [new_hasher("sha256"), new_hasher("blake3")] if self.hash_files else []
        self._emit(part.header())
        self._left = len(part.slices)
        part.size = len(part.header()) + sum(s.nbytes for s in part.slices)

    def _close_current(self) -> None:
        if self._fd is None:
            return
        os.close(self._fd)
        self._fd = None
        if self._hashers:
            part = self.parts[self._part]
            part.sha256, part.blake3 = (h.hexdigest() for h in self._hashers)

    def _emit(self, data) -> None:
        for h in self._hashers:
            h.update(data)
        _write_all(self._fd, data)

    def start(self) -> None:
        """Open the first part (also writes header-only parts of an empty stream)."""
        self._open_next()
        while self._left == 0 and self._part + 1 < len(self.parts):
            self._open_next()

    def copy(self, s: TensorSlice, mm: mmap.mmap | None, payload_start: int) -> None:
        while self._left == 0:
            self._open_next()
        lay = s.layout
        if lay.nbytes:
            base = payload_start + lay.offset
            if lay.contiguous:
                view = memoryview(mm)
                try:
                    for pos in range(base, base + lay.nbytes, CHUNK):
                        self._emit(view[pos : min(pos + CHUNK, base + lay.nbytes)])
                finally:
                    view.release()
            else:
                self._copy_strided(mm, base, lay.run, lay.count, lay.stride)
        self._left -= 1

    def _copy_strided(self, mm: mmap.mmap, base: int, run: int, count: int, stride: int) -> None:
        span = (count - 1) * stride + run
        src = np.frombuffer(mm, dtype=np.uint8, count=span, offset=base)
        rows = np.lib.stride_tricks.as_strided(src, shape=(count, run), strides=(stride, 1))
        per = max(1, CHUNK // run)
        need = per * run
        if self._buf is None or self._buf.size < need:
            self._buf = np.empty(max(need, CHUNK), dtype=np.uint8)
        for i in range(0, count, per):
            k = min(per, count - i)
            out = self._buf[: k * run].reshape(k, run)
            np.copyto(out, rows[i : i + k])
            self._emit(self._buf[: k * run].data)
        del rows, src

    def finish(self) -> None:
        while self._part + 1 < len(self.parts):  # trailing empty parts
            self._open_next()
        self._close_current()

    def abort(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def write_streams(
    ckpt: Checkpoint,
    order: Sequence[str],
    streams: Sequence[list[Part]],
    root: Path,
    *,
    threads: int | None = None,
    progress=None,
) -> SourceMaps:
    """Copy every part of every stream into `root`; fills each Part's size and digests.

    Returns the source maps (closed) whose `changed()` tells whether the source moved under us.
    """
    index = {n: i for i, n in enumerate(order)}
    # per stream: flat (source index, slice) in write order
    flat: list[list[tuple[int, TensorSlice]]] = []
    for parts in streams:
        items = [(index[s.source], s) for p in parts for s in p.slices]
        if any(items[i][0] > items[i + 1][0] for i in range(len(items) - 1)):
            raise ValueError("stream slices are not in source order")
        flat.append(items)
    batches: list[tuple[int, int]] = []  # [first, last) source indices
    lo, acc = 0, 0
    for i, name in enumerate(order):
        acc += ckpt.tensors[name].info.nbytes
        if acc >= BATCH:
            batches.append((lo, i + 1))
            lo, acc = i + 1, 0
    if lo < len(order) or not batches:
        batches.append((lo, len(order)))
    maps = SourceMaps(ckpt)
    writers = [_Stream(root, parts) for parts in streams]
    cursors = [0] * len(writers)
    workers = max(1, min(len(writers), threads or os.cpu_count() or 1))

    def run(w: int, last: int) -> None:
        items, writer = flat[w], writers[w]
        i = cursors[w]
        while i < len(items) and items[i][0] < last:
            src_idx, s = items[i]
            ref = ckpt.tensors[order[src_idx]]
            writer.copy(s, maps.get(ref.file), ref.shard.data_start + ref.info.begin)
            i += 1
        cursors[w] = i

    try:
        for parts_label in {ckpt.tensors[n].file for n in order}:
            maps.get(parts_label)
        for w in writers:
            w.start()
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="exl3slice") as pool:
            for first, last in batches:
                if workers == 1:
                    for w in range(len(writers)):
                        run(w, last)
                else:
                    for fut in [pool.submit(run, w, last) for w in range(len(writers))]:
                        fut.result()
                spans: dict[str, tuple[int, int]] = {}
                for name in order[first:last]:
                    ref = ckpt.tensors[name]
                    a, b = ref.shard.span(name)
                    lo_, hi_ = spans.get(ref.file, (a, b))
                    spans[ref.file] = (min(lo_, a), max(hi_, b))
                for label, (a, b) in spans.items():
                    maps.drop(label, a, b)
                if progress is not None:
                    progress.advance(sum(ckpt.tensors[n].info.nbytes for n in order[first:last]))
        for w in writers:
            w.finish()
    except BaseException:
        for w in writers:
            w.abort()
        maps.close()
        raise
    maps.close()
    return maps
