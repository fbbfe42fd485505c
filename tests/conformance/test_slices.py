"""Issue 12, slice outputs as artifacts: `validate` of an `exl3tool slice` output directory and
of each rank folder checks them as TP slices (geometry per rank, manifest digests)."""

from __future__ import annotations

import dataclasses
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from checks_fixtures import edit_shard
from conformance_paths import EXAMPLES
from typer.testing import CliRunner

from exl3tool.actions.validate import validate_path
from exl3tool.checks.options import ValidateOptions
from exl3tool.cli.main import app


def sliced(src: Path, out: Path, *extra: str) -> Path:
    result = CliRunner().invoke(app, ["slice", str(src), "--tp", "2", "-o", str(out), *extra])
    assert result.exit_code == 0, result.output
    return out


def levels(path: Path, **kw) -> dict[str, set[str]]:
    ref, findings = validate_path(path, ValidateOptions(**kw))
    out: dict[str, set[str]] = {"kind": {ref.kind}}
    for f in findings:
        out.setdefault(f.level.value, set()).add(f.code)
    return out


@pytest.fixture(scope="module")
def base_slices(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sliced(EXAMPLES / "msrt-base-tiny", tmp_path_factory.mktemp("slices") / "out")


def test_base_slice_output_and_rank_folders_pass(base_slices: Path) -> None:
    assert levels(base_slices) == {"kind": {"tp-slices"}}
    assert levels(base_slices, hash=True) == {"kind": {"tp-slices"}}
    for rank in ("rank-0", "rank-1"):
        got = levels(base_slices / rank)
        assert got["kind"] == {"msrt-base"} and not {"error", "warning"} & set(got)


def test_rank_folder_outside_its_output_is_a_plain_base(base_slices: Path, tmp_path: Path) -> None:
    # without the parent's exl3tool-slices.json it is checked as a whole base: slice shapes
    # then disagree with the full sizes its config keeps
    lone = shutil.copytree(base_slices / "rank-0", tmp_path / "rank-0")
    assert "MB017" in levels(lone).get("error", set())


def test_changed_rank_file_is_caught(base_slices: Path, tmp_path: Path) -> None:
    out = shutil.copytree(base_slices, tmp_path / "out")
    shard = out / "rank-1" / "model-rank-1-part-0.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # same size: only the digest tells
    shard.write_bytes(bytes(data))
    assert "TP006" not in levels(out).get("error", set())
    assert "TP006" in levels(out, hash=True)["error"]
    (out / "rank-1" / "tier_bitmap.json").unlink()
    assert "TP006" in levels(out)["error"]


def test_missing_rank_tensor_is_caught(base_slices: Path, tmp_path: Path) -> None:
    out = shutil.copytree(base_slices, tmp_path / "out")
    name = "model.layers.3.mlp.experts.0.down_proj.rank0.suh"
    edit_shard(out / "rank-0", "model-rank-0-part-0.safetensors", lambda t: t.pop(name))
    got = levels(out / "rank-0")
    assert "TP005" in got["error"]
    whole = validate_path(out, ValidateOptions())[1]
    hit = next(f for f in whole if f.code == "TP005")
    assert hit.location.tensor == name and hit.location.file.endswith("rank-0")


def test_wrong_slice_geometry_is_caught(base_slices: Path, tmp_path: Path) -> None:
    out = shutil.copytree(base_slices, tmp_path / "out")
    name = "model.layers.3.mlp.experts.0.gate_proj.rank0.svh"
    edit_shard(
        out / "rank-0",
        "model-rank-0-part-0.safetensors",
        lambda t: t.update({name: ("F16", np.ones(256, np.float16))}),  # the full size, not half
    )
    assert "MB007" in levels(out / "rank-0")["error"]


def test_r7_slices_pass_without_source_release_manifests(tmp_path: Path) -> None:
    sys.path.insert(0, str(EXAMPLES))
    from make_examples import r7_tiny_spec

    from exl3tool.synth.r7 import build_r7

    src = build_r7(tmp_path / "r7", dataclasses.replace(r7_tiny_spec(), moe_intermediate=256))
    out = sliced(src, tmp_path / "out")
    for path in (out, out / "rank-0", out / "rank-1"):
        got = levels(path)
        assert not {"error", "warning"} & set(got), (path, got)


def test_expert_parallel_slices_skip_family_rules(tmp_path: Path) -> None:
    out = sliced(EXAMPLES / "r7-tiny", tmp_path / "out", "--mode", "expert")
    ref, findings = validate_path(out / "rank-0", ValidateOptions())
    assert ref.extra["family_checks"].startswith("skipped") and not findings.has_errors()


def test_rank_sliced_layout_output_validates_as_rank_sliced(tmp_path: Path) -> None:
    out = sliced(EXAMPLES / "msrt-base-tiny", tmp_path / "out", "--layout", "rank-sliced")
    got = levels(out, runtime="cartridge")  # a K2 base: the cartridge runtime serves K2
    assert got["kind"] == {"rank-sliced"} and not {"error", "warning"} & set(got)
    assert "RS020" in levels(out)["error"]  # the public runtime refuses uniform K2


@pytest.mark.parametrize("name", ["/etc", "../rank-0", "x" * 300, "rank-9"])
def test_a_rank_folder_the_manifest_names_outside_or_nowhere_is_tp007(
    base_slices: Path, tmp_path: Path, name: str
) -> None:
    # never followed out of the output (an absolute or `..` name), never a traceback (a name
    # too long for the file system), never silently skipped (a folder that is not there)
    import json

    out = shutil.copytree(base_slices, tmp_path / "out")
    manifest = out / "exl3tool-slices.json"
    doc = json.loads(manifest.read_text())
    doc["ranks"][1]["dir"] = name
    manifest.write_text(json.dumps(doc))
    _, findings = validate_path(out, ValidateOptions())
    hits = [f for f in findings if f.code == "TP007"]
    assert [f.location.pointer for f in hits] == ["/ranks/1/dir"]
    assert not any(f.code.endswith("099") for f in findings)
