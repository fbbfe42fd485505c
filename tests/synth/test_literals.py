"""The checker's format constants and the builders' copies, each against the documents' values.

The values below are typed from /work/shared/docs (docs/formats/msrt.md, docs/formats/exl3.md,
docs/formats/r7.md), not imported: `exl3tool.formats` (what the checker enforces) and
`exl3tool.synth.literals` (what the test artifacts are built with) must both equal them, so a
wrong constant on either side fails here instead of passing every round trip.
"""

from __future__ import annotations

import pytest

from exl3tool.formats import exl3 as exl3_formats
from exl3tool.formats import msrt_spec
from exl3tool.formats import r7 as r7_formats
from exl3tool.formats.names import PROJECTIONS
from exl3tool.synth import literals

# docs/formats/msrt.md §4, rows 1-24 in order.
DOC_ADAPTER_FIELDS = (
    "schema", "assembly", "base", "chain", "format", "runtime_profile", "rotation_ownership",
    "standard_lora_compatible", "runtime_operation", "codebook", "mcg_multiplier",
    "mcg_ownership", "scale_shape", "tensor_parallel", "shards", "num_tensors",
    "selected_experts", "selected_layers", "coverage", "producer_verified_signer", "campaign",
    "source_assembly", "tool_version", "created_utc",
)  # fmt: skip
# §4 rows 5-13.
DOC_ADAPTER_CONSTANTS = {
    "format": "exl3-msrt-packed",
    "runtime_profile": "exl3-msrt-additive/1",
    "rotation_ownership": "base",
    "standard_lora_compatible": False,
    "runtime_operation": "base_exl3_gemm + sum(stage_exl3_gemm / stage_scale)",
    "codebook": "mcg",
    "mcg_multiplier": 3417055213,
    "mcg_ownership": "adapter-config",
    "scale_shape": [],
}
DOC_AXIS = {"gate_proj": "output", "up_proj": "output", "down_proj": "input"}
# §5 closed profile.
DOC_BASE_TAIL_FIELDS = {
    "format", "runtime_profile", "bits", "codebook", "moe_layers", "moe_layer_coverage",
    "tensor_schema", "tensor_parallel", "mcg_multiplier", "compatibility_sha256",
    "compatibility_by_layer", "experts_per_layer",
}  # fmt: skip
DOC_BASE_TENSOR_SCHEMA = "model.layers.{L}.mlp.experts.{E}.{proj}.rank{r}.{trellis|suh|svh|mcg}"
DOC_BASE_TP = {
    "storage_layout": "full-rank",
    "storage_world_size": 1,
    "storage_ranks": [0],
    "runtime_partitioning": "slice-full-rank",
    "slice_alignment": 128,
    "axis_by_projection": {"gate_proj": "output", "up_proj": "output", "down_proj": "input"},
}
# §3 geometry: (proj, hidden, intermediate, K) -> [ceil128(in)/16, ceil128(out)/16, 16K].
DOC_SHAPES = [
    (("gate_proj", 256, 384, 3), (16, 24, 48)),
    (("up_proj", 256, 384, 1), (16, 24, 16)),
    (("down_proj", 256, 384, 6), (24, 16, 96)),
    (("gate_proj", 200, 130, 2), (16, 16, 32)),  # 200 -> 256, 130 -> 256
    (("down_proj", 128, 129, 4), (16, 8, 64)),  # intermediate 129 -> 256 is the input side
]


def test_manifest_constants_match_the_document() -> None:
    for side in (msrt_spec, literals):
        assert side.ADAPTER_SCHEMA == "fq-cartridge-adapter/3"
        assert side.ADAPTER_CONFIG == "adapter_config.json"
        assert tuple(side.ADAPTER_FIELDS) == DOC_ADAPTER_FIELDS
        assert dict(side.ADAPTER_CONSTANTS) == DOC_ADAPTER_CONSTANTS
        assert type(side.ADAPTER_CONSTANTS["standard_lora_compatible"]) is bool
        assert dict(side.AXIS_BY_PROJECTION) == DOC_AXIS
    assert msrt_spec.MCG_MULTIPLIER == 3417055213
    assert msrt_spec.RUNTIME_OPERATION == "base_exl3_gemm + sum(stage_exl3_gemm / stage_scale)"
    assert msrt_spec.MAX_MANIFEST_BYTES == 16 * 2**20  # §2: 16 MiB
    assert msrt_spec.MAX_SHARD_BYTES == 68719476736  # §2, §4 row 15: 2^36
    assert msrt_spec.MAX_TOTAL_BYTES == 2**40  # §2: 1 TiB
    assert msrt_spec.SPLIT_AXIS == {"gate_proj": 1, "up_proj": 1, "down_proj": 0}  # §3
    assert tuple(msrt_spec.LAYOUTS) == ("full", "rank-sharded")  # §4 row 14


def test_k_ranges_match_the_document() -> None:
    assert list(msrt_spec.STAGE_K) == [1, 2, 3, 4, 5, 6]  # §1.3
    assert list(msrt_spec.BASE_K) == [2, 3, 4, 5, 6]
    assert list(literals.BASE_K) == [2, 3, 4, 5, 6]


def test_base_profile_matches_the_document() -> None:
    for side in (msrt_spec, literals):
        assert side.BASE_PROFILE == "exl3-msrt-base/1"
        assert side.BASE_TENSOR_SCHEMA == DOC_BASE_TENSOR_SCHEMA
        assert side.BASE_TENSOR_PARALLEL == DOC_BASE_TP
    assert set(msrt_spec.BASE_TAIL_FIELDS) == DOC_BASE_TAIL_FIELDS
    assert len(msrt_spec.BASE_TAIL_FIELDS) == 12
    assert tuple(msrt_spec.BASE_COMPONENTS) == ("trellis", "suh", "svh", "mcg")  # §6.1
    assert msrt_spec.MCG_MARKER_BYTES == b"\xed\x1f\xac\xcb"  # §6.1: bytes ed1faccb


def test_codebook_markers_match_the_document() -> None:
    # docs/formats/exl3.md §1: 0xCBAC1FED / 0x83DCD12D stored as int32.
    for side in (exl3_formats, literals):
        assert side.MCG_MARKER == -877912083
        assert side.MUL1_MARKER == -2082680531
        assert side.MCG_MULTIPLIER == 3417055213
        assert side.MUL1_MULTIPLIER == 2212286765
    assert (-877912083).to_bytes(4, "little", signed=True).hex() == "ed1faccb"
    assert exl3_formats.HALF_K == (1.5, 2.5, 3.5)


def test_r7_constants_match_the_document() -> None:
    assert r7_formats.SCHEMA_ID == "r7-complete-v2-checkpoint-v1"  # docs/formats/r7.md §2
    assert r7_formats.MARKER == "CODEX_ROUND7"
    assert r7_formats.layer_shard(3) == "r7-experts-layer-003.safetensors"  # docs/formats/r7.md §3
    # docs/formats/r7.md §2 bit_map_manifests
    assert r7_formats.layer_manifest(77) == "r7-experts-layer-077.json"


def test_projection_names() -> None:
    assert PROJECTIONS == ("gate_proj", "up_proj", "down_proj")
    assert literals.PROJECTIONS == ("gate_proj", "up_proj", "down_proj")


@pytest.mark.parametrize(("args", "shape"), DOC_SHAPES)
def test_trellis_geometry_matches_the_document(args: tuple, shape: tuple) -> None:
    assert msrt_spec.trellis_shape(*args) == shape
    assert literals.trellis_shape(*args) == shape


def test_tensor_names_match_the_document() -> None:
    # §3 stage keys and §5 rank0 base keys.
    want_stage = "model.layers.3.mlp.experts.7.down_proj.rank1.trellis_k3a"
    want_base = "model.layers.3.mlp.experts.7.up_proj.rank0.svh"
    for side in (msrt_spec, literals):
        assert side.stage_key(3, 7, "down_proj", 1, "trellis", "k3a") == want_stage
        assert side.base_key(3, 7, "up_proj", "svh") == want_base
    assert msrt_spec.KEY_RE.match(want_stage).group("label") == "k3a"
    assert msrt_spec.LABEL_RE.match("a" * 32) and not msrt_spec.LABEL_RE.match("a" * 33)
    assert not msrt_spec.LABEL_RE.match("-a")  # first character alphanumeric
