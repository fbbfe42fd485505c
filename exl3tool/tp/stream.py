"""Streaming copy of planned slices into safetensors parts: one pass over the source, bounded memory.

Each output stream (one per rank for the per-rank layout, one for the rank-sliced layout) is a
list of parts whose headers are known from the plan. The source is walked in batches of `BATCH`
payload bytes. Every stream is a consumer running in its own thread (pread, numpy copies,
hashing and `write` release the GIL), and so is the optional source hasher, which digests
source tensors for the source identity in the same pass (from the page cache the copy fills).
A consumer may run at most `WINDOW` batches ahead of the slowest one.

Source bytes are read with pread into reusable buffers per consumer (CHUNK bytes, less with
many consumers: `chunk_size` keeps them within BUFFER_BUDGET together), never through
a mapping (issue 15 item 1: a truncated mapped file kills the process with SIGBUS); resident
memory is those buffers whatever the source size. A shard that shrinks, changes or
is replaced while read is `InputChanged` (exit 3, the file named). Contiguous runs are read,
hashed and written from the same buffer (the digest is of the bytes written); strided runs
(column slices of a trellis) are read a block of rows at a time and gathered. Each part is
hashed (blake3, and sha256 when asked: `identity.engine.new_hasher`) as it is written, and its
writeback to disk is started every `WRITEBACK` bytes so that the publishing fsync finds little
left to do.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from exl3tool.formats.checkpoint import Checkpoint
from exl3tool.identity.engine import default_threads, new_hasher
from exl3tool.io.safetensors import FileStamp
from exl3tool.io.st_writer import TensorSpec, build_header
from exl3tool.io.views import InputChanged, PayloadFile
from exl3tool.io.workers import run_threads
from exl3tool.tp.slices import ByteLayout, TensorSlice

CHUNK = 8 << 20  # bytes per pread / write / gather buffer (less with many consumers)
BUFFER_BUDGET = 256 << 20  # all consumers' buffers together, whatever the TP size
BATCH = 32 << 20  # source payload bytes per batch
WINDOW = 4  # batches a consumer may run ahead of the slowest one
WRITEBACK = 64 << 20  # output bytes between asynchronous writeback starts
DIRECT_RUN = 256 << 10  # strided runs at least this long are read one by one (no over-read)


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


class SourceFiles:
    """The one cache of open input files (the slicer's sources, verify's sources and outputs).

    Bytes are read with pread into the caller's bounded buffers (`io.views.PayloadFile`), never
    through a mapping: a file that shrinks under us is `InputChanged` (exit 3, the file named),
    never SIGBUS (issue 15 item 1). Opening checks the stamp of the header read (`expected`);
    `verify_unchanged` is the stability proof after the pass."""

    def __init__(self) -> None:
        self._files: dict[Path, PayloadFile] = {}
        self._lock = threading.Lock()  # consumers may open lazily from several threads

    def get(self, path: Path, expected: FileStamp | None = None) -> PayloadFile:
        f = self._files.get(path)
        if f is None:
            with self._lock:
                f = self._files.get(path)
                if f is None:
                    try:
                        f = PayloadFile(path, expected)
                    except OSError as exc:
                        raise InputChanged(f"{path}: cannot open: {exc.strerror or exc}") from exc
                    self._files[path] = f
        return f

    def verify_unchanged(self) -> None:
        """InputChanged naming the first file that changed, shrank or was replaced since opened."""
        for f in self._files.values():
            f.verify_unchanged()

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()


def read_chunks(f: PayloadFile, start: int, end: int, buf: memoryview) -> Iterator[memoryview]:
    """Bytes [start, end) of `f` as successive views of `buf` (each valid until the next)."""
    if end > f.size:
        raise InputChanged(f"{f.path}: range [{start}, {end}) beyond its {f.size} bytes at open")
    step = len(buf)
    for pos in range(start, end, step):
        yield f.read_into(buf[: min(step, end - pos)], pos)


class ChunkBuffers:
    """A consumer's reusable buffers: a pread target and a gather target, `size` bytes each."""

    def __init__(self, size: int | None = None) -> None:
        self.size = size or CHUNK
        self.read = np.empty(self.size, dtype=np.uint8)
        self.gather = np.empty(self.size, dtype=np.uint8)


def chunk_size(consumers: int) -> int:
    """CHUNK, or less so that `consumers` buffer pairs stay within BUFFER_BUDGET (>= 1 MiB)."""
    return max(1 << 20, min(CHUNK, BUFFER_BUDGET // (2 * max(1, consumers))))


def slice_chunks(
    f: PayloadFile, payload_start: int, lay: ByteLayout, bufs: ChunkBuffers
) -> Iterator[memoryview]:
    """The bytes of one slice (`lay` within the payload at `payload_start`) in order, as views
    of `bufs` (each valid until the next). Long strided runs are read one by one; short ones a
    block of whole rows at a time (its span fits the read buffer) and gathered."""
    base = payload_start + lay.offset
    rview = memoryview(bufs.read)
    if lay.contiguous:
        yield from read_chunks(f, base, base + lay.nbytes, rview)
        return
    run, count, stride = lay.run, lay.count, lay.stride
    end = base + (count - 1) * stride + run
    if end > f.size:
        raise InputChanged(f"{f.path}: range [{base}, {end}) beyond its {f.size} bytes at open")
    # not one pread per short run: with several consumer threads the per-call GIL hand-off
    # costs more than reading the rows whole (4x over-read at TP 4 measured cheaper)
    if run >= DIRECT_RUN or stride > bufs.size:
        for i in range(count):
            yield from read_chunks(f, base + i * stride, base + i * stride + run, rview)
        return
    per = bufs.size // stride  # >= 1
    for i in range(0, count, per):
        k = min(per, count - i)
        f.read_into(rview[: (k - 1) * stride + run], base + i * stride)
        rows = np.lib.stride_tricks.as_strided(
            bufs.read, shape=(k, run), strides=(stride, 1), writeable=False
        )
        np.copyto(bufs.gather[: k * run].reshape(k, run), rows)
        yield memoryview(bufs.gather)[: k * run]


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
    chunk: int = CHUNK  # bytes of each of its buffers (chunk_size)
    _part: int = -1
    _left: int = 0
    _fd: int | None = None
    _hashers: list = field(default_factory=list)
    _bufs: ChunkBuffers | None = None  # allocated on the first non-empty slice
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

    def copy(self, s: TensorSlice, src: PayloadFile, payload_start: int) -> None:
        """Append slice `s` of the source tensor whose payload starts at `payload_start`."""
        while self._left == 0:
            self._open_next()
        if s.layout.nbytes:
            if self._bufs is None:
                self._bufs = ChunkBuffers(self.chunk)
            # hashed and written from the same buffer: the digest is of the bytes written
            for chunk in slice_chunks(src, payload_start, s.layout, self._bufs):
                self._emit(chunk)
        self._left -= 1

    def finish(self) -> None:
        while self._part + 1 < len(self.parts):  # trailing empty parts
            self._open_next()
        self._close_current()

    def abort(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class _SourceHasher:
    """Digests of whole source tensors, read from the same open files as the copy (the bytes
    come from the page cache the copy just filled: no second read from disk)."""

    def __init__(self, algo: str, wanted: set[str]) -> None:
        self.algo = algo
        self.wanted = wanted
        self.digests: dict[str, str] = {}

    def run(self, names: Sequence[str], src: _Source, buf: memoryview) -> None:
        """Hash `names` (one consumer's share of a batch, through its own `buf`)."""
        for name in names:
            if name not in self.wanted:
                continue
            ref = src.ckpt.tensors[name]
            a = ref.shard.data_start + ref.info.begin
            h = new_hasher(self.algo)
            for chunk in read_chunks(src.file(ref.file), a, a + ref.info.nbytes, buf):
                h.update(chunk)
            self.digests[name] = h.hexdigest()


@dataclass
class _Source:
    """The source checkpoint and its open shards (by label), stamps checked at open."""

    ckpt: Checkpoint
    files: SourceFiles = field(default_factory=SourceFiles)

    def file(self, label: str) -> PayloadFile:
        st = self.ckpt.shards[label]
        return self.files.get(st.path, st.stamp)


@dataclass
class StreamResult:
    """What the pass took besides the files: source tensor -> digest (`source_tensors`)."""

    digests: dict[str, str] = field(default_factory=dict)


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
) -> StreamResult:
    """Copy every part of every stream into `root`; fills each Part's size and digests.

    `algos`: the per-part file digests (Part fields). `source_tensors`: source tensors whose
    whole-payload `source_algo` digest is taken in the same pass (returned in `.digests`).
    A source shard that shrank, changed or was replaced since its header was read (at open,
    during or after the pass) raises InputChanged naming it (exit 3).
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
    src = _Source(ckpt)
    hasher = _SourceHasher(source_algo, source_tensors) if source_tensors else None
    share = _share_cores(threads, len(streams), hasher is not None)
    chunk = chunk_size(len(streams) + share.source_hashers)
    writers = [_Stream(root, parts, algos, share.stream_hash_threads, chunk) for parts in streams]
    cursors = [0] * len(writers)

    def copy_batch(w: int, b: int) -> None:
        last = batches[b][1]
        items, writer = flat[w], writers[w]
        i = cursors[w]
        while i < len(items) and items[i][0] < last:
            src_idx, s = items[i]
            ref = ckpt.tensors[order[src_idx]]
            writer.copy(s, src.file(ref.file), ref.shard.data_start + ref.info.begin)
            i += 1
        cursors[w] = i

    hash_bufs = [memoryview(bytearray(chunk)) for _ in range(share.source_hashers)]

    def hash_batch(j: int, b: int) -> None:
        assert hasher is not None
        first, last = batches[b]
        hasher.run(order[first + j : last : share.source_hashers], src, hash_bufs[j])

    def release(b: int) -> None:
        if progress is not None:
            first, last = batches[b]
            progress.advance(sum(ckpt.tensors[n].info.nbytes for n in order[first:last]))

    consumers: list[Callable[[int], None]] = [
        (lambda b, w=w: copy_batch(w, b)) for w in range(len(writers))
    ]
    if hasher is not None:
        consumers += [(lambda b, j=j: hash_batch(j, b)) for j in range(share.source_hashers)]
    try:
        for label in sorted({ckpt.tensors[n].file for n in order}):
            src.file(label)  # open (and stamp-check) every shard before the threads start
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
        src.files.verify_unchanged()  # the stability proof: same bytes from open to end
    except BaseException:
        for w in writers:
            w.abort()
        raise
    finally:
        src.files.close()
    return StreamResult(hasher.digests if hasher is not None else {})


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
