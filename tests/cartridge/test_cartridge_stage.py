"""stage_cartridge: verified copy, validation against the base, TP conversion, atomic publication."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import jsonschema
import pytest

from exl3tool.checks.cartridge import check_cartridge
from exl3tool.checks.options import ValidateOptions
from exl3tool.formats import msrt_spec as spec
from exl3tool.rules.errors import OutputError
from exl3tool.rules.registry import Findings
from exl3tool.staging import stage
from exl3tool.staging.stage import StageError, stage_cartridge
from exl3tool.synth.msrt import build_base
from exl3tool.synth.msrt_edit import refresh_shards, rewrite_shard

SCHEMA = (
    Path(__file__).resolve().parents[2] / "exl3tool" / "schemas" / "exl3tool-staging-1.schema.json"
)


def tree(d: Path) -> dict[str, bytes]:
    return {
        p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()
    }


def siblings(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name != "src")


@pytest.fixture()
def src(msrt, tmp_path) -> Path:
    d = tmp_path / "src"
    shutil.copytree(msrt["full"], d)
    return d


def validate(out: Path, base: Path, tp: int) -> Findings:
    f = Findings()
    check_cartridge(out, f, ValidateOptions(base=base, tp=tp, hash=True))
    return f


@pytest.mark.parametrize("tp", [None, 1, 2])
def test_stage_validates_and_is_deterministic(msrt, src, tmp_path, tp):
    out = tmp_path / "out"
    res = stage_cartridge(src, msrt["base"], out=out, tp=tp)
    assert not list(validate(out, msrt["base"], tp or 1))
    rec = json.loads((out / stage.STAGING_FILE).read_text())
    jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text())).validate(rec)
    assert rec == res.staging and rec["tp_size"] == (tp or 1) and rec["converted"] == (tp == 2)
    assert rec["layout"] == ("rank-sharded" if tp == 2 else "full")
    assert len(rec["ranks"]) == (tp or 1)
    if tp != 2:  # copied as is
        assert tree(out) | {stage.STAGING_FILE: b""} == tree(src) | {stage.STAGING_FILE: b""}
    first = tree(out)
    stage_cartridge(src, msrt["base"], out=out, tp=tp, force=True)
    assert tree(out) == first
    assert siblings(out) == ["out"]


def test_matching_sharded_input_is_copied(msrt, tmp_path):
    out = tmp_path / "out"
    stage_cartridge(msrt["sharded"], msrt["base"], out=out, tp=2)
    for name, data in tree(msrt["sharded"]).items():
        assert (out / name).read_bytes() == data
    with pytest.raises(StageError) as exc:
        stage_cartridge(msrt["sharded"], msrt["base"], out=tmp_path / "o4", tp=4)
    assert "CA075" in exc.value.findings.codes()
    assert not (tmp_path / "o4").exists()


def test_existing_out_untouched_without_force(msrt, src, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep").write_text("x")
    with pytest.raises(OutputError, match="--force"):
        stage_cartridge(src, msrt["base"], out=out)
    assert tree(out) == {"keep": b"x"}


def _failing(msrt, src, tmp_path, code: str) -> None:
    """The failure leaves no OUT, and an existing OUT (with --force) unchanged."""
    out = tmp_path / "out"
    with pytest.raises(StageError) as exc:
        stage_cartridge(src, msrt["base"], out=out)
    assert code in exc.value.findings.codes(), [(f.code, f.message) for f in exc.value.findings]
    assert not out.exists() and siblings(out) == []
    out.mkdir()
    (out / "keep").write_text("x")
    with pytest.raises(StageError):
        stage_cartridge(src, msrt["base"], out=out, force=True)
    assert tree(out) == {"keep": b"x"} and siblings(out) == ["out"]


def test_bad_hash(msrt, src, tmp_path):
    m = json.loads((src / spec.ADAPTER_CONFIG).read_text())
    m["shards"][1]["sha256"] = "0" * 64
    (src / spec.ADAPTER_CONFIG).write_text(json.dumps(m))
    _failing(msrt, src, tmp_path, "CA005")


def test_bad_rule(msrt, src, tmp_path):
    import numpy as np

    name = spec.stage_key(3, 0, "gate_proj", 0, "scale", "k3")
    rewrite_shard(
        src / "model-layer-003-b000.safetensors", lambda t: {**t, name: np.array(1e-40, np.float32)}
    )
    refresh_shards(src)
    _failing(msrt, src, tmp_path, "CA058")


def test_wrong_base(msrt, src, tmp_path):
    other = build_base(tmp_path / "other", hidden=128, intermediate=256, seed=1)
    with pytest.raises(StageError) as exc:
        stage_cartridge(src, other, out=tmp_path / "out")
    assert {"CA071", "CA072"} <= exc.value.findings.codes()
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("mode", ["r+b", "ab"])
def test_source_changed_mid_copy(msrt, src, tmp_path, monkeypatch, mode):
    def hook(path: str, done: int) -> None:
        with open(src / path, mode) as fh:  # rewrites or grows the source while it is copied
            fh.write(b"\0")

    monkeypatch.setattr(stage, "copy_hook", hook)
    out = tmp_path / "out"
    with pytest.raises(StageError) as exc:
        stage_cartridge(src, msrt["base"], out=out)
    assert "ST023" in exc.value.findings.codes()
    assert not out.exists() and siblings(out) == []


def test_disk_full(msrt, src, tmp_path, monkeypatch):
    def full(dst, chunk):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(stage, "_write_all", full)
    out = tmp_path / "out"
    with pytest.raises(OutputError, match="No space left"):
        stage_cartridge(src, msrt["base"], out=out)
    assert not out.exists() and siblings(out) == []


def test_symlinked_shard_is_refused_by_validate_and_staged_as_a_real_file(msrt, src, tmp_path):
    # The runtime opens adapter files without following links: validate refuses a link that
    # leaves the adapter (PA002, hint: stage-cartridge); staging writes the real file.
    from exl3tool.checks.cartridge import check_cartridge
    from exl3tool.checks.options import ValidateOptions
    from exl3tool.rules.registry import Findings

    name = "model-layer-004-b000.safetensors"
    target = tmp_path / "elsewhere.safetensors"
    shutil.move(src / name, target)
    (src / name).symlink_to(target)
    findings = Findings()
    check_cartridge(src, findings, ValidateOptions())
    assert [f.code for f in findings.errors()] == ["PA002"]
    assert "stage-cartridge" in findings.errors()[0].rule.hint
    out = tmp_path / "out"
    stage_cartridge(src, msrt["base"], out=out)
    staged = next(out.rglob(name))
    assert not staged.is_symlink() and staged.read_bytes() == target.read_bytes()


def test_leftovers_of_a_killed_run_are_cleaned(msrt, src, tmp_path):
    import os

    leftover = tmp_path / ".out.tmp-deadbeef"
    leftover.mkdir()
    (leftover / "half.safetensors").write_bytes(b"x")
    os.utime(leftover, (1e9, 1e9))  # long ago: no live run is between mkdtemp and flock
    stage_cartridge(src, msrt["base"], out=tmp_path / "out")
    assert not leftover.exists()


def test_base_identity_is_reused_only_when_asked_and_while_unchanged(
    msrt, src, tmp_path, monkeypatch
):
    """verify-swap stages up to three times: with reuse_base_identity the base's bytes are
    hashed once per process, again as soon as a shard's stamp moves, and every time without."""
    import os
    import shutil

    from exl3tool.identity import compat

    base = tmp_path / "base"
    shutil.copytree(msrt["base"], base)
    calls = []
    real = compat.compat_identity
    monkeypatch.setattr(compat, "compat_identity", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(compat, "_BASE_CACHE", {})

    def stage(i: int, reuse: bool) -> None:
        stage_cartridge(src, base, out=tmp_path / f"o{i}", reuse_base_identity=reuse)

    stage(0, True)
    stage(1, True)
    assert len(calls) == 1
    shard = next(base.glob("*.safetensors"))
    st = shard.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # ctime moves too
    stage(2, True)
    assert len(calls) == 2
    stage(3, False)
    stage(4, False)
    assert len(calls) == 4
