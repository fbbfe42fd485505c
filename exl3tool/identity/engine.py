"""The project's one hashing engine: tensor payloads and whole files, read with pread.

msrt-cartridge-format.md §11.1: hashlib and blake3 release the GIL for large buffers, so a pool
of one-hasher-per-tensor workers scales with cores; a blake3 hasher is never shared between
threads. Tensors too large to balance across the pool get a multi-threaded blake3 hasher.
Each worker reads into one reusable buffer (no mmap: a file truncated under a mapping kills the
process with SIGBUS), so resident memory stays near `threads x CHUNK` whatever the checkpoint
size. Every file is stamped at open and verified unchanged after hashing (issue 15): a file that
shrank, changed or was replaced by a rename is `InputChanged` (exit 3), never a digest.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Hashable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol, TypeVar

from exl3tool.io.safetensors import FileStamp, SafetensorsFile, TensorInfo
from exl3tool.io.views import InputChanged, PayloadFile
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


def _open_all(
    paths: Iterable[Path], expected: dict[Path, FileStamp] | None = None
) -> dict[Path, PayloadFile]:
    files: dict[Path, PayloadFile] = {}
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


def _close_all(files: dict[Path, PayloadFile]) -> None:
    for f in files.values():
        f.close()


class _Tracker:
    """One worker's bookkeeping: its reusable read buffer, and progress batched every
    DROP_EVERY bytes."""

    def __init__(self, progress: Any) -> None:
        self._progress = progress
        self._pending = 0
        self._buf: memoryview | None = None

    def buffer(self, n: int) -> memoryview:
        if self._buf is None or len(self._buf) < n:
            self._buf = memoryview(bytearray(max(n, CHUNK)))
        return self._buf[:n]

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
        return hashlib.sha256
    import blake3

    return blake3.blake3


def _hash_job(
    segments: Sequence[Segment],
    algo: str,
    hasher_threads: int,
    files: dict[Path, PayloadFile],
    track: _Tracker,
    ctor: Any = None,
) -> str:
    for seg in segments:
        f = files[seg.path]
        if seg.end > f.size:
            raise InputError(f"{seg.path}: payload [{seg.start}, {seg.end}) beyond {f.size} bytes")
    if hasher_threads == 1 and ctor is not None and len(segments) == 1:
        seg = segments[0]  # the common case: one tensor span, one update (GIL released)
        if seg.nbytes <= CHUNK:
            h = ctor(files[seg.path].read_into(track.buffer(seg.nbytes), seg.start))
            track.note(seg.nbytes)
            return h.hexdigest()
    h = new_hasher(algo, hasher_threads)
    chunk = MT_CHUNK if hasher_threads > 1 else CHUNK
    for seg in segments:
        f = files[seg.path]
        pos = seg.start
        while pos < seg.end:
            n = min(chunk, seg.end - pos)
            h.update(f.read_into(track.buffer(n), pos))
            track.note(n)
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
    expected: dict[Path, FileStamp] | None = None,
) -> dict[K, str]:
    """Hex digest per job of the concatenation of its segments, jobs hashed in parallel.

    A blake3 job larger than half its fair share of the work gets a hasher with `threads`
    threads of its own. `expected`: the stamp each file had when its header was read; a file
    that differs at open, or whose open file or path differs after hashing, is InputChanged.
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

    files = _open_all((seg.path for _, segs in items for seg in segs), expected)
    digests: dict[int, str] = {}
    errors: list[BaseException] = []
    queue = iter(units)
    lock = threading.Lock()

    def worker() -> None:
        track = _Tracker(prog)
        while not errors:
            with lock:
                unit = next(queue, None)
            if unit is None:
                break
            try:
                for i in unit:
                    digests[i] = _hash_job(items[i][1], algo, hasher_threads(i), files, track, ctor)
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
        for f in files.values():  # the stability proof: nothing changed while it was hashed
            f.verify_unchanged()
    finally:
        _close_all(files)
    return {items[i][0]: digests[i] for i in range(len(items))}


def hash_tensors(
    items: Iterable[tuple[K, SafetensorsFile, TensorInfo]],
    algo: str = "sha256",
    threads: int | None = None,
    progress: ProgressLike | None = None,
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
    progress: ProgressLike | None = None,
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
