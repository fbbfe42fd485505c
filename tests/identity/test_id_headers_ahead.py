"""Shard headers parsed ahead by forked workers (io/headers_ahead): the loader ends with the
same checkpoint and the same findings as when it reads every header itself."""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import pytest
from identity_fixtures import expert_tensors, write_checkpoint

from exl3tool.actions.identity import Options, run
from exl3tool.formats.checkpoint import list_safetensors, load_checkpoint
from exl3tool.identity import engine
from exl3tool.io import forkpool, headers_ahead, views
from exl3tool.rules.registry import Findings

pytestmark = pytest.mark.skipif(not forkpool.available(), reason="forked workers need Linux")


@pytest.fixture(autouse=True)
def _fresh_files_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(views, "RACY_NS", 0)  # the shards are written just before
    for var in ("EXL3TOOL_NO_AHEAD", "EXL3TOOL_NO_FORK"):
        monkeypatch.delenv(var, raising=False)


def _checkpoint(root: Path, shards: int = 4) -> Path:
    return write_checkpoint(root, expert_tensors([0, 1, 2, 3], 3, k=3), shards=shards)


def _load(root: Path, ahead: Any = None) -> tuple[Any, list[Any]]:
    findings = Findings()
    ckpt = load_checkpoint(root, findings, need_config=False, ahead=ahead)
    return ckpt, list(findings)


def _shape(ckpt: Any) -> dict[str, Any]:
    """Everything the loader keeps of each shard, compared field by field."""
    return {
        label: (st.path, st.label, st.file_size, st.header_len, st.stamp, st.metadata,
                st.invalid_entries, list(st.tensors.items()))
        for label, st in ckpt.shards.items()
    }  # fmt: skip


class _Counting:
    """`ahead.take`, counting the headers it delivered."""

    def __init__(self, ahead: headers_ahead.HeadersAhead) -> None:
        self.ahead, self.hits, self.misses = ahead, 0, 0

    def __call__(self, path: Path, label: str) -> Any:
        got = self.ahead.take(path, label)
        if got is None:
            self.misses += 1
        else:
            self.hits += 1
        return got


def _start(root: Path) -> headers_ahead.HeadersAhead:
    ahead = headers_ahead.start(root, list_safetensors(root), 4)
    assert ahead is not None
    return ahead


def _ahead_and_here(root: Path) -> tuple[_Counting, Any, Any]:
    """(the counted takes, (checkpoint, findings) loaded with headers read ahead, the same
    loaded without)."""
    ahead = _start(root)
    take = _Counting(ahead)
    try:
        got = _load(root, take)
    finally:
        ahead.stop()
    return take, got, _load(root)


def test_headers_read_ahead_are_the_loaders_own(tmp_path: Path) -> None:
    root = _checkpoint(tmp_path / "ck")
    take, (got, got_findings), (want, want_findings) = _ahead_and_here(root)
    assert take.hits == 4 and take.misses == 0  # every shard came from a worker
    assert _shape(got) == _shape(want)
    assert list(got.tensors) == list(want.tensors)
    assert got_findings == want_findings


def test_a_shard_rewritten_after_its_worker_read_it_is_read_again(tmp_path: Path) -> None:
    root = _checkpoint(tmp_path / "ck")
    shard = root / list_safetensors(root)[1]
    ahead = _start(root)
    try:
        ahead._waiter.join()  # every header parsed ahead
        with open(shard, "r+b") as fh:  # the same size, another header: a bad length
            fh.write(struct.pack("<Q", 1 << 60))
        take = _Counting(ahead)
        got, got_findings = _load(root, take)
    finally:
        ahead.stop()
    want, want_findings = _load(root)
    assert take.misses == 1 and take.hits == 3
    assert got_findings == want_findings and got_findings  # the new length's finding
    assert _shape(got) == _shape(want)


def test_a_shard_with_findings_is_left_to_the_loader(tmp_path: Path) -> None:
    root = _checkpoint(tmp_path / "ck")
    shard = root / list_safetensors(root)[2]
    raw = bytearray(shard.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    raw[8 : 8 + n] = raw[8 : 8 + n].replace(b'"dtype"', b'"dtyPe"', 1)  # an unknown field
    shard.write_bytes(bytes(raw))
    take, (got, got_findings), (want, want_findings) = _ahead_and_here(root)
    assert take.misses == 1 and take.hits == 3
    assert got_findings == want_findings and want_findings
    assert _shape(got) == _shape(want)


def test_a_fifo_posing_as_a_shard_does_not_hang_a_worker(tmp_path: Path) -> None:
    root = _checkpoint(tmp_path / "ck")
    fifo = root / "zz-pipe.safetensors"
    os.mkfifo(fifo)
    take, (got, got_findings), (want, want_findings) = _ahead_and_here(root)
    assert take.hits == 4
    assert got_findings == want_findings
    assert _shape(got) == _shape(want)


def test_a_worker_that_dies_leaves_its_shards_to_the_loader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _checkpoint(tmp_path / "ck")
    real = headers_ahead._read_clean

    def dies_on_the_third(path: Path) -> Any:
        if path.name == list_safetensors(root)[2]:
            os._exit(1)  # in the forked worker
        return real(path)

    monkeypatch.setattr(headers_ahead, "_read_clean", dies_on_the_third)
    take, (got, _), (want, _) = _ahead_and_here(root)
    assert take.misses >= 1
    assert _shape(got) == _shape(want)


def test_not_started_where_it_cannot_pay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _checkpoint(tmp_path / "ck")
    names = list_safetensors(root)
    assert headers_ahead.start(root, names, 2) is None  # under MIN_WORKERS
    assert headers_ahead.start(root, names[:1], 16) is None  # one shard
    monkeypatch.setenv("EXL3TOOL_NO_AHEAD", "1")
    assert headers_ahead.start(root, names, 16) is None


def test_identity_with_headers_ahead_is_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _checkpoint(tmp_path / "ck")
    monkeypatch.setattr(engine, "fork_unsafe", lambda: False)  # pytest may hold torch
    started: list[headers_ahead.HeadersAhead] = []
    real = headers_ahead.start

    def spy(*args: Any) -> Any:
        got = real(*args)
        if got is not None:
            started.append(got)
        return got

    monkeypatch.setattr(headers_ahead, "start", spy)
    got = run(Options(str(root), threads=4, compat=False))
    assert len(started) == 1
    monkeypatch.setenv("EXL3TOOL_NO_AHEAD", "1")
    want = run(Options(str(root), threads=4, compat=False))
    assert len(started) == 1
    assert got.identity is not None and want.identity is not None
    assert got.identity.to_json() == want.identity.to_json()
    assert list(got.findings) == list(want.findings)


def test_a_shard_asked_for_twice_is_read_by_the_loader_the_second_time(tmp_path: Path) -> None:
    """An index may name one shard twice (`./model-1.safetensors` and `model-1.safetensors`):
    the second take must not wait for a result already handed out."""
    root = _checkpoint(tmp_path / "ck")
    ahead = _start(root)
    try:
        shard = root / list_safetensors(root)[0]
        assert ahead.take(shard, shard.name) is not None
        assert ahead.take(shard, shard.name) is None  # at once, not after every worker ended
    finally:
        ahead.stop()
