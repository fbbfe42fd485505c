"""RS012: under `--hash`, every rank's copy of a replicated tensor must be rank 0's bytes, in a
rank-sliced checkpoint and in the rank-sliced MTP layer an R7 checkpoint carries."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from exl3tool.actions.validate import validate_path
from exl3tool.checks.options import ValidateOptions
from exl3tool.checks.replicas import MAX_REPORTED
from exl3tool.io.safetensors import read_header
from exl3tool.rules.registry import Findings


def _validate(path: Path, hash: bool) -> list[tuple[str, str, str | None]]:
    findings = validate_path(path, ValidateOptions(threads=1, hash=hash))[1]
    return [(f.rule.code, f.message, f.location.tensor) for f in findings]


def _corrupt(root: Path, suffix: str, limit: int | None = 1) -> list[str]:
    """Flip the first bytes of the tensors whose names end with `suffix` (at most `limit`)."""
    done: list[str] = []
    for shard in sorted(root.glob("*.safetensors")):
        st = read_header(shard, Findings())
        assert st is not None
        for name in st.tensors:
            if name.endswith(suffix) and (limit is None or len(done) < limit):
                start, _ = st.span(name)
                with open(shard, "r+b") as fh:
                    fh.seek(start)
                    fh.write(b"\x01\x3c")  # F16 1.0 + 1 ulp: finite, and not the old bytes
                done.append(name)
    return done


@pytest.fixture
def rank_sliced(pristine: dict[str, Path], tmp_path: Path) -> Path:
    return Path(shutil.copytree(pristine["rank-sliced"], tmp_path / "rs"))


def test_the_synthetic_replicas_are_identical(pristine: dict[str, Path]) -> None:
    for kind in ("rank-sliced", "r7"):
        assert not [f for f in _validate(pristine[kind], hash=True) if f[0] == "RS012"]


def test_a_differing_copy_is_rs012_under_hash_only(rank_sliced: Path) -> None:
    (name,) = _corrupt(rank_sliced, "up_proj.rank1.suh")
    found = [f for f in _validate(rank_sliced, hash=True) if f[0] == "RS012"]
    assert [(f[2], "rank 0's copy" in f[1]) for f in found] == [(name, True)]
    assert not [f for f in _validate(rank_sliced, hash=False) if f[0] == "RS012"]


def test_rank_0s_own_copy_differing_names_every_other_rank(rank_sliced: Path) -> None:
    _corrupt(rank_sliced, "down_proj.rank0.svh")
    found = [f for f in _validate(rank_sliced, hash=True) if f[0] == "RS012"]
    assert [f[2] for f in found] == ["model.layers.1.mlp.experts.0.down_proj.rank1.svh"]


def test_many_differing_copies_are_counted_past_the_first(
    pristine: dict[str, Path], tmp_path: Path
) -> None:
    from exl3tool.synth.r7 import build_rank_sliced

    root = build_rank_sliced(tmp_path / "rs8", n_experts=8)
    bad = _corrupt(root, "_proj.rank1.suh", None) + _corrupt(root, "down_proj.rank1.svh", None)
    bad = [n for n in bad if not n.endswith("down_proj.rank1.suh")]  # down's suh is sliced
    assert len(bad) > MAX_REPORTED
    found = [f for f in _validate(root, hash=True) if f[0] == "RS012"]
    assert len(found) == MAX_REPORTED + 1
    assert f"{len(bad) - MAX_REPORTED} more" in found[-1][1]


def test_the_carried_mtp_layer_of_an_r7_checkpoint(
    pristine: dict[str, Path], tmp_path: Path
) -> None:
    from make_examples import r7_tiny_spec

    from exl3tool.synth.r7 import build_r7

    spec = dataclasses.replace(r7_tiny_spec(), moe_intermediate=256, mtp_tp=2)
    root = build_r7(tmp_path / "r7", spec)
    assert not [f for f in _validate(root, hash=True) if f[0] == "RS012"]
    (name,) = _corrupt(root, "gate_proj.rank1.suh")
    assert name.startswith("model.layers.3.")  # the carried MTP layer
    found = [f for f in _validate(root, hash=True) if f[0] == "RS012"]
    assert [f[2] for f in found] == [name]
