"""Shared H-side vectors of a rank-sliced tail (rotation_layout shared_h_v1), as the R7 runtime
revision's Exl3Config._configure_rank_sliced and normalize_rank_sliced_weight_name check them:
a valid shared_h_v1 twin passes, and each single mutation is one RS010."""

from __future__ import annotations

from pathlib import Path

import pytest
from checks_fixtures import copy, edit_json, edit_shard

from exl3tool.actions.validate import validate_path
from exl3tool.checks.options import ValidateOptions
from exl3tool.checks.rank_sliced import SHARED_H_SCHEMA
from exl3tool.io.safetensors import read_header
from exl3tool.rules.registry import Findings

SHARD = "model.safetensors"


def _h_side(proj: str) -> str:
    return "svh" if proj == "down_proj" else "suh"


def _to_shared_h(root: Path) -> None:
    """Rewrite a per-expert rank-sliced checkpoint as shared_h_v1: each (layer, projection,
    rank) keeps expert 0's H-side vector under `experts.shared_h`, no expert keeps its own."""

    def move(t: dict) -> None:
        for name in list(t):
            p = name.split(".")
            if len(p) != 9 or p[4] != "experts" or p[8] != _h_side(p[6]):
                continue
            vector = t.pop(name)
            if p[5] == "0":
                t[".".join([*p[:5], "shared_h", *p[6:]])] = vector

    edit_shard(root, SHARD, move)
    edit_json(
        root / "config.json",
        lambda c: c["hybrid_tr3_tail"].update(
            rotation_layout="shared_h_v1", shared_h_tensor_schema=SHARED_H_SCHEMA
        ),
    )


def _rs010(root: Path) -> list[str]:
    _, findings = validate_path(root, ValidateOptions())
    assert not [f for f in findings if f.level.value == "error" and f.code != "RS010"], [
        f.to_json() for f in findings
    ]
    return [f.message for f in findings if f.code == "RS010"]


@pytest.fixture
def shared(pristine: dict[str, Path], tmp_path: Path) -> Path:
    root = copy(pristine["rank-sliced"], tmp_path / "shared")
    _to_shared_h(root)
    return root


def _first_shared(root: Path) -> str:
    names = read_header(root / SHARD, Findings()).tensors
    return sorted(n for n in names if ".experts.shared_h.gate_proj." in n)[0]


def test_the_shared_h_twin_is_valid(shared: Path) -> None:
    assert _rs010(shared) == []


def test_a_shared_vector_on_the_wrong_side_is_refused(shared: Path) -> None:
    name = _first_shared(shared)
    edit_shard(shared, SHARD, lambda t: t.update({name[:-3] + "svh": t[name]}))
    assert any("gate_proj shares its H-side vector as suh, not svh" in m for m in _rs010(shared))


def test_an_h_side_vector_under_an_expert_id_is_refused(shared: Path) -> None:
    name = _first_shared(shared).replace("shared_h", "1")
    edit_shard(shared, SHARD, lambda t: t.update({name: t[_first_shared(shared)]}))
    assert any("forbids suh under expert ids" in m for m in _rs010(shared))


def test_shared_vectors_need_the_shared_h_layout(pristine: dict[str, Path], tmp_path: Path) -> None:
    """A per-expert checkpoint (every slice complete) that also holds a shared vector."""
    root = copy(pristine["rank-sliced"], tmp_path / "rs")
    own = "model.layers.1.mlp.experts.0.gate_proj.rank0.suh"
    edit_shard(root, SHARD, lambda t: t.update({own.replace(".0.", ".shared_h.", 1): t[own]}))
    messages = _rs010(root)
    assert len(messages) == 1 and "only shared_h_v1 has them" in messages[0]


def test_the_shared_schema_needs_the_shared_h_layout(
    pristine: dict[str, Path], tmp_path: Path
) -> None:
    root = copy(pristine["rank-sliced"], tmp_path / "rs")
    edit_json(
        root / "config.json",
        lambda c: c["hybrid_tr3_tail"].update(shared_h_tensor_schema=SHARED_H_SCHEMA),
    )
    assert [m for m in _rs010(root) if "only shared_h_v1 takes it" in m]
    edit_json(
        root / "config.json", lambda c: c["hybrid_tr3_tail"].update(shared_h_tensor_schema=None)
    )
    assert _rs010(root) == []  # null is no schema (the runtime reads it with .get)


def test_a_missing_shared_vector_is_a_missing_slice(shared: Path) -> None:
    name = _first_shared(shared)
    edit_shard(shared, SHARD, lambda t: t.pop(name))
    _, findings = validate_path(shared, ValidateOptions())
    assert [(f.code, f.location.tensor) for f in findings if f.level.value == "error"] == [
        ("RS005", name)
    ]


@pytest.mark.parametrize(
    "prefix",
    ["model.language_model.layers.1.mlp.experts", "model.layers.1.block_sparse_moe.experts"],
)
def test_the_runtime_pattern_takes_any_experts_prefix(
    pristine: dict[str, Path], tmp_path: Path, prefix: str
) -> None:
    """The runtime matches a shared vector under any prefix ending in `.experts`."""
    root = copy(pristine["rank-sliced"], tmp_path / "rs")
    own = "model.layers.1.mlp.experts.0.gate_proj.rank0.suh"
    edit_shard(root, SHARD, lambda t: t.update({f"{prefix}.shared_h.gate_proj.rank0.suh": t[own]}))
    assert [m for m in _rs010(root) if "only shared_h_v1 has them" in m]


def test_other_names_under_shared_h_have_no_parameter(shared: Path) -> None:
    name = _first_shared(shared)
    edit_shard(shared, SHARD, lambda t: t.update({name[:-3] + "trellis": t[name]}))
    assert [m for m in _rs010(shared) if "no loader parameter" in m]


def test_stray_shared_vectors_are_counted_past_twenty(
    pristine: dict[str, Path], tmp_path: Path
) -> None:
    root = copy(pristine["rank-sliced"], tmp_path / "rs")
    own = "model.layers.1.mlp.experts.0.gate_proj.rank0.suh"
    strays = {f"model.layers.1.mlp.experts.shared_h.gate_proj.rank{r}.suh" for r in range(30)}
    edit_shard(root, SHARD, lambda t: t.update(dict.fromkeys(strays, t[own])))
    messages = _rs010(root)
    assert len(messages) == 21 and messages[-1].startswith("10 more tensors")


def test_a_rank_with_leading_zeros_is_the_rank_it_reads_as(shared: Path) -> None:
    """The runtime reads `rank00` with int(): rank 0's shared vector, not a missing one."""
    name = _first_shared(shared)
    assert ".rank0." in name
    edit_shard(
        shared, SHARD, lambda t: t.update({name.replace(".rank0.", ".rank00."): t.pop(name)})
    )
    assert _rs010(shared) == []
