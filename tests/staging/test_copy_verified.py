"""The verified copy (staging/stage.py `_copy_one`): a refused shard stops the copies as soon as
its sha256 is known, with the findings of a full copy; a good copy is the bytes that were hashed."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from exl3tool.formats import msrt_spec as spec
from exl3tool.formats.cartridge import load_cartridge
from exl3tool.identity.engine import new_hasher
from exl3tool.rules.registry import Findings
from exl3tool.staging import stage
from exl3tool.staging.stage import StageError, copy_verified, stage_cartridge
from exl3tool.synth.msrt import build_adapter, build_base


@pytest.fixture()
def pair(tmp_path: Path) -> tuple[Path, Path]:
    base = build_base(tmp_path / "base")
    return base, build_adapter(tmp_path / "cart", base)


def _flip_payload_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[8 + int.from_bytes(data[:8], "little")] ^= 0x01
    path.write_bytes(bytes(data))


def _shards(cart: Path) -> list[str]:
    m = json.loads((cart / spec.ADAPTER_CONFIG).read_text())
    return [sh["path"] for sh in m["shards"]]


def test_a_corrupted_shard_stops_its_copy_once_hashed(pair, tmp_path, monkeypatch) -> None:
    _, cart = pair
    first = _shards(cart)[0]
    _flip_payload_byte(cart / first)
    monkeypatch.setattr(stage, "CHUNK", 4096)  # many chunks per shard
    calls: list[int] = []

    def hook(path: str, done: int) -> None:  # the first chunk is handed on: let the hash end
        calls.append(done)
        for t in threading.enumerate():
            if t.name == "exl3tool-stage-hash":
                t.join()

    monkeypatch.setattr(stage, "copy_hook", hook)
    findings = Findings()
    src = load_cartridge(cart, Findings())
    copy_verified(src, tmp_path / "dest", findings, threads=1)
    bad = [f for f in findings if f.rule.code == "CA005"]
    assert [f.location.file for f in bad] == [first]
    assert bad[0].message.startswith("sha256 does not match adapter_config.json (")
    assert [f.rule.code for f in findings.errors()] == ["CA005"]
    # the copy stopped after at most the chunk it had handed on (none when the hash ended
    # first); the later shards were hashed, not copied
    assert calls in ([], [4096])
    assert (tmp_path / "dest" / first).stat().st_size <= 4096


def test_every_refused_shard_is_a_finding(pair, tmp_path) -> None:
    base, cart = pair
    m = json.loads((cart / spec.ADAPTER_CONFIG).read_text())
    for sh in m["shards"]:
        sh["sha256"] = "0" * 64
    (cart / spec.ADAPTER_CONFIG).write_text(json.dumps(m))
    out = tmp_path / "out"
    with pytest.raises(StageError, match="copy verification failed") as exc:
        stage_cartridge(cart, base, out=out, threads=1)
    hit = [f.location.file for f in exc.value.findings if f.rule.code == "CA005"]
    assert hit == [sh["path"] for sh in m["shards"]]
    assert not out.exists()


def test_bytes_read_by_the_copy_must_be_the_hashed_ones(pair, tmp_path, monkeypatch) -> None:
    # a source that changes between the hash-ahead's read and the copy's read, without a new
    # stamp (which ST023 also catches): the blake3 of the written bytes differs
    base, cart = pair
    real = stage._pread_into

    def pread(fd: int, view: memoryview, offset: int) -> int:
        n = real(fd, view, offset)
        if offset == 0 and threading.current_thread().name != "exl3tool-stage-hash":
            view[8] ^= 0x01  # in the safetensors header length: any byte will do
        return n

    monkeypatch.setattr(stage, "_pread_into", pread)
    out = tmp_path / "out"
    with pytest.raises(StageError) as exc:
        stage_cartridge(cart, base, out=out, threads=1)
    assert "ST023" in exc.value.findings.codes()
    assert "CA005" not in exc.value.findings.codes()
    assert not out.exists()


@pytest.mark.parametrize("writers", [1, 3])
def test_a_good_copy_is_the_source(pair, tmp_path, monkeypatch, writers) -> None:
    _, cart = pair
    monkeypatch.setattr(stage, "CHUNK", 4096)
    monkeypatch.setattr(stage, "_WRITERS", writers)
    findings = Findings()
    src = load_cartridge(cart, Findings())
    copied = copy_verified(src, tmp_path / "dest", findings, threads=2)
    assert not findings.has_errors()
    for cf in copied:
        data = (cart / cf.path).read_bytes()
        assert (tmp_path / "dest" / cf.path).read_bytes() == data
        b3 = new_hasher("blake3")
        b3.update(data)
        assert (cf.size, cf.blake3) == (len(data), b3.hexdigest())
