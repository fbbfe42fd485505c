"""The format values the builders write, copied by hand from the format documents.

Deliberately not imported from `exl3tool.formats`: a wrong constant there must make the checker
reject what these builders write, not pass every test because both sides share it.
`tests/synth/test_literals.py` pins both copies to the documents' values.
"""

from __future__ import annotations

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")

# docs/formats/exl3.md §1: codebook markers (int32 scalars) and the multipliers they select.
MCG_MARKER = -877912083  # 0xCBAC1FED as int32
MUL1_MARKER = -2082680531  # 0x83DCD12D as int32
MCG_MULTIPLIER = 3417055213  # 0xCBAC1FED
MUL1_MULTIPLIER = 2212286765  # 0x83DCD12D

# docs/formats/msrt.md §1.3: base K 2..6.
BASE_K = (2, 3, 4, 5, 6)

# docs/formats/msrt.md §4: the manifest, rows 1-24 in order, and the fixed values of rows 5-13.
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_SCHEMA = "fq-cartridge-adapter/3"
ADAPTER_FIELDS = (
    "schema", "assembly", "base", "chain", "format", "runtime_profile", "rotation_ownership",
    "standard_lora_compatible", "runtime_operation", "codebook", "mcg_multiplier",
    "mcg_ownership", "scale_shape", "tensor_parallel", "shards", "num_tensors",
    "selected_experts", "selected_layers", "coverage", "producer_verified_signer", "campaign",
    "source_assembly", "tool_version", "created_utc",
)  # fmt: skip
ADAPTER_CONSTANTS = {
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
AXIS_BY_PROJECTION = {"gate_proj": "output", "up_proj": "output", "down_proj": "input"}

# docs/formats/msrt.md §5: the closed exl3-msrt-base/1 profile.
BASE_PROFILE = "exl3-msrt-base/1"
BASE_TENSOR_SCHEMA = "model.layers.{L}.mlp.experts.{E}.{proj}.rank{r}.{trellis|suh|svh|mcg}"
BASE_TENSOR_PARALLEL = {
    "storage_layout": "full-rank",
    "storage_world_size": 1,
    "storage_ranks": [0],
    "runtime_partitioning": "slice-full-rank",
    "slice_alignment": 128,
    "axis_by_projection": {"gate_proj": "output", "up_proj": "output", "down_proj": "input"},
}


def trellis_shape(proj: str, hidden: int, intermediate: int, k: int) -> tuple[int, int, int]:
    """docs/formats/msrt.md §3: `[ceil128(in)/16, ceil128(out)/16, 16·K]`; down_proj maps intermediate → hidden."""
    n_in, n_out = (intermediate, hidden) if proj == "down_proj" else (hidden, intermediate)
    return (-(-n_in // 128) * 8, -(-n_out // 128) * 8, 16 * k)


def base_key(layer: int, expert: int, proj: str, component: str) -> str:
    """docs/formats/msrt.md §5: a base routed-expert tensor (rank0 storage)."""
    return f"model.layers.{layer}.mlp.experts.{expert}.{proj}.rank0.{component}"


def stage_key(layer: int, expert: int, proj: str, rank: int, component: str, label: str) -> str:
    """docs/formats/msrt.md §3: a cartridge stage tensor, `…{proj}.rank{r}.{trellis|scale}_{label}`."""
    return f"model.layers.{layer}.mlp.experts.{expert}.{proj}.rank{rank}.{component}_{label}"


def config_sizes(config: object) -> tuple[int | None, int | None, int | None]:
    """(hidden, MoE intermediate, routed experts) of a config.json these builders wrote."""
    if not isinstance(config, dict):
        return None, None, None
    keys = ("hidden_size", "moe_intermediate_size", "num_experts")
    return tuple(v if type(v) is int and v > 0 else None for v in map(config.get, keys))
