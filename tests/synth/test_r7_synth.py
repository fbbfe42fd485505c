"""The synthetic R7 / rank-sliced builders: deterministic, realistic, parametric, valid."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest

from exl3tool.actions.validate import validate_path
from exl3tool.checks.options import ValidateOptions
from exl3tool.formats.detect import Kind, detect
from exl3tool.io.safetensors import read_header
from exl3tool.rules.registry import Findings, Severity
from exl3tool.synth.r7 import R7Spec, build_r7, build_rank_sliced

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())}


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    a = files(build_r7(tmp_path / "a", seed=5))
    assert a == files(build_r7(tmp_path / "b", seed=5))
    c = files(build_r7(tmp_path / "c", seed=6))
    assert a["r7-experts-layer-001.safetensors"] != c["r7-experts-layer-001.safetensors"]


def test_layout_names_and_metadata(tmp_path: Path) -> None:
    root = build_r7(tmp_path / "r7", R7Spec(num_hidden_layers=4, first_moe_layer=2, n_experts=3))
    assert detect(root) is Kind.R7
    config = json.loads((root / "config.json").read_text())
    qc = json.loads((root / "quantization_config.json").read_text())
    assert config["quantization_config"] == qc
    block = qc["r7_routed_experts"]
    assert block["moe_layers"] == [2, 3]
    assert block["bit_map_manifests"] == ["r7-experts-layer-002.json", "r7-experts-layer-003.json"]
    assert config["hybrid_tr3_tail"]["moe_layers"] == [4, 4]
    st = read_header(root / "r7-experts-layer-002.safetensors", Findings())
    assert st is not None and st.metadata == {
        "format": "pt", "r7_schema": "2", "r7_layer": "2", "r7_marker": "CODEX_ROUND7",
    }  # fmt: skip
    t = st.tensors["model.layers.2.mlp.experts.1.down_proj.trellis"]
    assert (
        t.dtype == "I16" and t.shape[:2] == (128 // 16, 128 // 16) and t.shape[2] // 16 in (3, 4, 5)
    )
    assert st.tensors["model.layers.2.mlp.experts.r7_shared.gate_up_suh"].shape == (128,)
    man = json.loads((root / "r7-experts-layer-002.json").read_text())
    assert len(man["bit_map"]) == 9 and man["allocation_bit_units"] == sum(man["bit_map"].values())
    seal = (root / "MANIFEST.sha256").read_text()
    assert seal.endswith("  MANIFEST.json\n") and len(seal.split()[0]) == 64


def test_k_map_overrides_and_markers(tmp_path: Path) -> None:
    root = build_r7(tmp_path / "r7", k_map={(1, 0, "up_proj"): 5}, k_values=(5,), mtp=False)
    st = read_header(root / "r7-experts-layer-001.safetensors", Findings())
    assert st is not None
    assert st.tensors["model.layers.1.mlp.experts.0.up_proj.trellis"].shape[2] == 80
    start, end = st.span("model.layers.1.mlp.experts.0.up_proj.mcg")
    raw = (root / "r7-experts-layer-001.safetensors").read_bytes()[start:end]
    assert struct.unpack("<i", raw)[0] == -877912083


def test_sparse_payload_is_holes_with_real_markers(tmp_path: Path) -> None:
    root = build_r7(tmp_path / "sparse", payload="sparse", hidden=1024, moe_intermediate=512)
    shard = root / "r7-experts-layer-001.safetensors"
    assert shard.stat().st_blocks * 512 < shard.stat().st_size
    _, findings = validate_path(root, ValidateOptions())
    assert not [f for f in findings if f.level is not Severity.INFO]


def test_rank_sliced_builder(tmp_path: Path) -> None:
    root = build_rank_sliced(tmp_path / "rs", tp=2, moe_intermediate=256)
    assert detect(root) is Kind.RANK_SLICED
    st = read_header(root / "model.safetensors", Findings())
    assert st is not None
    assert st.tensors["model.layers.1.mlp.experts.0.gate_proj.rank1.trellis"].shape[:2] == (8, 8)
    assert st.tensors["model.layers.1.mlp.experts.0.down_proj.rank0.suh"].shape == (128,)


def test_builder_refuses_a_non_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "f").write_text("")
    with pytest.raises(FileExistsError):
        build_r7(tmp_path / "x")


def test_committed_example_equals_a_fresh_build(tmp_path: Path) -> None:
    sys.path.insert(0, str(EXAMPLES))
    try:
        import make_examples
    finally:
        sys.path.remove(str(EXAMPLES))
    make_examples.build_all(tmp_path)
    assert make_examples.differs(EXAMPLES / "r7-tiny", tmp_path / "r7-tiny") == []
