"""Streaming copy of planned slices into safetensors parts: one pass over the source, bounded memory.

Each output stream (one per rank for the per-rank layout, one for the rank-sliced layout) is a
list of parts whose headers are known from the plan. The source is read once, in blocks
(`tp.blocks`: consecutive tensors of a file share a block, a large tensor is cut into blocks of
whole rows) by one reader thread into a few pooled buffers (`tp.pipeline`); every stream and
the optional source hasher (the source identity, taken in the same pass) is a consumer in a
thread of its own that takes its pieces of each block from the shared buffer. pread, numpy
copies, hashing and write release the GIL.

Source bytes are read with pread, never through a mapping (issue 15 item 1: a truncated
mapped file kills the process with SIGBUS); resident memory is DEPTH block buffers (CHUNK
bytes each, less with many streams: `chunk_size` keeps them within BUFFER_BUDGET) plus STAGES
stage buffers of STAGE bytes per stream, whatever the source size. A shard that shrinks,
changes or is replaced while read is `InputChanged` (exit 3, the file named). Each output part is written through its
stream's stage (`tp.outfile`: contiguous runs copied, column slices gathered, O_DIRECT where the
file system takes it) and hashed (blake3, and sha256 when asked:
`identity.engine.new_hasher`) from the stage as it is written: the digests are of the bytes
written.
"""

from __future__ import annotations

import contextlib
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
from exl3tool.tp.blocks import OWN, ROWS, Block, Piece, iter_blocks
from exl3tool.tp.outfile import StagedFile, Stages
from exl3tool.tp.pipeline import run_pipeline
from exl3tool.tp.slices import ByteLayout, TensorSlice

# 8 MiB blocks and stages, six per stream: TP 4 at 0.90x a durable copy on the 16-core host
# (0.74x with 4 MiB blocks and three 2 MiB stages; RSS 321 MB), the same on 2 cores.
CHUNK = 8 << 20  # bytes per block read and gather buffer (less with many consumers)
BUFFER_BUDGET = 256 << 20  # all consumers' buffers together, whatever the TP size
DEPTH = 4  # pooled block buffers: the reader runs at most DEPTH - 1 blocks ahead
DIRECT = True  # output files with O_DIRECT where the file system takes it (tp/outfile.py)
STAGES = 6  # stage buffers per stream: one filled and hashed while the others are written
STAGE = 8 << 20  # bytes per stage (at most the block size)
WRITERS = 1  # writes in flight per stream (threads writing its stages)
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
    items: list[tuple[int, TensorSlice]]  # (source index, slice) in write order
    algos: tuple[str, ...] = ("blake3",)  # per-part file digests, in Part field names
    hash_threads: int = 1  # threads of each blake3 hasher (cores the other consumers leave)
    chunk: int = CHUNK  # bytes of each of its buffers (chunk_size)
    _part: int = -1
    _left: int = 0
    _file: StagedFile | None = None
    _hashers: list = field(default_factory=list)
    _bufs: ChunkBuffers | None = None  # for the slices it reads on its own (blocks.OWN)
    _stages: Stages | None = None  # every byte of the open part passes through them

    def _open_next(self) -> None:
        self._close_current()
        self._part += 1
        part = self.parts[self._part]
        path = self.root / part.path
        path.parent.mkdir(parents=True, exist_ok=True)
        if self._stages is None:
            self._stages = Stages(min(self.chunk, STAGE), STAGES, WRITERS)
        self._hashers = [new_hasher(a, self.hash_threads) for a in self.algos]
        self._file = StagedFile(
            path, self._stages, self._hashers, start_writeback, WRITEBACK, direct=DIRECT
        )
        header = part.header()
        self._file.put(header)
        self._left = len(part.slices)
        part.size = len(header) + sum(s.nbytes for s in part.slices)

    def _close_current(self) -> None:
        if self._file is None:
            return
        self._file.close()
        self._file = None
        part = self.parts[self._part]
        for algo, h in zip(self.algos, self._hashers, strict=True):
            setattr(part, algo, h.hexdigest())

    def start(self) -> None:
        """Open the first part (also writes header-only parts of an empty stream)."""
        self._open_next()
        while self._left == 0 and self._part + 1 < len(self.parts):
            self._open_next()

    def _begin_slice(self) -> None:
        while self._left == 0:
            self._open_next()

    def copy(self, s: TensorSlice, src: PayloadFile, payload_start: int) -> None:
        """Append slice `s` of the source tensor whose payload starts at `payload_start`,
        read through this stream's own buffers."""
        self._begin_slice()
        if s.layout.nbytes:
            if self._bufs is None:
                self._bufs = ChunkBuffers(self.chunk)
            for chunk in slice_chunks(src, payload_start, s.layout, self._bufs):
                self._file.put(chunk)  # type: ignore[union-attr]
        self._left -= 1

    def take(self, pieces: Sequence[Piece], buf: np.ndarray, src: _Source) -> None:
        """Append this stream's pieces of one block read into `buf` (blocks.iter_blocks):
        contiguous runs copied, rows gathered into the stage of the open part. The first
        call opens the first part (its header is built in this stream's thread)."""
        if self._part < 0:
            self.start()
        view = memoryview(buf)
        for p in pieces:
            if p.kind == OWN:
                i, s = self.items[p.item]
                ref = src.ckpt.tensors[src.order[i]]
                self.copy(s, src.file(ref.file), p.offset)
                continue
            if p.first and self._left == 0:  # the slice opens the next part
                self._begin_slice()
            out = self._file
            assert out is not None
            if p.kind == ROWS:
                out.put_rows(buf, p.offset, p.run, p.count, p.stride)
            elif p.run:
                out.put(view[p.offset : p.offset + p.run])
            if p.last:
                self._left -= 1

    def finish(self) -> None:
        while self._part + 1 < len(self.parts):  # trailing empty parts
            self._open_next()
        self._close_current()
        self._stop()

    def abort(self) -> None:
        if self._file is not None:
            self._file.abort()
            self._file = None
        self._stop()

    def _stop(self) -> None:
        if self._stages is not None:
            self._stages.close()


class _SourceHasher:
    """Digests of whole source tensors, from the blocks the copy reads (no second read)."""

    def __init__(self, algo: str) -> None:
        self.algo = algo
        self.digests: dict[str, str] = {}
        self._h = None
        self._buf: memoryview | None = None  # for tensors it reads on its own

    def take(self, pieces: Sequence[Piece], buf: np.ndarray, src: _Source, chunk: int) -> None:
        view = memoryview(buf)
        for p in pieces:
            name = src.order[p.item]
            if p.kind == OWN:
                if self._buf is None:
                    self._buf = memoryview(bytearray(chunk))
                f = src.file(src.ckpt.tensors[name].file)
                h = new_hasher(self.algo)
                for c in read_chunks(f, p.offset, p.offset + p.run, self._buf):
                    h.update(c)
                self.digests[name] = h.hexdigest()
                continue
            if p.first:
                self._h = new_hasher(self.algo)
            self._h.update(view[p.offset : p.offset + p.run])  # type: ignore[union-attr]
            if p.last:
                self.digests[name] = self._h.hexdigest()  # type: ignore[union-attr]
                self._h = None


@dataclass
class _Source:
    """The source checkpoint, its pass order and its open shards (by label), stamps checked
    at open."""

    ckpt: Checkpoint
    order: Sequence[str]
    files: SourceFiles = field(default_factory=SourceFiles)

    def file(self, label: str) -> PayloadFile:
        st = self.ckpt.shards[label]
        return self.files.get(st.path, st.stamp)

    def read(self, blk: Block, buf: np.ndarray) -> None:
        """Fill `buf` with the bytes of `blk`; InputChanged if the file no longer has them."""
        if blk.nbytes:
            f = self.file(blk.file)
            if blk.end > f.size:
                raise InputChanged(
                    f"{f.path}: range [{blk.start}, {blk.end}) beyond its {f.size} bytes at open"
                )
            f.read_into(memoryview(buf)[: blk.nbytes], blk.start)


@dataclass
class StreamResult:
    """What the pass took besides the files: source tensor -> digest (`source_tensors`)."""

    digests: dict[str, str] = field(default_factory=dict)


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
    meanwhile: Callable[[], None] | None = None,
) -> StreamResult:
    """Copy every part of every stream into `root`; fills each Part's size and digests.

    `algos`: the per-part file digests (Part fields). `source_tensors`: source tensors whose
    whole-payload `source_algo` digest is taken in the same pass (returned in `.digests`).
    `meanwhile()`: the caller's work to run in this thread while the pass runs in others.
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
    share = _share_cores(threads, len(streams), bool(source_tensors))
    size = chunk_size(len(streams) + DEPTH)
    # planned as they are read (the reader thread draws them)
    blocks = iter_blocks(ckpt, order, flat, source_tensors or set(), share.source_hashers, size)
    src = _Source(ckpt, order)
    hashers = [_SourceHasher(source_algo) for _ in range(share.source_hashers)]
    writers = [
        _Stream(root, parts, items, algos, share.stream_hash_threads, size)
        for parts, items in zip(streams, flat, strict=True)
    ]
    nst = len(writers)
    takes: list[Callable[[Block, np.ndarray], None]] = [
        lambda blk, buf, w=w, k=k: w.take(blk.pieces[k], buf, src) for k, w in enumerate(writers)
    ]
    takes += [
        lambda blk, buf, h=h, k=k: h.take(blk.pieces[nst + k], buf, src, size)
        for k, h in enumerate(hashers)
    ]

    def done(blk: Block) -> None:
        if progress is not None and blk.done_bytes:
            progress.advance(blk.done_bytes)

    try:
        for label in sorted({ckpt.tensors[n].file for n in order}):
            src.file(label)  # open (and stamp-check) every shard before the threads start
        threaded = share.cores > 1 and len(takes) > 1
        run_pipeline(
            blocks,
            src.read,
            takes,
            size=size,
            depth=DEPTH,
            threaded=threaded,
            done=done,
            meanwhile=meanwhile,
        )
        for w in writers:
            w.finish()
        src.files.verify_unchanged()  # the stability proof: same bytes from open to end
    except BaseException:
        for w in writers:
            w.abort()
        raise
    finally:
        src.files.close()
    digests: dict[str, str] = {}
    for h in hashers:
        digests.update(h.digests)
    return StreamResult(digests)


@dataclass(frozen=True)
class _CoreShare:
    cores: int
    source_hashers: int  # consumers that split the source tensors between them
    stream_hash_threads: int  # threads of each output stream's blake3 hashers


def _share_cores(threads: int | None, streams: int, hash_source: bool) -> _CoreShare:
    """Spread the cores over the work: one thread per output stream; of the cores left, half
    hash the source (each takes every n-th hashed tensor) and half go to the streams'
    hashers (a multi-threaded blake3 hasher per stream). On 2 cores: one of each, no extra."""
    cores = max(1, threads or default_threads())
    spare = max(0, cores - streams)
    sources = max(1, spare // 2) if hash_source else 0
    per_stream = max(1, (spare - sources) // max(1, streams) + 1)
    return _CoreShare(cores, sources, per_stream)
