"""slice -> verify-only reassembles every source tensor byte for byte; tampering is caught."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tp_fixtures as fx

from exl3tool.rules.errors import OutputError
from exl3tool.tp.run import SliceOptions, slice_artifact, verify_output
from exl3tool.tp.slices import PlanRefused
from exl3tool.tp.verify import verify_slices

CASES = [
    (src, tp, mode, layout)
    for src in ("exl3", "r7", "base")
    for tp in (1, 2, 4, 8)
    for mode, layout in (("tensor", "per-rank"), ("expert", "per-rank"), ("tensor", "rank-sliced"))
    if not (mode == "expert" and tp == 8)  # 4 experts per layer: TP 8 is refused (below)
    if not (src == "exl3" and layout == "rank-sliced")  # mixed K per expert: refused (plan test)
]


@pytest.mark.parametrize(("src", "tp", "mode", "layout"), CASES)
def test_round_trip(
    sources: dict[str, Path], tmp_path: Path, src: str, tp: int, mode: str, layout: str
) -> None:
    out = tmp_path / "out"
    opts = SliceOptions(tp, mode, layout, max_shard_size=100_000)
    outcome = slice_artifact(sources[src], out, opts)
    assert outcome.out == out
    assert list(verify_output(out)) == []
    doc = json.loads((out / "exl3tool-slices.json").read_text())
    assert doc["tp"] == tp and doc["source"]["identity"]["root"]
    if layout == "per-rank":
        assert sorted(p.name for p in out.iterdir()) == sorted(
            ["exl3tool-slices.json", *(f"rank-{r}" for r in range(tp))]
        )
        assert (out / "rank-0" / "config.json").is_file()
        assert any(r["path"].endswith("part-1.safetensors") for r in doc["files"])


def test_bytes_are_deterministic(sources: dict[str, Path], tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        slice_artifact(sources["r7"], out, SliceOptions(2, verify=True))
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    for rel in files:
        if rel.name != "exl3tool-slices.json":
            assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel


def test_cartridge_full_to_rank_sharded(sources: dict[str, Path], tmp_path: Path) -> None:
    for tp in (1, 2, 4, 8):
        out = tmp_path / f"c{tp}"
        outcome = slice_artifact(sources["cartridge"], out, SliceOptions(tp, verify=True))
        assert outcome.kind == "cartridge"
        cfg = json.loads((out / "adapter_config.json").read_text())
        assert cfg["tensor_parallel"]["layout"] == "rank-sharded"
        assert cfg["tensor_parallel"]["world_size"] == tp
        assert not verify_output(out, sources["cartridge"]).has_errors()


def test_refused_split_writes_nothing(sources: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "refused"
    with pytest.raises(PlanRefused) as exc:
        slice_artifact(sources["base"], out, SliceOptions(8, "expert"))
    assert exc.value.findings.codes() == {"TP002"}
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_never_overwrites_without_force(sources: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep").write_text("x")
    with pytest.raises(OutputError):
        slice_artifact(sources["r7"], out, SliceOptions(2))
    assert (out / "keep").read_text() == "x"
    slice_artifact(sources["r7"], out, SliceOptions(2, force=True))
    assert not (out / "keep").exists()


@pytest.fixture(scope="module")
def sliced(tmp_path_factory: pytest.TempPathFactory, sources: dict[str, Path]) -> Path:
    out = tmp_path_factory.mktemp("sliced") / "o"
    slice_artifact(sources["r7"], out, SliceOptions(2))
    return out


def _copy(sliced: Path, tmp_path: Path) -> Path:
    return fx.copy_tree(sliced, tmp_path / "c")


def _part(out: Path, rank: int = 1) -> Path:
    return out / f"rank-{rank}" / f"model-rank-{rank}-part-0.safetensors"


def _rewrite_manifest(out: Path, edit) -> None:
    p = out / "exl3tool-slices.json"
    doc = json.loads(p.read_text())
    edit(doc)
    p.write_text(json.dumps(doc))


def _flip_payload_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x40  # inside the last tensor's payload
    path.write_bytes(bytes(data))


def test_flipped_byte_is_a_digest_and_bytes_finding(sliced: Path, tmp_path: Path) -> None:
    out = _copy(sliced, tmp_path)
    part = _part(out)
    _flip_payload_byte(part)
    assert verify_slices(out).codes() == {"TP006", "TP004"}


def test_flip_with_rehashed_manifest_is_still_caught(sliced: Path, tmp_path: Path) -> None:
    """Even with the file digests forged, the byte comparison finds the change."""
    from exl3tool.identity.engine import hash_files

    out = _copy(sliced, tmp_path)
    part = _part(out)
    _flip_payload_byte(part)
    rel = part.relative_to(out).as_posix()

    def forge(doc: dict) -> None:
        for rec in doc["files"]:
            if rec["path"] == rel:
                rec["sha256"] = hash_files([part], "sha256")[part]
                rec["blake3"] = hash_files([part], "blake3")[part]

    _rewrite_manifest(out, forge)
    assert verify_slices(out).codes() == {"TP004"}


def test_missing_or_bad_manifest(sliced: Path, tmp_path: Path) -> None:
    out = _copy(sliced, tmp_path)
    _rewrite_manifest(out, lambda d: d.update(tp="two"))
    assert verify_slices(out).codes() == {"TP007"}
    (out / "exl3tool-slices.json").unlink()
    assert verify_slices(out).codes() == {"TP007"}


def test_coverage_gap_is_reported(sliced: Path, tmp_path: Path) -> None:
    out = _copy(sliced, tmp_path)
    name = "model.layers.1.mlp.experts.0.down_proj.suh"
    _rewrite_manifest(out, lambda d: d["ranks"][1]["tensors"].pop(name))
    codes = verify_slices(out).codes()
    assert codes == {"TP005"}  # rank 1's copy is now unclaimed and the source is not covered


def test_identity_mismatch(sliced: Path, tmp_path: Path) -> None:
    out = _copy(sliced, tmp_path)
    _rewrite_manifest(out, lambda d: d["source"]["identity"].update(root="0" * 64))
    assert verify_slices(out).codes() == {"TP008"}


def test_changed_source(sliced: Path, sources: dict[str, Path], tmp_path: Path) -> None:
    out = _copy(sliced, tmp_path)
    src = fx.copy_tree(sources["r7"], tmp_path / "src")
    label = json.loads((out / "exl3tool-slices.json").read_text())["source"]["files"][0]["path"]

    def resize(d: dict) -> None:
        d["source"]["files"][0]["size"] += 1

    _rewrite_manifest(out, resize)
    found = verify_slices(out, source=src)
    assert found.codes() == {"TP010"} and next(iter(found)).location.file == label
