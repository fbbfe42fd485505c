"""The project's one hashing engine: tensor payloads and whole files.

docs/formats/msrt.md §11.1: hashlib and blake3 release the GIL for large buffers, so a pool
of one-hasher-per-tensor workers scales with cores; a blake3 hasher is never shared between
threads. Tensors too large to balance across the pool get a multi-threaded blake3 hasher.

A file held under a read lease (io/lease: nobody can write or truncate it while it is held) is
hashed straight from one mapping of the whole file, the lease checked before every MAP_WINDOW
bytes and the pages a worker hashed dropped every MAP_RESIDENT / threads bytes; a broken lease
(a writer or a truncate waits) stops every read of the file and is `InputChanged`. Any other
file is read with pread into reusable buffers (a file truncated under an unguarded mapping
kills the process with SIGBUS); small tensors of a file are read together, one pread per READ
bytes. Either way resident memory stays near MAP_RESIDENT (plus one tensor per thread) or
`threads x` one READ buffer. Every file is stamped at open and verified unchanged after hashing
(issue 15): a file that shrank, changed or was replaced by a rename is `InputChanged` (exit 3),
never a digest.
Files are mapped where a lease can be held; EXL3TOOL_NO_LEASE=1 reads every file with pread.
From FORK_MIN_THREADS threads (on Linux) the units are hashed by forked worker processes
(io/forkpool), not threads: no GIL between them, and each drops pages in its own address space;
EXL3TOOL_NO_FORK=1 keeps threads.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from functools import partial
from itertools import compress
from pathlib import Path
from typing import Any, NamedTuple, Protocol, TypeVar

from exl3tool.io import forkpool
from exl3tool.io.lease import DROP_ALIGN, LeasedMap, LeaseRefused
from exl3tool.io.progress import NO_PROGRESS, Progress
from exl3tool.io.safetensors import FileStamp, SafetensorsFile, TensorInfo
from exl3tool.io.views import InputChanged, PayloadFile, same_content, verify_stamp
from exl3tool.io.workers import run_threads
from exl3tool.rules.errors import InputError, UsageError

ALGORITHMS = ("blake3", "sha256")
K = TypeVar("K", bound=Hashable)

# One pread fills a READ buffer that the hasher then reads while it is still in the core's L2
# cache (larger buffers are slower: the copy and the hash each stream from memory).
READ = 512 << 10
SMALL = READ // 2  # one-segment jobs up to this size are read together, READ bytes at a time
MT_MIN = 32 << 20  # smallest job worth a multi-threaded blake3 hasher
MT_READ = 16 << 20  # bytes per pread (and update) of a multi-threaded blake3 hasher
DROP_EVERY = 32 << 20  # bytes a worker hashes between progress updates
# A leased file is hashed from its whole-file mapping (the lease is checked every MAP_WINDOW
# bytes); its jobs of up to half a batch are batched, MAP_BATCH bytes a batch whatever the
# number of threads, and each worker drops the pages it hashed every MAP_RESIDENT / threads
# bytes (at least DROP_MIN): resident memory stays near MAP_RESIDENT plus a tensor a thread.
# 64 MiB (was 128): with the compatibility block, 16 GB of 200 KB tensors hashed by 16
# workers peaked at 322 MB with 128 MiB and 285-292 MB with 64 (2-core VM, --threads 16,
# benchmarks/identity_memory_probe.py); on 2 cores the same speed (paired, 4 GB).
# 16-core host, 12 GB GLM mix: 391 units of 32 MB hash in 0.23-0.26 s where 2881 (8 MB
# batches, a drop each) took 0.29-0.33 s; each drop's TLB shootdown stalls every thread. On
# 2 cores 32 MB batches hash the GLM mix 8 % faster than 8 MB ones.
MAP_WINDOW = 8 << 20
MAP_BATCH = 32 << 20
MAP_RESIDENT = 64 << 20
DROP_MIN = 2 << 20  # the least a worker hashes between drops (each stalls every thread)
# One-thread units go to forked workers (io/forkpool) from this many threads and this many
# bytes: 16-core host, GLM-5.2 mix, 36 GB: 16 processes 1.2 s, 16 threads 2.6 s
# (benchmarks/identity_process_probe.py); 2 cores: the same within 1 %. A fork copies the
# parent's page tables before any unit is hashed, hence the FORK_* bounds: 2-3 ms per worker for
# a 100 MB parent, ~11 ms for a 400 MB one (2-core VM, benchmarks/fork_cost.py).
FORK_MIN_THREADS = 4
FORK_MIN_BYTES = 1 << 30
FORK_BYTES_PER_RSS = 1  # and at least this many bytes per worker per byte the parent holds
FORK_MAX_RSS = 2 << 30
# Hashes read from mappings where a lease allows: the pread copy costs more than the mapping's
# page faults (2-core VM, 4.2 GB GLM mix: sha256 1.68 s mapped vs 1.98 s with pread, system
# time 0.11 vs 0.52 s; 16-core host, 36 GB: blake3 mapped 1.22x b3sum, pread 1.01x). On some
# machines blake3 hashes a buffer pread has just filled (in L2) faster than a mapping's cold
# pages: the workers that hash ahead (identity/early) measure both and keep the faster.


class Hasher(Protocol):
    def update(self, data: Any, /) -> object: ...
    def hexdigest(self) -> str: ...


class Segment(NamedTuple):
    """Absolute byte range [start, end) of a file, fed to a hasher in order (a tuple: one is
    made per tensor of a checkpoint, 100k+ of them)."""

    path: Path
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def check_algo(algo: str) -> str:
    if algo not in ALGORITHMS:
        raise UsageError(f"unknown hash algorithm {algo!r}; choose one of {', '.join(ALGORITHMS)}")
    return algo


def new_hasher(algo: str, threads: int = 1) -> Hasher:
    """A fresh hasher; `threads > 1` lets one blake3 hasher use several cores."""
    check_algo(algo)
    if algo == "sha256":
        import hashlib  # OpenSSL's start-up (2-5 ms): only where sha256 is asked for

        return hashlib.sha256()
    import blake3

    threads = min(threads, os.cpu_count() or 1)  # more than the cores only costs threads
    return blake3.blake3(max_threads=threads) if threads > 1 else blake3.blake3()


def tensor_segment(st: SafetensorsFile, info: TensorInfo) -> Segment:
    return Segment(st.path, st.data_start + info.begin, st.data_start + info.end)


class _Leased(LeasedMap):
    """A file under a read lease, checked like a PayloadFile."""

    def check(self) -> None:
        """InputChanged once a writer or a truncate waits for the lease: no mapping of this
        file may be touched after this fails."""
        if not self.intact():
            raise InputChanged(
                f"{self.path}: changed while it was read (opened for writing or truncated)"
            )

    def verify_unchanged(self) -> None:
        now = self.fstat()
        if not same_content(now, self.stamp):
            raise InputChanged(
                f"{self.path}: changed while it was read (size {self.size} -> {now.size})"
            )
        verify_stamp(self.path, self.stamp, "was opened")


_File = _Leased | PayloadFile


def _open_all(
    paths: Iterable[Path], expected: dict[Path, FileStamp] | None = None
) -> dict[Path, _File]:
    files: dict[Path, _File] = {}
    try:
        for p in paths:
            if p not in files:
                files[p] = PayloadFile(p, (expected or {}).get(p))
    except InputChanged:
        _close_all(files)
        raise
    except (OSError, ValueError) as exc:
        _close_all(files)
        raise InputError(f"{p}: cannot open for hashing: {exc}") from exc
    return files


def _lease_all(files: dict[Path, _File]) -> None:
    """Swap each opened file for the same file under a read lease, where one can be held."""
    if os.environ.get("EXL3TOOL_NO_LEASE"):
        return
    for path, f in files.items():
        try:
            leased = _Leased(path)
        except (LeaseRefused, OSError):
            continue
        if same_content(leased.stamp, f.stamp):  # the file the checks opened, unchanged
            f.close()
            files[path] = leased
        else:
            leased.close()  # the pread file's checks report it


def _close_all(files: dict[Path, _File]) -> None:
    for f in files.values():
        f.close()


class _Tracker:
    """One worker's progress, batched every DROP_EVERY bytes."""

    def __init__(self, progress: Any) -> None:
        self._progress = progress
        self._pending = 0

    def note(self, n: int) -> None:
        self._pending += n
        if self._pending >= DROP_EVERY:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            self._progress.advance(self._pending)
            self._pending = 0


def _constructor(algo: str) -> Any:
    """The one-thread hasher factory of `algo` (resolved once, not per tensor)."""
    check_algo(algo)
    if algo == "sha256":
        import hashlib

        return hashlib.sha256
    import blake3

    return blake3.blake3


# A small job is one int in its file's list, (start << 56) | (bytes << 32) | job: sorting the
# ints sorts by file offset, and 10^6 of them cost 50 MB, not the 150 MB of 3-tuples.
_JOB_BITS, _SIZE_SHIFT, _START_SHIFT = 32, 32, 56
_JOB_MASK = (1 << _JOB_BITS) - 1
_SIZE_MASK = (1 << (_START_SHIFT - _SIZE_SHIFT)) - 1


class _Batch(NamedTuple):
    """Small one-segment jobs of one file read with one pread: [lo, hi) and their packed ints."""

    path: Path
    lo: int
    hi: int
    jobs: list[int]


class _Job(NamedTuple):
    """A job read in READ-sized windows (large, or several segments): index, hasher threads."""

    index: int
    threads: int


def _drop_span(threads: int) -> int:
    """Bytes a worker of a pool of `threads` hashes from a mapping between page drops."""
    return max(MAP_RESIDENT // max(1, threads), DROP_MIN)


def _batches(
    small: dict[Path, list[int]],
    files: dict[Path, _File],
    large: dict[int, tuple[Segment, ...]],
) -> tuple[list[_Job], list[_Batch]]:
    """Runs of consecutive small jobs whose hull fits one READ buffer (one mapped batch of a
    leased file), in file order. A job of a file read with pread that is larger than SMALL
    (blake3 batches up to half a mapped batch) becomes a job of its own, put in `large`."""
    jobs: list[_Job] = []
    out: list[_Batch] = []
    mask = _SIZE_MASK
    job_mask = _JOB_MASK
    for path, packed in small.items():
        leased = type(files[path]) is _Leased
        hull = MAP_BATCH if leased else READ
        if not leased and (split := [k for k in packed if (k >> _SIZE_SHIFT) & mask > SMALL]):
            for k in split:
                start = k >> _START_SHIFT
                large[k & job_mask] = (Segment(path, start, start + ((k >> _SIZE_SHIFT) & mask)),)
                jobs.append(_Job(k & job_mask, 1))
            packed = [k for k in packed if (k >> _SIZE_SHIFT) & mask <= SMALL]
        packed.sort()  # file order
        first, lo, hi = 0, 0, 0
        for j, k in enumerate(packed):
            start = k >> _START_SHIFT
            end = start + ((k >> _SIZE_SHIFT) & mask)
            if j > first and end - lo > hull:
                out.append(_Batch(path, lo, hi, packed[first:j]))
                first = j
            if j == first:
                lo = hi = start
            hi = max(hi, end)
        if packed:
            out.append(_Batch(path, lo, hi, packed[first:]))
    return jobs, out


class Known(Protocol):
    """Digests hashed ahead (identity/early): for a file and the stamp its header was read
    with, the digest of each span [start, start + n) it holds, keyed by `span_key(start, n)`."""

    def lookup(self, path: Path, stamp: FileStamp) -> Mapping[int, str] | None: ...

    def stop(self) -> None:
        """No more hashing ahead: what is done is all there is."""


def batched_max() -> int:
    """The largest one-segment job read in batches with others (a larger one is a job alone)."""
    return min(MAP_BATCH // 2, _SIZE_MASK)


def span_key(start: int, n: int) -> int:
    """The key of a one-segment job of `n` bytes (< 16 MiB) at `start` in a `Known` table:
    its packed int without the job index."""
    return (start << (_START_SHIFT - _SIZE_SHIFT)) | n


class _Plan(NamedTuple):
    keys: list[Any]
    large: dict[int, tuple[Segment, ...]]  # the segments of jobs not read in batches
    units: list[_Job | _Batch]  # large jobs (largest first); `_batches(small)` go after them
    small: dict[Path, list[int]]  # packed small jobs of each file
    paths: list[Path]
    small_bytes: int  # of the jobs in `small`
    large_bytes: int  # of the jobs in `large`


def _plan(jobs: Iterable[tuple[Any, Sequence[Segment]]], algo: str, threads: int) -> _Plan:
    """Sort jobs into batches of small ones and large ones; only large jobs keep their
    segments (a small job's is its packed int)."""
    keys: list[Any] = []
    small: dict[Path, list[int]] = {}
    large: dict[int, tuple[Segment, ...]] = {}
    sizes: list[tuple[int, int]] = []  # (bytes, job) of large jobs
    total = 0
    small_max = batched_max()
    last: Path | None = None
    packed: list[int] = []
    for i, (key, segs) in enumerate(jobs):
        keys.append(key)
        if not isinstance(segs, tuple | list):
            segs = tuple(segs)
        if len(segs) == 1:
            path, start, end = segs[0]
            n = end - start
            if 0 <= n <= small_max and i >> _JOB_BITS == 0 and start >= 0:
                if path is not last:  # a shard's tensors share one Path: no hash per tensor
                    last, packed = path, small.setdefault(path, [])
                packed.append((start << _START_SHIFT) | (n << _SIZE_SHIFT) | i)
                total += n
                continue
        segs = segs if type(segs) is tuple else tuple(segs)
        large[i] = segs
        n = sum(s.end - s.start for s in segs)
        sizes.append((n, i))
        total += n
    fair = total / threads
    sizes.sort(key=lambda t: -t[0])
    units: list[_Job | _Batch] = []
    for n, i in sizes:  # a blake3 job beyond half a fair share gets the whole pool
        big = algo == "blake3" and threads > 1 and n >= MT_MIN and n > fair / 2
        units.append(_Job(i, threads if big else 1))
    paths = list(small) + [seg.path for segs in large.values() for seg in segs]
    large_bytes = sum(n for n, _ in sizes)
    return _Plan(keys, large, units, small, paths, total - large_bytes, large_bytes)


class _Stopped(Exception):
    """Another worker failed: this one stops at its next window."""


class _Worker:
    """One thread's reads: reusable pread buffers, or ranges of a leased file's mapping whose
    lease is checked before each and whose pages are dropped after; resident memory stays near
    one READ buffer or one window per file read at once."""

    def __init__(
        self,
        files: dict[Path, _File],
        ctor: Any,
        algo: str,
        track: _Tracker,
        stop: list[BaseException],
        drop_span: int = MAP_BATCH,
        second: _Second | None = None,
    ) -> None:
        self.files = files
        self.drop_span = drop_span  # bytes hashed from a mapping between page drops
        self.ctor = ctor
        self.algo = algo
        self.track = track
        self.stop = stop  # the pool's errors: non-empty once any worker failed
        self.second = second
        self._free: list[bytearray] = []

    def _buffer(self, size: int) -> bytearray:
        if size == READ and self._free:
            return self._free.pop()
        return bytearray(size)

    def batch(self, b: _Batch, out: list[Any]) -> None:
        f = self.files[b.path]
        if b.hi > f.size:
            raise InputError(f"{b.path}: payload [{b.lo}, {b.hi}) beyond {f.size} bytes")
        if b.hi == b.lo:  # empty tensors only
            self._hash_batch(memoryview(b""), b.lo, b, out)
        elif type(f) is _Leased:
            f.check()
            self._hash_batch(f.whole(), 0, b, out, f)
        else:
            buf = self._buffer(READ)
            try:
                view = f.read_into(memoryview(buf)[: b.hi - b.lo], b.lo)
                self._hash_batch(view, b.lo, b, out)
            finally:
                self._free.append(buf)
        self.track.note(b.hi - b.lo)

    def _hash_batch(
        self, view: memoryview, lo: int, b: _Batch, out: list[Any], leased: _Leased | None = None
    ) -> None:
        """One hasher per job of `b`, each over its slice of `view` (file bytes from `lo`). Of
        a `leased` file (`view` its whole mapping) the lease is checked again every MAP_WINDOW
        bytes, the pages hashed dropped every `drop_span` bytes and the rest at the end."""
        mask = _SIZE_MASK
        job_mask = _JOB_MASK
        ctor = self.ctor
        due = b.lo + MAP_WINDOW if leased is not None else 1 << 62
        span = self.drop_span if leased is not None else 1 << 62
        kept = b.lo  # the pages of [kept, ...) were not dropped yet
        second = self.second
        wanted = second.wanted if second is not None else None
        twice = 0  # bytes also hashed by the second algorithm
        try:
            for k in b.jobs:
                at = k >> _START_SHIFT
                if at >= due and leased is not None:  # due is finite only for a leased file
                    leased.check()
                    due = at + MAP_WINDOW
                if at - kept >= span and leased is not None:
                    # up to the block `at` is in: the folio a fault at `at` maps below it is
                    # dropped by the next drop, which starts at that block
                    edge = at - at % DROP_ALIGN
                    if edge > kept:
                        leased.drop(kept, edge)
                        kept = edge
                at -= lo
                job = k & job_mask
                data = view[at : at + ((k >> _SIZE_SHIFT) & mask)]
                if out[job] is None:  # else known (hashed ahead): only `second` wants it
                    out[job] = ctor(data).hexdigest()
                if wanted is not None and wanted[job]:  # the bytes again, still in cache
                    second.out[job] = second.ctor(data).hexdigest()  # type: ignore[union-attr]
                    twice += len(data)
        finally:
            if leased is not None:
                leased.drop(kept, b.hi)
            self.track.note(twice)

    def _limits(self, segments: Sequence[Segment]) -> dict[Path, int]:
        """Where each file's reads for this job end (a window never reads past it)."""
        limit: dict[Path, int] = {}
        for path, start, end in segments:
            size = self.files[path].size
            if end > size:
                raise InputError(f"{path}: payload [{start}, {end}) beyond {size} bytes")
            limit[path] = max(limit.get(path, 0), end)
        return limit

    def run(
        self, unit: _Job | _Batch, large: dict[int, tuple[Segment, ...]], digests: list[Any]
    ) -> list[int]:
        """Hash one unit into `digests` (and the second algorithm's `out`); its job indices."""
        if type(unit) is _Batch:
            self.batch(unit, digests)
            return [k & _JOB_MASK for k in unit.jobs]
        i = unit.index  # type: ignore[union-attr]
        second = self.second
        both = second is not None and bool(second.wanted[i])
        digests[i], again = self.job(large[i], unit.threads, both)  # type: ignore[union-attr]
        if both:
            second.out[i] = again  # type: ignore[union-attr]
        return [i]

    def job(
        self, segments: Sequence[Segment], hasher_threads: int, both: bool = False
    ) -> tuple[str, str | None]:
        """Segments hashed in order through one window per file: rank slices interleave rows
        of several files, and each file is read one window at a time, not row by row. A
        leased file's window is a range of its mapping; its lease is checked when the window
        moves and again after every MAP_WINDOW bytes the job hashed since. Returns the digest
        and, when `both`, that of the pool's second algorithm over the same bytes."""
        limit = self._limits(segments)
        size = READ if hasher_threads == 1 else MT_READ
        span = MAP_WINDOW if hasher_threads == 1 else MT_READ
        h = new_hasher(self.algo, hasher_threads)
        h2 = new_hasher(self.second.algo) if both and self.second is not None else None
        bufs: dict[Path, bytearray] = {}
        wins: dict[Path, tuple[int, int, memoryview, int]] = {}  # lo, hi, view, checked at
        done = 0  # bytes this job hashed so far
        try:
            for path, start, end in segments:
                f = self.files[path]
                pos = start
                while pos < end:
                    lo, hi, view, checked = wins.get(path, _NO_WINDOW)
                    if not lo <= pos < hi:
                        if self.stop:
                            raise _Stopped
                        if type(f) is _Leased:
                            view.release()
                            f.drop(lo, hi)  # the previous window's pages
                            lo, hi = pos, min(limit[path], pos + span)
                            f.check()
                            view = f.whole()[lo:hi]
                        else:
                            lo, hi = pos, min(limit[path], pos + size)
                            buf = bufs.get(path) or bufs.setdefault(path, self._buffer(size))
                            view = f.read_into(memoryview(buf)[: hi - lo], lo)
                        checked = done
                        wins[path] = (lo, hi, view, checked)
                    elif type(f) is _Leased and done - checked >= MAP_WINDOW:
                        f.check()
                        wins[path] = (lo, hi, view, done)
                    take = min(end, hi)
                    h.update(view[pos - lo : take - lo])
                    if h2 is not None:
                        h2.update(view[pos - lo : take - lo])
                    self.track.note((take - pos) * (1 if h2 is None else 2))
                    done += take - pos
                    pos = take
        finally:
            for path, (lo, hi, view, _) in wins.items():
                view.release()
                f = self.files[path]
                if type(f) is _Leased:
                    f.drop(lo, hi)
            wins.clear()
            if size == READ:
                self._free += bufs.values()
        return h.hexdigest(), None if h2 is None else h2.hexdigest()


_NO_WINDOW: tuple[int, int, memoryview, int] = (0, 0, memoryview(b""), 0)


class _Second(NamedTuple):
    """A second algorithm over some jobs' bytes, hashed from the same reads."""

    algo: str
    ctor: Any
    wanted: bytearray  # 1 at the index of each job it covers
    out: list[Any]  # its digests by job index


def hash_segments(
    jobs: Iterable[tuple[K, Sequence[Segment]]],
    algo: str = "sha256",
    threads: int | None = None,
    progress: Progress | None = None,
    expected: dict[Path, FileStamp] | None = None,
    known: Known | None = None,
) -> dict[K, str]:
    """Hex digest per job of the concatenation of its segments, jobs hashed in parallel.

    Small one-segment jobs of a file are read together (one pread per READ bytes or one
    range of a leased file's mapping per batch, then one hasher per slice); a blake3 job larger than
    half its fair share of the work gets a hasher
    with `threads` threads of its own. `expected`: the stamp each file had when its header was
    read; a file that differs at open, or whose open file or path differs after hashing, is
    InputChanged. `known`: digests hashed ahead, taken for one-segment jobs of files with their
    `expected` stamp (those jobs are not read again).
    """
    return _hash(jobs, algo, threads, progress, expected, known=known)[0]


def hash_segments_twice(
    jobs: Iterable[tuple[K, Sequence[Segment]]],
    algo: str,
    second: str,
    also: AbstractSet[K],
    threads: int | None = None,
    progress: Progress | None = None,
    expected: dict[Path, FileStamp] | None = None,
    known: Known | None = None,
) -> tuple[dict[K, str], dict[K, str]]:
    """`hash_segments` with `algo`, and `second`'s digests of the jobs keyed in `also` from the
    same reads (each tensor's bytes hashed again while they are in the core's cache, not read
    in a second pass). A progress bar advances by the bytes of both."""
    check_algo(second)
    return _hash(jobs, algo, threads, progress, expected, (second, also), known)


def _hash(
    jobs: Iterable[tuple[K, Sequence[Segment]]],
    algo: str,
    threads: int | None,
    progress: Progress | None,
    expected: dict[Path, FileStamp] | None,
    also: tuple[str, AbstractSet[K]] | None = None,
    known: Known | None = None,
) -> tuple[dict[K, str], dict[K, str]]:
    ctor = _constructor(algo)
    threads = max(1, threads or default_threads())
    prog = progress or NO_PROGRESS
    plan = _plan(jobs, algo, threads)
    second = None
    if also is not None:
        wanted = bytearray(map(also[1].__contains__, plan.keys))
        second = _Second(also[0], _constructor(also[0]), wanted, [None] * len(plan.keys))
    files = _open_all(plan.paths, expected)
    digests: list[Any] = [None] * len(plan.keys)
    errors: list[BaseException] = []
    units: list[_Job | _Batch] = []
    queue = iter(units)
    lock = threading.Lock()

    def worker() -> None:
        w = _Worker(files, ctor, algo, _Tracker(prog), errors, _drop_span(threads), second)
        while not errors:
            with lock:
                unit = next(queue, None)
            if unit is None:
                break
            try:
                w.run(unit, plan.large, digests)
            except BaseException as exc:  # re-raised in the caller's thread
                errors.append(exc)
                break
        w.track.flush()

    try:
        if known is not None and expected:
            # No waiting for the workers when the rest is read once for both algorithms, or
            # when most bytes are not in one-segment jobs that could take a digest hashed ahead
            # (a rank-sliced artifact's logical tensors, a dense model's large weights): what
            # they sent by now is taken, the engine hashes everything else.
            if second is not None or plan.small_bytes < plan.large_bytes:
                known.stop()
            prog.advance(_take_known(plan, known, expected, digests, second))
        _lease_all(files)
        alone, batches = _batches(plan.small, files, plan.large)
        units += plan.units + alone + batches
        if _forking(threads, units, plan.large):
            _run_forked(units, plan.large, files, ctor, algo, prog, threads, digests, second)
        else:
            # an interrupt: each worker stops at its next window, then it is raised
            stop = partial(errors.append, _Stopped())
            run_threads([worker] * max(1, min(threads, len(units))), "exl3hash", stop)
        if errors:
            raise errors[0]
        for f in files.values():  # the stability proof: nothing changed while it was hashed
            f.verify_unchanged()
    finally:
        _close_all(files)
    out = dict(zip(plan.keys, digests, strict=True))
    if second is None:
        return out, {}
    flags = second.wanted
    return out, dict(zip(compress(plan.keys, flags), compress(second.out, flags), strict=True))


def _take_known(
    plan: _Plan,
    known: Known,
    expected: dict[Path, FileStamp],
    digests: list[Any],
    second: _Second | None,
) -> int:
    """Fill the digests `known` holds for the small jobs of files with their `expected` stamp
    and drop those jobs from the plan (one `second` wants stays: only its second digest is
    then hashed). Returns the bytes no longer to hash."""
    wanted = second.wanted if second is not None else None
    saved = 0
    for path, packed in plan.small.items():
        stamp = expected.get(path)
        table = known.lookup(path, stamp) if stamp is not None else None
        if not table:
            continue
        keep: list[int] = []
        for k in packed:
            digest = table.get(k >> _SIZE_SHIFT)
            if digest is None:
                keep.append(k)
                continue
            job = k & _JOB_MASK
            digests[job] = digest
            if wanted is not None and wanted[job]:
                keep.append(k)
            else:
                saved += (k >> _SIZE_SHIFT) & _SIZE_MASK
        packed[:] = keep
    return saved


def hash_spans(
    path: Path,
    spans: Sequence[tuple[int, int]],
    algo: str,
    workers: int = 1,
    mapped: bool = True,
) -> tuple[FileStamp, list[str]]:
    """The digest of each span [start, end) of one file (each under 16 MiB), read as a worker
    of a pool of `workers` in `hash_segments` reads it (`mapped` False: with pread), and the
    file's stamp, verified unchanged after hashing."""
    ctor = _constructor(algo)
    packed = [(s << _START_SHIFT) | ((e - s) << _SIZE_SHIFT) | j for j, (s, e) in enumerate(spans)]
    files = _open_all([path])
    try:
        if mapped:
            _lease_all(files)
        large: dict[int, tuple[Segment, ...]] = {}
        alone, batches = _batches({path: packed}, files, large)
        out: list[Any] = [None] * len(spans)
        w = _Worker(files, ctor, algo, _Tracker(NO_PROGRESS), [], _drop_span(workers))
        for unit in [*alone, *batches]:
            w.run(unit, large, out)
        f = files[path]
        f.verify_unchanged()
        return f.stamp, out
    finally:
        _close_all(files)


def _unit_bytes(unit: _Job | _Batch, large: dict[int, tuple[Segment, ...]]) -> int:
    if type(unit) is _Batch:
        return unit.hi - unit.lo
    return sum(end - start for _, start, end in large[unit.index])  # type: ignore[union-attr]


def fork_unsafe() -> bool:
    """A process that holds torch (its thread pools and CUDA state do not survive a fork) or
    more than FORK_MAX_RSS (each fork copies its page tables, and what it writes while the
    workers live is copied) hashes with threads."""
    return "torch" in sys.modules or forkpool.resident_bytes() > FORK_MAX_RSS


def _forking(
    threads: int, units: Sequence[_Job | _Batch], large: dict[int, tuple[Segment, ...]]
) -> bool:
    """Whether this pool's one-thread units go to forked workers (see FORK_MIN_*)."""
    if threads < FORK_MIN_THREADS or os.environ.get("EXL3TOOL_NO_FORK") or not forkpool.available():
        return False
    if fork_unsafe():
        return False
    # each fork copies the parent's page tables: a large parent needs more bytes to pay for them
    need = max(FORK_MIN_BYTES, FORK_BYTES_PER_RSS * threads * forkpool.resident_bytes())
    todo = 0
    for u in units:
        if type(u) is _Batch or u.threads == 1:
            todo += _unit_bytes(u, large)
            if todo >= need:
                return True
    return False


def _run_forked(
    units: Sequence[_Job | _Batch],
    large: dict[int, tuple[Segment, ...]],
    files: dict[Path, _File],
    ctor: Any,
    algo: str,
    prog: Any,
    threads: int,
    digests: list[Any],
    second: _Second | None,
) -> None:
    """Every one-thread unit hashed by `threads` forked workers (io/forkpool) while this
    process hashes the jobs of a multi-threaded blake3 hasher itself (a forked worker has no
    hasher threads: blake3's pool does not survive a fork)."""
    forked = [u for u in units if type(u) is _Batch or u.threads == 1]

    def start(progress: Any) -> Any:  # in each worker
        w = _Worker(files, ctor, algo, _Tracker(progress), [], _drop_span(threads), second)

        def work(unit: _Job | _Batch) -> tuple[list[int], list[Any], list[Any] | None]:
            jobs = w.run(unit, large, digests)
            w.track.flush()
            also = None if second is None else [second.out[j] for j in jobs]
            return jobs, [digests[j] for j in jobs], also

        return work

    def accept(result: tuple[list[int], list[Any], list[Any] | None]) -> None:  # in this one
        jobs, hexes, also = result
        for j, h in zip(jobs, hexes, strict=True):
            digests[j] = h
        if also is not None and second is not None:
            for j, h in zip(jobs, also, strict=True):
                if h is not None:
                    second.out[j] = h

    pool = forkpool.ForkPool(threads, forked, start, accept, prog) if forked else None
    try:
        w = _Worker(files, ctor, algo, _Tracker(prog), [], _drop_span(threads), second)
        for u in units:
            if type(u) is _Job and u.threads > 1:
                w.run(u, large, digests)
        w.track.flush()
        if pool is not None:
            pool.wait()
    finally:
        if pool is not None:
            pool.close()


def hash_tensors(
    items: Iterable[tuple[K, SafetensorsFile, TensorInfo]],
    algo: str = "sha256",
    threads: int | None = None,
    progress: Progress | None = None,
) -> dict[K, str]:
    """Hex digest of each tensor's raw payload bytes (the safetensors data span, no header)."""
    expected: dict[Path, FileStamp] = {}

    def jobs() -> Iterator[tuple[K, tuple[Segment]]]:
        for key, st, info in items:
            expected.setdefault(st.path, st.stamp)
            yield key, (tensor_segment(st, info),)

    return hash_segments(jobs(), algo, threads, progress, expected)


def hash_files(
    paths: Iterable[Path],
    algo: str = "sha256",
    threads: int | None = None,
    progress: Progress | None = None,
    expected: dict[Path, FileStamp] | None = None,
) -> dict[Path, str]:
    """Hex digest of each whole file (as `sha256sum` / `b3sum` print it). `expected`: stamps
    taken when the files were first opened (a file replaced since is InputChanged)."""
    jobs = []
    for p in paths:
        p = Path(p)
        try:
            size = os.stat(p).st_size
        except OSError as exc:
            raise InputError(f"{p}: {exc.strerror or exc}") from exc
        jobs.append((p, (Segment(p, 0, size),)))
    return hash_segments(jobs, algo, threads, progress, expected)


def shard_stamps(shards: Iterable[SafetensorsFile]) -> dict[Path, FileStamp]:
    """The stamp of each shard when its header was read (for `expected`)."""
    return {st.path: st.stamp for st in shards}
