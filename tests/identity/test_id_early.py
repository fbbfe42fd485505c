"""Tensors hashed ahead by forked workers (identity/early) while the headers are read."""

from __future__ import annotations

import json
import os
import signal
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from identity_fixtures import expert_tensors, rank_slice, write_checkpoint

from exl3tool.actions.identity import Options, run
from exl3tool.identity import early, engine
from exl3tool.identity.fast import compute_identity
from exl3tool.io import forkpool, views
from exl3tool.io.safetensors import FileStamp

pytestmark = pytest.mark.skipif(not forkpool.available(), reason="forked workers need Linux")


@pytest.fixture
def ahead(monkeypatch: pytest.MonkeyPatch) -> list[early.EarlyDigests]:
    """Hash ahead at any size, in 4 KiB chunks (several units per shard); the returned list
    gets every EarlyDigests started."""
    monkeypatch.setattr(early, "EARLY_MIN_BYTES", 0)
    monkeypatch.setattr(early, "CHUNK", 4096)
    monkeypatch.setattr(early, "TRIAL_BYTES", 1)  # each worker reads both ways, then either
    monkeypatch.setattr(views, "RACY_NS", 0)  # the shards are written just before
    monkeypatch.setattr(early, "AHEAD_ALGOS", ("blake3", "sha256"))  # both work; policy aside
    monkeypatch.setattr(engine, "fork_unsafe", lambda: False)  # pytest may hold torch
    for var in ("EXL3TOOL_NO_EARLY", "EXL3TOOL_NO_FORK"):
        monkeypatch.delenv(var, raising=False)
    started: list[early.EarlyDigests] = []
    real = early.start

    def spy(*args: Any, **kwargs: Any) -> Any:
        got = real(*args, **kwargs)
        if got is not None:
            started.append(got)
        return got

    monkeypatch.setattr(early, "start", spy)
    return started


def _identity(path: Path, **kw: Any) -> dict[str, Any]:
    result = run(Options(str(path), threads=2, **kw))
    assert result.identity is not None, result.findings
    return result.identity.to_json()


def _plain(path: Path, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> dict[str, Any]:
    with monkeypatch.context() as m:
        m.setenv("EXL3TOOL_NO_EARLY", "1")
        return _identity(path, **kw)


def _stamp(path: Path) -> FileStamp:
    return FileStamp.of(os.stat(path))


@pytest.mark.parametrize("algo", ["blake3", "sha256"])
@pytest.mark.parametrize("lease", [True, False])
def test_hashed_ahead_is_the_same_identity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ahead: list, algo: str, lease: bool
) -> None:
    if not lease:
        monkeypatch.setenv("EXL3TOOL_NO_LEASE", "1")
    ck = write_checkpoint(tmp_path / "ck", expert_tensors([0, 1, 2], 3, k=3), shards=3)
    got = _identity(ck, algo=algo, compat=False)
    assert len(ahead) == 1
    shard = ck / "model-00002-of-00003.safetensors"
    table = ahead[0].lookup(shard, _stamp(shard))
    assert table and len(table) > 10  # the shard's tensors were hashed ahead, and taken
    assert got == _plain(ck, monkeypatch, algo=algo, compat=False)


def test_the_compatibility_block_gets_its_sha256_from_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ahead: list
) -> None:
    """blake3 digests known ahead; the block's sha256 of the same tensors is still hashed."""
    ck = write_checkpoint(tmp_path / "ck", expert_tensors([0, 1], 2, k=3), shards=2)
    got = _identity(ck, compat=True)
    assert ahead and got.get("compatibility")
    assert got == _plain(ck, monkeypatch, compat=True)


def test_a_known_digest_is_taken_only_for_the_file_it_was_hashed_from(tmp_path: Path) -> None:
    """The engine takes a digest hashed ahead (it does not read that tensor again) for a file
    with the stamp its header was read with, and never for another state of it."""
    ck = write_checkpoint(tmp_path / "ck", {"a": np.arange(64, dtype=np.int32)})
    shard = next(ck.glob("*.safetensors"))
    true = compute_identity(None, plan=_plan(ck), algo="blake3", compat=False, threads=1)
    start = 8 + struct.unpack("<Q", shard.read_bytes()[:8])[0]
    key = engine.span_key(start, 256)
    stamp = _stamp(shard)
    other = FileStamp(stamp.dev, stamp.ino, stamp.size, stamp.mtime_ns + 1, stamp.ctime_ns)

    class KnownOf:  # what was hashed ahead of the file in `state`
        def __init__(self, state: FileStamp) -> None:
            self.state = state

        def lookup(self, p: Path, s: FileStamp) -> dict[int, str] | None:
            return {key: "f" * 64} if p == shard and s == self.state else None

        def stop(self) -> None:
            pass

    def digest(known: Any) -> str:
        return (
            compute_identity(
                None,
                plan=_plan(ck),
                algo="blake3",
                compat=False,
                known=known,
                stamps={shard: stamp},
            )
            .tensors["a"]
            .digest
        )

    assert digest(KnownOf(stamp)) == "f" * 64  # taken, not hashed again
    assert digest(KnownOf(other)) == true.tensors["a"].digest


def _plan(ck: Path) -> Any:
    from exl3tool.identity.artifact import open_artifact
    from exl3tool.identity.logical import build_plan

    return build_plan(open_artifact(ck)[0])


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def _after_hashing_ahead(monkeypatch: pytest.MonkeyPatch, change: Callable[[], None]) -> None:
    """Every tensor hashed ahead, then `change()`, before any header is read (the run without
    hashing ahead is left as it is)."""
    real = early.start

    def then_change(*args: Any, **kwargs: Any) -> Any:
        got = real(*args, **kwargs)
        if got is not None:
            got._finish()
            change()
        return got

    monkeypatch.setattr(early, "start", then_change)


def test_a_shard_rewritten_after_it_was_hashed_ahead_is_hashed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ahead: list
) -> None:
    ck = write_checkpoint(tmp_path / "ck", expert_tensors([0], 2, k=3, seed=1), shards=2)
    shard = ck / "model-00001-of-00002.safetensors"

    def rewrite() -> None:
        _flip_last_byte(shard)
        os.utime(shard, ns=(1, 1))  # same size, another mtime (not one a coarse clock shares)

    _after_hashing_ahead(monkeypatch, rewrite)
    got = _identity(ck, compat=False)
    assert ahead and ahead[0].lookup(shard, _stamp(shard)) is None
    assert got == _plain(ck, monkeypatch, compat=False)


def test_a_rewrite_that_keeps_size_and_mtime_is_hashed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ahead: list
) -> None:
    """The bytes hashed ahead were read before the header: a shard rewritten in between with
    its size and mtime kept (a copy that preserves times) differs only in its ctime, and that
    is enough for the engine to hash it again."""
    ck = write_checkpoint(tmp_path / "ck", expert_tensors([0], 2, k=3, seed=3), shards=2)
    shard = ck / "model-00001-of-00002.safetensors"

    def rewrite() -> None:
        before = os.stat(shard)
        _flip_last_byte(shard)
        os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))
        now = os.stat(shard)
        assert (now.st_size, now.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
        deadline = time.monotonic() + 3  # a coarse clock (1 s on some file systems): a tick later
        while now.st_ctime_ns == before.st_ctime_ns and time.monotonic() < deadline:
            time.sleep(0.05)
            os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))
            now = os.stat(shard)
        assert now.st_ctime_ns != before.st_ctime_ns

    _after_hashing_ahead(monkeypatch, rewrite)
    got = _identity(ck, compat=False)
    assert ahead and ahead[0].lookup(shard, _stamp(shard)) is None
    assert got == _plain(ck, monkeypatch, compat=False)


def test_a_shard_changed_just_before_it_was_read_is_left_to_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ahead: list
) -> None:
    """A file whose ctime is within RACY_NS of the read may change again within the same tick
    of the file system's clock, keeping its whole stamp: none of its digests are kept."""
    ck = write_checkpoint(tmp_path / "ck", expert_tensors([0, 1], 2, k=3, seed=4), shards=2)
    monkeypatch.setattr(views, "RACY_NS", 10**12)  # every shard counts as just changed
    got = _identity(ck, compat=False)
    assert ahead
    for shard in ck.glob("*.safetensors"):
        assert ahead[0].lookup(shard, _stamp(shard)) is None
    assert got == _plain(ck, monkeypatch, compat=False)


def test_sparse_or_huge_shards_are_not_cut_into_units(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ahead: list
) -> None:
    """Units are sized by the file: a stray shard truncated to 16 GiB (a few KB on disk)
    is left to the engine, and past MAX_UNITS nothing is hashed ahead (no unit list in
    proportion to an apparent size)."""
    ck = write_checkpoint(tmp_path / "ck", expert_tensors([0], 2, k=3, seed=5), shards=2)
    stray = ck / "stray.safetensors"
    with open(stray, "wb") as fh:
        fh.write(bytes(1 << 16))
        fh.truncate(1 << 34)  # 16 GiB apparent, 64 KiB allocated
    if os.stat(stray).st_blocks == 0:
        pytest.skip("this file system does not count allocated blocks")
    listed = {p for p, _ in early._shards(ck)}
    assert stray not in listed and len(listed) == 2
    monkeypatch.setattr(early, "MAX_UNITS", 3)  # 4 KiB units (the fixture): more than 3
    assert early.start(ck, "blake3", 2) is None


def test_a_worker_interrupted_before_its_handlers_are_set_stays_a_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Ctrl-C that reaches a worker right after the fork waits, blocked, until the worker
    ignores SIGINT: the worker never unwinds the parent's code, and the pool finishes."""
    real = os.fork

    def interrupted_fork() -> int:
        pid = real()
        if pid == 0:
            os.kill(os.getpid(), signal.SIGINT)  # before any handler of the worker's own
        return pid

    monkeypatch.setattr(os, "fork", interrupted_fork)
    got: list[int] = []
    pool = forkpool.ForkPool(2, list(range(20)), lambda _p: lambda u: u * u, got.append, None)
    try:
        pool.wait()
    finally:
        pool.close()
    assert sorted(got) == [u * u for u in range(20)]


def test_a_rank_sliced_artifact_does_not_wait_for_the_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ahead: list
) -> None:
    """Its logical tensors are jobs of several segments, which never take a digest hashed
    ahead: the engine stops the workers before it looks up what they sent, instead of waiting
    for all of them to hash what it then reads again."""
    full = expert_tensors([0, 1], 3, k=3, seed=6)
    ck = write_checkpoint(tmp_path / "ck", rank_slice(full, 2), shards=2)
    calls: list[str] = []
    real_stop, real_lookup = early.EarlyDigests.stop, early.EarlyDigests.lookup

    def stop(self: early.EarlyDigests) -> None:
        calls.append("stop")
        real_stop(self)

    def lookup(self: early.EarlyDigests, *args: Any) -> Any:
        calls.append("lookup")
        return real_lookup(self, *args)

    monkeypatch.setattr(early.EarlyDigests, "stop", stop)
    monkeypatch.setattr(early.EarlyDigests, "lookup", lookup)
    got = _identity(ck, compat=False)
    assert ahead and calls[0] == "stop" and "lookup" in calls
    assert got == _plain(ck, monkeypatch, compat=False)


def test_a_worker_killed_leaves_the_rest_to_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ahead: list
) -> None:
    ck = write_checkpoint(tmp_path / "ck", expert_tensors([0, 1], 3, k=3, seed=2), shards=3)
    victim = ck / "model-00002-of-00003.safetensors"
    real = engine.hash_spans

    def dies_on_victim(path: Path, *args: Any, **kwargs: Any) -> Any:
        if path == victim:
            os.kill(os.getpid(), signal.SIGKILL)  # in a forked worker
        return real(path, *args, **kwargs)

    monkeypatch.setattr(engine, "hash_spans", dies_on_victim)
    got = _identity(ck, compat=False)
    assert ahead[0].lookup(victim, _stamp(victim)) is None
    monkeypatch.setattr(engine, "hash_spans", real)
    assert got == _plain(ck, monkeypatch, compat=False)


@pytest.mark.parametrize(
    "header",
    [
        b"not json at all",
        b'{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
        b'"b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
        b'"c":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}',  # 12 bytes of spans in 8
        b'{"a":{"data_offsets":[0,99999999999999999999]}}',
        b'{"a":{"data_offsets":[4,2]},"b":{"data_offsets":[-1,2]}}',
    ],
)
def test_unusual_headers_leave_their_shard_to_the_engine(tmp_path: Path, header: bytes) -> None:
    path = tmp_path / "odd.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))
    assert early._spans(path) == ([], [])


def test_a_span_named_inside_a_string_costs_at_most_the_file(tmp_path: Path) -> None:
    """Offsets are found by pattern, not parsed: a name that looks like offsets only adds a
    span that no job asks for, and never more bytes than the file holds."""
    name = '"data_offsets":[0,4]'
    header = json.dumps({name: {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}}).encode()
    path = tmp_path / "named.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))
    _, spans = early._spans(path)
    base = 8 + len(header)
    assert (base + 4, base + 8) in spans
    assert sum(e - s for s, e in spans) <= 8


def test_nothing_is_started_where_it_cannot_pay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ahead: list
) -> None:
    ck = write_checkpoint(tmp_path / "ck", expert_tensors([0], 1), shards=1)
    assert early.start(ck, "blake3", 1) is None  # one thread
    monkeypatch.setattr(early, "AHEAD_ALGOS", ("blake3",))  # the default
    assert early.start(ck, "sha256", 2) is None  # sha256: the headers are too small a share
    monkeypatch.setattr(engine, "default_threads", lambda: early.MANY_CORES)
    many = early.start(ck, "sha256", early.MANY_CORES)  # unless many cores hash the rest
    try:
        assert many is not None
    finally:
        if many is not None:
            many.stop()
    monkeypatch.setattr(engine, "default_threads", lambda: early.MANY_CORES - 1)
    assert early.start(ck, "sha256", early.MANY_CORES) is None  # --threads asks for more
    monkeypatch.setenv("EXL3TOOL_NO_EARLY", "1")
    assert early.start(ck, "blake3", 2) is None
    monkeypatch.delenv("EXL3TOOL_NO_EARLY")
    monkeypatch.setattr(early, "EARLY_MIN_BYTES", 1 << 40)
    assert early.start(ck, "blake3", 2) is None  # too small to pay for the forks
    fifo = tmp_path / "pipe.safetensors"
    os.mkfifo(fifo)
    assert early._shards(tmp_path) == []  # no shard here: the FIFO is not read
    assert early._shards(fifo) == []


def test_a_layer_selection_hashes_nothing_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ahead: list
) -> None:
    ck = write_checkpoint(tmp_path / "ck", expert_tensors([0, 1], 1), shards=1)
    got = _identity(ck, layers="1", compat=False)
    assert not ahead
    assert got == _plain(ck, monkeypatch, layers="1", compat=False)


def test_no_more_digests_are_kept_than_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ahead: list
) -> None:
    """Beyond MAX_DIGESTS the workers are stopped and the engine hashes the rest."""
    monkeypatch.setattr(early, "MAX_DIGESTS", 20)
    ck = write_checkpoint(tmp_path / "ck", expert_tensors([0, 1, 2], 3, k=3), shards=3)
    got = _identity(ck, compat=False)
    kept = [ahead[0].lookup(p, _stamp(p)) or {} for p in sorted(ck.glob("*.safetensors"))]
    assert sum(map(len, kept)) <= 20
    assert got == _plain(ck, monkeypatch, compat=False)


def test_each_worker_tries_both_ways_of_reading_then_keeps_the_cheaper() -> None:
    cost: dict[bool, list] = {True: [0.0, 0], False: [0.0, 0]}
    assert early._faster(cost) is True  # mapped first
    cost[True] = [0.004, 8 << 20]
    assert early._faster(cost) is False  # then pread, until it has its share
    cost[False] = [0.003, 8 << 20]
    assert early._faster(cost) is False  # cheaper per byte
    cost[True] = [0.004, 16 << 20]
    assert early._faster(cost) is True
    assert early._faster({False: [0.0, 0]}) is False  # one way only (early.READS)
    assert early._faster({False: [1.0, 1 << 30]}) is False


def test_shards_linked_into_blobs_are_hashed_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ahead: list
) -> None:
    """A Hugging Face cache snapshot links each shard into ../../blobs: the digests hashed ahead
    are the blob's, and are taken for the linked name."""
    src = write_checkpoint(tmp_path / "src", expert_tensors([0, 1], 2, k=3, seed=4), shards=2)
    blobs, snap = tmp_path / "repo" / "blobs", tmp_path / "repo" / "snapshots" / "abc"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in src.iterdir():
        (blobs / f.name).write_bytes(f.read_bytes())
        (snap / f.name).symlink_to(Path("../..") / "blobs" / f.name)
    got = _identity(snap, compat=False)
    shard = snap / "model-00001-of-00002.safetensors"
    assert ahead and ahead[0].lookup(shard, _stamp(shard))
    assert got == _plain(src, monkeypatch, compat=False)
