"""The hashing engine: digests equal hashlib/blake3 of the raw bytes, whatever the threads."""

from __future__ import annotations

import hashlib
import sys
import threading
from pathlib import Path

import blake3
import numpy as np
import pytest
from identity_fixtures import force_fork, write_shard

from exl3tool.identity import engine
from exl3tool.identity.engine import (
    Segment,
    hash_files,
    hash_segments,
    hash_segments_twice,
    hash_tensors,
    new_hasher,
)
from exl3tool.io.safetensors import read_header
from exl3tool.rules.errors import UsageError
from exl3tool.rules.registry import Findings

REF = {
    "sha256": lambda b: hashlib.sha256(b).hexdigest(),
    "blake3": lambda b: blake3.blake3(b).hexdigest(),
}


class Counter:
    def __init__(self) -> None:
        self.n = 0
        self._lock = threading.Lock()

    def advance(self, n: int = 1) -> None:
        with self._lock:
            self.n += n


@pytest.fixture
def shard(tmp_path: Path) -> Path:
    rng = np.random.default_rng(1)
    tensors = {f"t{i}": rng.integers(0, 255, int(n), dtype=np.uint8) for i, n in
               enumerate(rng.integers(0, 300_000, 12))}  # fmt: skip
    tensors["empty"] = np.zeros(0, np.uint8)
    write_shard(tmp_path / "a.safetensors", tensors)
    return tmp_path / "a.safetensors"


@pytest.mark.parametrize("algo", ["sha256", "blake3"])
@pytest.mark.parametrize("threads", [1, 2, 5])
def test_tensors_match_reference(
    shard: Path, algo: str, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # tiny reads and a tiny multi-thread threshold exercise every path on small data
    monkeypatch.setattr(engine, "READ", 4096)
    monkeypatch.setattr(engine, "SMALL", 2048)
    monkeypatch.setattr(engine, "MT_READ", 65536)
    monkeypatch.setattr(engine, "MT_MIN", 1024)
    monkeypatch.setattr(engine, "DROP_EVERY", 8192)
    st = read_header(shard, Findings())
    assert st is not None
    raw = shard.read_bytes()
    counter = Counter()
    got = hash_tensors(
        ((n, st, t) for n, t in st.tensors.items()), algo, threads=threads, progress=counter
    )
    want = {n: REF[algo](raw[slice(*st.span(n))]) for n in st.tensors}
    assert got == want
    assert list(got) == list(st.tensors)  # input order kept
    assert counter.n == sum(t.nbytes for t in st.tensors.values())


@pytest.mark.parametrize("algo", ["sha256", "blake3"])
@pytest.mark.parametrize("read", [64, 4096, 1 << 20])
def test_interleaved_segments_of_several_files(
    tmp_path: Path, algo: str, read: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank-sliced rows: segments alternate between files, windows refill in any order, and
    small jobs of two files share no batch."""
    monkeypatch.setattr(engine, "READ", read)
    monkeypatch.setattr(engine, "SMALL", read // 2)
    rng = np.random.default_rng(7)
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(rng.bytes(50_000))
    b.write_bytes(rng.bytes(30_000))
    rows = [Segment(p, o, o + 900) for o in range(0, 27_000, 900) for p in (a, b)]
    jobs = [("rows", rows), ("back", [Segment(a, 40_000, 41_000), Segment(a, 100, 200)])]
    jobs += [(f"s{i}", [Segment((a, b)[i % 2], i * 37, i * 37 + i % 50)]) for i in range(400)]
    raw = {a: a.read_bytes(), b: b.read_bytes()}
    want = {k: REF[algo](b"".join(raw[p][s:e] for p, s, e in segs)) for k, segs in jobs}
    assert hash_segments(jobs, algo, threads=3) == want


@pytest.mark.parametrize("lease", [True, False])
@pytest.mark.parametrize("threads", [1, 3, "3 forked"])
def test_a_second_algorithm_from_the_same_reads(
    tmp_path: Path, shard: Path, lease: bool, threads: int | str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """blake3 of every job and sha256 of the chosen ones: batched small tensors, a large one,
    several segments, a multi-threaded blake3 job (this process's own when the rest is hashed
    by forked workers); the same digests as two passes, only the chosen keys in the second,
    and progress counts the bytes of both."""
    forked = force_fork(monkeypatch) if threads == "3 forked" else None
    if forked is None:
        monkeypatch.setenv("EXL3TOOL_NO_FORK", "1")
    threads = 3 if forked is not None else int(threads)
    monkeypatch.setattr(engine, "READ", 4096)
    monkeypatch.setattr(engine, "SMALL", 2048)
    monkeypatch.setattr(engine, "MT_READ", 65536)
    monkeypatch.setattr(engine, "MT_MIN", 1024)
    monkeypatch.setattr(engine, "MAP_BATCH", 16384)
    if not lease:
        monkeypatch.setenv("EXL3TOOL_NO_LEASE", "1")
    rng = np.random.default_rng(3)
    sizes = [*rng.integers(0, 3000, 40), 0, 60_000, 150_000, 250_000]
    path = tmp_path / "mix.safetensors"
    write_shard(path, {f"t{i}": rng.integers(0, 255, int(n), dtype=np.uint8)
                       for i, n in enumerate(sizes)})  # fmt: skip
    st = read_header(path, Findings())
    assert st is not None
    jobs: list[tuple[object, list[Segment]]] = [
        (n, [Segment(path, *st.span(n))]) for n in st.tensors
    ]
    jobs.append((("two", 0), [Segment(path, 100, 5000), Segment(shard, 7, 9)]))
    chosen = {k for i, (k, _) in enumerate(jobs) if i % 3 != 1}
    counter = Counter()
    first, second = hash_segments_twice(
        jobs, "blake3", "sha256", chosen, threads=threads, progress=counter
    )
    assert first == hash_segments(jobs, "blake3", threads=threads)
    want = hash_segments([j for j in jobs if j[0] in chosen], "sha256", threads=threads)
    assert second == want and set(second) == chosen
    size = {k: sum(s.nbytes for s in segs) for k, segs in jobs}
    assert counter.n == sum(size.values()) + sum(size[k] for k in chosen)
    assert forked is None or (forked and min(forked) >= 1), forked


def test_a_second_algorithm_is_checked(shard: Path) -> None:
    with pytest.raises(UsageError):
        hash_segments_twice([("x", [Segment(shard, 0, 8)])], "blake3", "md5", {"x"})


@pytest.mark.parametrize("algo", ["sha256", "blake3"])
def test_segments_concatenate(shard: Path, algo: str) -> None:
    raw = shard.read_bytes()
    segs = [Segment(shard, 100, 5000), Segment(shard, 7, 9), Segment(shard, 4000, 4000)]
    got = hash_segments([("x", segs)], algo)
    assert got == {"x": REF[algo](raw[100:5000] + raw[7:9])}


@pytest.mark.parametrize("algo", ["sha256", "blake3"])
def test_files(tmp_path: Path, shard: Path, algo: str) -> None:
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    got = hash_files([shard, empty], algo, threads=2)
    assert got == {shard: REF[algo](shard.read_bytes()), empty: REF[algo](b"")}


def test_unknown_algo() -> None:
    with pytest.raises(UsageError):
        new_hasher("md5")


def test_truncated_file_is_input_error(tmp_path: Path) -> None:
    from exl3tool.rules.errors import InputError

    p = tmp_path / "f"
    p.write_bytes(b"abc")
    with pytest.raises(InputError):
        hash_segments([("x", [Segment(p, 0, 10)])])


def test_when_the_engine_forks_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """From FORK_MIN_THREADS threads and FORK_MIN_BYTES of one-thread units (and at least the
    parent's resident size per worker), on Linux; never under EXL3TOOL_NO_FORK, in a process
    holding torch, or one larger than FORK_MAX_RSS."""
    from exl3tool.io import forkpool

    monkeypatch.delenv("EXL3TOOL_NO_FORK", raising=False)
    monkeypatch.setattr(engine, "FORK_MIN_BYTES", 100)
    monkeypatch.setattr(forkpool, "available", lambda: True)
    monkeypatch.setattr(forkpool, "resident_bytes", lambda: 10)  # bytes: 4 workers need 40
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # other tests may have loaded it
    p = Path("f")
    large = {0: (Segment(p, 0, 60),), 1: (Segment(p, 0, 60),)}
    one, multi = engine._Job(0, 1), engine._Job(1, 8)
    batch = engine._Batch(p, 0, 50, [])
    n = engine.FORK_MIN_THREADS
    assert engine._forking(n, [one, batch], large)
    assert not engine._forking(n - 1, [one, batch], large)
    assert not engine._forking(n, [one], large)  # 60 bytes < FORK_MIN_BYTES
    assert not engine._forking(n, [multi, batch], large)  # the multi-threaded job stays here
    monkeypatch.setenv("EXL3TOOL_NO_FORK", "1")
    assert not engine._forking(n, [one, batch], large)
    monkeypatch.delenv("EXL3TOOL_NO_FORK")
    monkeypatch.setitem(sys.modules, "torch", object())
    assert not engine._forking(n, [one, batch], large)
    monkeypatch.delitem(sys.modules, "torch")
    assert engine._forking(n, [one, batch], large)
    monkeypatch.setattr(forkpool, "resident_bytes", lambda: 1000)  # 4 workers need 4000 bytes
    assert not engine._forking(n, [one, batch], large)  # a parent too large for 110 bytes
    monkeypatch.setattr(forkpool, "resident_bytes", lambda: engine.FORK_MAX_RSS + 1)
    assert not engine._forking(n, [one, batch], large)
