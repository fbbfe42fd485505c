"""Streaming copy of planned slices into safetensors parts: one pass over the source, bounded memory.

Each output stream (one per rank for the per-rank layout, one for the rank-sliced layout) is a
list of parts whose headers are known from the plan. The source is walked in batches of `BATCH`
payload bytes. Every stream is a consumer running in its own thread (numpy copies, hashing,
`copy_file_range` and `write` release the GIL), and so is the optional source hasher, which
digests source tensors for the source identity in the same pass (no second read of the source).
A consumer may run at most `WINDOW` batches ahead of the slowest one; the source pages of a
batch are dropped from this process once every consumer is done with it, so resident memory
stays near `WINDOW x BATCH` whatever the source size.

Contiguous runs are copied by the kernel (`copy_file_range`); strided runs (column slices of a
trellis) are gathered row by row into a reusable buffer. Each part is hashed (blake3, and sha256
when asked: `identity.engine.new_hasher`) as it is written, and its writeback to disk is started
every `WRITEBACK` bytes so that the publishing fsync finds little left to do.
"""

from __future__ import annotations

import contextlib
import functools
import mmap
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from exl3tool.formats.checkpoint import Checkpoint
from exl3tool.identity.engine import default_threads, new_hasher
from exl3tool.io.safetensors import FileStamp
from exl3tool.io.st_writer import TensorSpec, build_header
from exl3tool.io.workers import run_threads
from exl3tool.tp.slices import TensorSlice

CHUNK = 8 << 20  # bytes per write / per gather buffer
BATCH = 32 << 20  # source payload bytes per batch
WINDOW = 4  # batches a consumer may run ahead of the slowest one (bounds mapped pages)
WRITEBACK = 64 << 20  # output bytes between asynchronous writeback starts
_PAGE = mmap.PAGESIZE
_HAS_CFR = hasattr(os, "copy_file_range")


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
        self.fds: dict[str, int] = {}
        self.stamps: dict[str, FileStamp] = {}
        self.digests: dict[str, str] = {}  # source tensor -> digest taken during the pass

    def get(self, label: str) -> mmap.mmap | None:
        if label not in self._maps:
            st = self.ckpt.shards[label]
            fd = os.open(st.path, os.O_RDONLY)
            self.fds[label] = fd
            stamp = FileStamp.of(os.fstat(fd))
            self.stamps[label] = stamp
            self._maps[label] = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if stamp.size else None
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
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def _write_all(fd: int, data) -> None:
    mv = memoryview(data)
    while len(mv):
        n = os.write(fd, mv)
        mv = mv[n:]


_SYNC_FILE_RANGE_WRITE = 2
_sync_file_range: Callable[[int, int, int, int], int] | bool | None = False


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Ask the kernel to start writing [offset, offset + nbytes) to disk now, without waiting
    (Linux sync_file_range(SYNC_FILE_RANGE_WRITE)); a no-op where that call does not exist."""
    global _sync_file_range
    if _sync_file_range is False:
        _sync_file_range = None
        with contextlib.suppress(OSError, AttributeError, TypeError):
            import ctypes
            import ctypes.util

            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            fn = libc.sync_file_range
            fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
            fn.restype = ctypes.c_int
            _sync_file_range = fn
    if _sync_file_range:
        _sync_file_range(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)  # type: ignore[operator]


@dataclass
class _Stream:
    """The writer of one stream of parts; only one thread touches it at a time."""

    root: Path
    parts: list[Part]
    algos: tuple[str, ...] = ("blake3",)  # per-part file digests, in Part field names
    hash_threads: int = 1  # threads of each blake3 hasher (cores the other consumers leave)
    _part: int = -1
    _left: int = 0
    _fd: int | None = None
    _hashers: list = field(default_factory=list)
    _buf: np.ndarray | None = None
    _written: int = 0  # bytes written to the open part
    _kicked: int = 0  # bytes of it whose writeback was started

    def _open_next(self) -> None:
        self._close_current()
        self._part += 1
        part = self.parts[self._part]
        path = self.root / part.path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self._written = self._kicked = 0
        self._hashers = [new_hasher(a, self.hash_threads) for a in self.algos]
        header = part.header()
        self._emit(header)
        self._left = len(part.slices)
        part.size = len(header) + sum(s.nbytes for s in part.slices)

    def _close_current(self) -> None:
        if self._fd is None:
            return
        self._writeback(force=True)
        os.close(self._fd)
        self._fd = None
        part = self.parts[self._part]
        for algo, h in zip(self.algos, self._hashers, strict=True):
            setattr(part, algo, h.hexdigest())

    def _writeback(self, force: bool = False) -> None:
        n = self._written - self._kicked
        if self._fd is not None and n and (force or n >= WRITEBACK):
            start_writeback(self._fd, self._kicked, n)
            self._kicked = self._written

    def _hash(self, data) -> None:
        for h in self._hashers:
            h.update(data)

    def _emit(self, data) -> None:
        self._hash(data)
        _write_all(self._fd, data)
        self._written += len(data)
        self._writeback()

    def start(self) -> None:
        """Open the first part (also writes header-only parts of an empty stream)."""
        self._open_next()
        while self._left == 0 and self._part + 1 < len(self.parts):
            self._open_next()

    def _copy_range(self, mm: mmap.mmap, src_fd: int, base: int, n: int) -> None:
        """A contiguous run: kernel-side copy (copy_file_range); hashed from the source map."""
        if self._hashers:
            view = memoryview(mm)
            try:
                for pos in range(base, base + n, CHUNK):
                    self._hash(view[pos : min(pos + CHUNK, base + n)])
            finally:
                view.release()
        done = 0
        while done < n:
            k = os.copy_file_range(src_fd, self._fd, n - done, base + done)
            if k <= 0:
                raise OSError(f"copy_file_range stopped after {done} of {n} bytes")
            done += k
        self._written += n
        self._writeback()

    def copy(
        self, s: TensorSlice, mm: mmap.mmap | None, payload_start: int, src_fd: int | None = None
    ) -> None:
        while self._left == 0:
            self._open_next()
        lay = s.layout
        if lay.nbytes:
            base = payload_start + lay.offset
            if lay.contiguous and src_fd is not None and _HAS_CFR:
                self._copy_range(mm, src_fd, base, lay.nbytes)
            elif lay.contiguous:
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


class _SourceHasher:
    """Digests of whole source tensors, taken from the same maps as the copy (one read)."""

    def __init__(self, algo: str, wanted: set[str]) -> None:
        self.algo = algo
        self.wanted = wanted
        self.digests: dict[str, str] = {}

    def run(self, names: Sequence[str], ckpt: Checkpoint, maps: SourceMaps) -> None:
        """Hash `names` (one consumer's share of a batch; several run at once)."""
        for name in names:
            if name not in self.wanted:
                continue
            ref = ckpt.tensors[name]
            a = ref.shard.data_start + ref.info.begin
            b = a + ref.info.nbytes
            h = new_hasher(self.algo)
            mm = maps.get(ref.file)
            if mm is not None and b > a:
                view = memoryview(mm)
                try:
                    for pos in range(a, b, CHUNK):
                        h.update(view[pos : min(pos + CHUNK, b)])
                finally:
                    view.release()
            self.digests[name] = h.hexdigest()


def _batches(ckpt: Checkpoint, order: Sequence[str]) -> list[tuple[int, int]]:
    """[first, last) source indices of consecutive runs of about BATCH payload bytes."""
    batches: list[tuple[int, int]] = []
    lo, acc = 0, 0
    for i, name in enumerate(order):
        acc += ckpt.tensors[name].info.nbytes
        if acc >= BATCH:
            batches.append((lo, i + 1))
            lo, acc = i + 1, 0
    if lo < len(order) or not batches:
        batches.append((lo, len(order)))
    return batches


class _Window:
    """Keeps consumers within WINDOW batches of each other; the last consumer done with a
    batch runs its `release` (page drops, progress)."""

    def __init__(self, consumers: int, release: Callable[[int], None]) -> None:
        self._cond = threading.Condition()
        self._consumers = consumers
        self._done: dict[int, int] = {}
        self._finished = -1  # every batch <= this is done by everyone
        self._release = release
        self.failed = False

    def wait_turn(self, b: int) -> bool:
        with self._cond:
            while not self.failed and b - self._finished > WINDOW:
                self._cond.wait()
            return not self.failed

    def done(self, b: int) -> None:
        with self._cond:
            self._done[b] = self._done.get(b, 0) + 1
            last = self._done[b] == self._consumers
            if last:
                del self._done[b]
        if last:
            self._release(b)
            with self._cond:
                # batches complete in order per consumer, so the last one for b finishes b
                self._finished = max(self._finished, b)
                self._cond.notify_all()

    def fail(self) -> None:
        with self._cond:
            self.failed = True
            self._cond.notify_all()


def write_streams(
    ckpt: Checkpoint,
    order: Sequence[str],
    streams: Sequence[list[Part]],
    root: Path,
    *,
    threads: int | None = None,
    progress=None,
    algos: tuple[str, ...] = ("blake3",),
    source_algo: str = "blake3",
    source_tensors: set[str] | None = None,
) -> SourceMaps:
    """Copy every part of every stream into `root`; fills each Part's size and digests.

    `algos`: the per-part file digests (Part fields). `source_tensors`: source tensors whose
    whole-payload `source_algo` digest is taken in the same pass (returned in `.digests`).
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
    batches = _batches(ckpt, order)
    maps = SourceMaps(ckpt)
    hasher = _SourceHasher(source_algo, source_tensors) if source_tensors else None
    share = _share_cores(threads, len(streams), hasher is not None)
    writers = [_Stream(root, parts, algos, share.stream_hash_threads) for parts in streams]
    cursors = [0] * len(writers)

    def copy_batch(w: int, b: int) -> None:
        last = batches[b][1]
        items, writer = flat[w], writers[w]
        i = cursors[w]
        while i < len(items) and items[i][0] < last:
            src_idx, s = items[i]
            ref = ckpt.tensors[order[src_idx]]
            mm = maps.get(ref.file)
            writer.copy(s, mm, ref.shard.data_start + ref.info.begin, maps.fds.get(ref.file))
            i += 1
        cursors[w] = i

    def hash_batch(j: int, b: int) -> None:
        assert hasher is not None
        first, last = batches[b]
        hasher.run(order[first + j : last : share.source_hashers], ckpt, maps)

    def release(b: int) -> None:
        first, last = batches[b]
        spans: dict[str, tuple[int, int]] = {}
        for name in order[first:last]:
            ref = ckpt.tensors[name]
            a, e = ref.shard.span(name)
            lo_, hi_ = spans.get(ref.file, (a, e))
            spans[ref.file] = (min(lo_, a), max(hi_, e))
        for label, (a, e) in spans.items():
            maps.drop(label, a, e)
        if progress is not None:
            progress.advance(sum(ckpt.tensors[n].info.nbytes for n in order[first:last]))

    consumers: list[Callable[[int], None]] = [
        (lambda b, w=w: copy_batch(w, b)) for w in range(len(writers))
    ]
    if hasher is not None:
        consumers += [(lambda b, j=j: hash_batch(j, b)) for j in range(share.source_hashers)]
    try:
        for label in {ckpt.tensors[n].file for n in order}:
            maps.get(label)
        for w in writers:
            w.start()
        if share.cores <= 1 or len(consumers) == 1:
            for b in range(len(batches)):
                for c in consumers:
                    c(b)
                release(b)
        else:
            _run_consumers(consumers, len(batches), release)
        for w in writers:
            w.finish()
    except BaseException:
        for w in writers:
            w.abort()
        maps.close()
        raise
    maps.close()
    if hasher is not None:
        maps.digests = hasher.digests
    return maps


@dataclass(frozen=True)
class _CoreShare:
    cores: int
    source_hashers: int  # consumers that split each batch's source tensors between them
    stream_hash_threads: int  # threads of each output stream's blake3 hashers


def _share_cores(threads: int | None, streams: int, hash_source: bool) -> _CoreShare:
    """Spread the cores over the work: one thread per output stream; of the cores left, half
    hash the source (each takes every n-th tensor of a batch) and half go to the streams'
    hashers (a multi-threaded blake3 hasher per stream). On 2 cores: one of each, no extra."""
    cores = max(1, threads or default_threads())
    spare = max(0, cores - streams)
    sources = max(1, spare // 2) if hash_source else 0
    per_stream = max(1, (spare - sources) // max(1, streams) + 1)
    return _CoreShare(cores, sources, per_stream)


def _run_consumers(
    consumers: Sequence[Callable[[int], None]], n_batches: int, release: Callable[[int], None]
) -> None:
    """One thread per consumer, each through every batch in order, within the window."""
    window = _Window(len(consumers), release)
    errors: list[BaseException] = []

    def loop(consume: Callable[[int], None]) -> None:
        try:
            for b in range(n_batches):
                if not window.wait_turn(b):
                    return
                consume(b)
                window.done(b)
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)
            window.fail()

    run_threads([functools.partial(loop, c) for c in consumers], "exl3slice")
    if errors:
        raise errors[0]
