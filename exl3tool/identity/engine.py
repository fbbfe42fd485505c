"""The project's one hashing engine: tensor payloads and whole files over zero-copy mmap views.

msrt-cartridge-format.md §11.1: hashlib and blake3 release the GIL for large buffers, so a pool
of one-hasher-per-tensor workers scales with cores; a blake3 hasher is never shared between
threads. Tensors too large to balance across the pool get a multi-threaded blake3 hasher.
Pages are dropped from this process's mapping after each chunk (MADV_DONTNEED; the page cache
keeps them), so resident memory stays near `threads x CHUNK` whatever the checkpoint size.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Hashable, Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol, TypeVar

from exl3tool.io.safetensors import SafetensorsFile, TensorInfo
from exl3tool.io.views import MappedFile
from exl3tool.rules.errors import InputError, UsageError

ALGORITHMS = ("blake3", "sha256")
K = TypeVar("K", bound=Hashable)

CHUNK = 8 << 20  # bytes per update for a one-thread hasher
MT_CHUNK = 64 << 20  # bytes per update for a multi-threaded blake3 hasher
MT_MIN = 32 << 20  # smallest job worth a multi-threaded blake3 hasher
DROP_EVERY = 32 << 20  # bytes a worker hashes between page drops and progress updates


class Hasher(Protocol):
    def update(self, data: Any, /) -> object: ...
    def hexdigest(self) -> str: ...


class ProgressLike(Protocol):
    def advance(self, n: int = 1) -> None: ...


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
        return hashlib.sha256()
    import blake3

    return blake3.blake3(max_threads=threads) if threads > 1 else blake3.blake3()


def tensor_segment(st: SafetensorsFile, info: TensorInfo) -> Segment:
    return Segment(st.path, st.data_start + info.begin, st.data_start + info.end)


def _map_all(paths: Iterable[Path]) -> dict[Path, MappedFile]:
    maps: dict[Path, MappedFile] = {}
    try:
        for p in paths:
            if p not in maps:
                maps[p] = MappedFile(p)
    except (OSError, ValueError) as exc:
        for m in maps.values():
            m.close()
        raise InputError(f"{p}: cannot map for hashing: {exc}") from exc
    return maps


class _Tracker:
    """One worker's bookkeeping: progress and page drops, batched every DROP_EVERY bytes
    (each madvise costs a TLB shootdown across the pool's threads, so never per tensor)."""

    def __init__(self, maps: dict[Path, MappedFile], progress: Any) -> None:
        self._maps = maps
        self._progress = progress
        self._pending = 0
        self._hull: dict[Path, tuple[int, int]] = {}

    def note(self, path: Path, lo: int, hi: int) -> None:
        old = self._hull.get(path)
        self._hull[path] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
        self._pending += hi - lo
        if self._pending >= DROP_EVERY:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            self._progress.advance(self._pending)
            self._pending = 0
        for p, (lo, hi) in self._hull.items():
            self._maps[p].release(lo, hi)
        self._hull.clear()


def _constructor(algo: str) -> Any:
    """The one-thread hasher factory of `algo` (resolved once, not per tensor)."""
    check_algo(algo)
    if algo == "sha256":
        return hashlib.sha256
    import blake3

    return blake3.blake3


def _hash_job(
    segments: Sequence[Segment],
    algo: str,
    hasher_threads: int,
    maps: dict[Path, MappedFile],
    track: _Tracker,
    ctor: Any = None,
) -> str:
    if hasher_threads == 1 and ctor is not None and len(segments) == 1:
        seg = segments[0]  # the common case: one tensor span, one update (GIL released)
        if seg.nbytes <= CHUNK:
            mf = maps[seg.path]
            if seg.end > mf.size:
                raise InputError(
                    f"{seg.path}: payload [{seg.start}, {seg.end}) beyond {mf.size} bytes"
                )
            with mf.buffer(seg.start, seg.end) as view:
                h = ctor(view)
            track.note(seg.path, seg.start, seg.end)
            return h.hexdigest()
    h = new_hasher(algo, hasher_threads)
    chunk = MT_CHUNK if hasher_threads > 1 else CHUNK
    for seg in segments:
        mf = maps[seg.path]
        if seg.end > mf.size:
            raise InputError(f"{seg.path}: payload [{seg.start}, {seg.end}) beyond {mf.size} bytes")
        pos = seg.start
        while pos < seg.end:
            n = min(chunk, seg.end - pos)
            with mf.buffer(pos, pos + n) as view:
                h.update(view)
            track.note(seg.path, pos, pos + n)
            pos += n
    return h.hexdigest()


class _NoProgress:
    def advance(self, n: int = 1) -> None:
        return None


def _units(order: list[int], sizes: dict[int, int], heavy: int) -> list[list[int]]:
    """Work units a worker takes at once: each heavy job alone, then runs of consecutive light
    jobs of about DROP_EVERY bytes (few queue round trips; each worker's pages stay compact)."""
    units: list[list[int]] = [[i] for i in order[:heavy]]
    cur: list[int] = []
    acc = 0
    for i in order[heavy:]:
        cur.append(i)
        acc += sizes[i]
        if acc >= DROP_EVERY:
            units.append(cur)
            cur, acc = [], 0
    if cur:
        units.append(cur)
    return units


def hash_segments(
    jobs: Iterable[tuple[K, Sequence[Segment]]],
    algo: str = "sha256",
    threads: int | None = None,
    progress: ProgressLike | None = None,
) -> dict[K, str]:
    """Hex digest per job of the concatenation of its segments, jobs hashed in parallel.

    A blake3 job larger than half its fair share of the work gets a hasher with `threads`
    threads of its own.
    """
    ctor = _constructor(algo)
    threads = max(1, threads or default_threads())
    prog = progress or _NoProgress()
    items = [(key, tuple(segs)) for key, segs in jobs]
    sizes = {i: sum(s.nbytes for s in segs) for i, (_, segs) in enumerate(items)}
    total = sum(sizes.values())
    fair = total / threads
    # Heavy jobs first, largest first (balance); the rest in file order, so that each worker's
    # batched page drops cover a compact range.
    heavy = sorted((i for i in sizes if sizes[i] > fair / 8), key=lambda i: -sizes[i])
    light = sorted(
        (i for i in sizes if sizes[i] <= fair / 8),
        key=lambda i: (str(items[i][1][0].path), items[i][1][0].start) if items[i][1] else ("", 0),
    )
    units = _units(heavy + light, sizes, len(heavy))

    def hasher_threads(i: int) -> int:
        big = algo == "blake3" and sizes[i] >= MT_MIN and sizes[i] > fair / 2
        return threads if big and threads > 1 else 1

    maps = _map_all(seg.path for _, segs in items for seg in segs)
    digests: dict[int, str] = {}
    errors: list[BaseException] = []
    queue = iter(units)
    lock = threading.Lock()

    def worker() -> None:
        track = _Tracker(maps, prog)
        while not errors:
            with lock:
                unit = next(queue, None)
            if unit is None:
                break
            try:
                for i in unit:
                    digests[i] = _hash_job(items[i][1], algo, hasher_threads(i), maps, track, ctor)
            except BaseException as exc:  # re-raised in the caller's thread
                errors.append(exc)
                break
        track.flush()

    try:
        n_workers = min(threads, len(units))
        if n_workers <= 1:
            worker()
        else:
            pool = [
                threading.Thread(target=worker, name=f"exl3hash-{w}", daemon=True)
                for w in range(n_workers)
            ]
            for t in pool:
                t.start()
            for t in pool:
                t.join()
        if errors:
            raise errors[0]
    finally:
        for m in maps.values():
            m.close()
    return {items[i][0]: digests[i] for i in range(len(items))}


def hash_tensors(
    items: Iterable[tuple[K, SafetensorsFile, TensorInfo]],
    algo: str = "sha256",
    threads: int | None = None,
    progress: ProgressLike | None = None,
) -> dict[K, str]:
    """Hex digest of each tensor's raw payload bytes (the safetensors data span, no header)."""
    return hash_segments(
        ((key, (tensor_segment(st, info),)) for key, st, info in items), algo, threads, progress
    )


def hash_files(
    paths: Iterable[Path],
    algo: str = "sha256",
    threads: int | None = None,
    progress: ProgressLike | None = None,
) -> dict[Path, str]:
    """Hex digest of each whole file (as `sha256sum` / `b3sum` print it)."""
    jobs = []
    for p in paths:
        p = Path(p)
        try:
            size = os.stat(p).st_size
        except OSError as exc:
            raise InputError(f"{p}: {exc.strerror or exc}") from exc
        jobs.append((p, (Segment(p, 0, size),)))
    return hash_segments(jobs, algo, threads, progress)
