"""Constants and naming of `fq-cartridge-adapter/3` and `exl3-msrt-base/1` (docs/formats/msrt.md).

One place for the closed field sets, constant values, label/key regexes and the trellis geometry
so that the builder, the checks, the TP converter and the runtime tables agree.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from exl3tool.formats.names import PROJECTIONS

ADAPTER_SCHEMA = "fq-cartridge-adapter/3"
ADAPTER_CONFIG = "adapter_config.json"
MAX_MANIFEST_BYTES = 16 * 1024 * 1024  # §2
MAX_SHARD_BYTES = 2**36  # §2: 64 GiB
MAX_TOTAL_BYTES = 2**40  # §2: 1 TiB

# §4 rows 1-24, in the producer's order (the manifest is closed: exactly these fields).
ADAPTER_FIELDS: tuple[str, ...] = (
    "schema",
    "assembly",
    "base",
    "chain",
    "format",
    "runtime_profile",
    "rotation_ownership",
    "standard_lora_compatible",
    "runtime_operation",
    "codebook",
    "mcg_multiplier",
    "mcg_ownership",
    "scale_shape",
    "tensor_parallel",
    "shards",
    "num_tensors",
    "selected_experts",
    "selected_layers",
    "coverage",
    "producer_verified_signer",
    "campaign",
    "source_assembly",
    "tool_version",
    "created_utc",
)

RUNTIME_OPERATION = "base_exl3_gemm + sum(stage_exl3_gemm / stage_scale)"
MCG_MULTIPLIER = 3417055213  # 0xCBAC1FED
# §4 rows 5-13: fields whose value is fixed.
ADAPTER_CONSTANTS: dict[str, object] = {
    "format": "exl3-msrt-packed",
    "runtime_profile": "exl3-msrt-additive/1",
    "rotation_ownership": "base",
    "standard_lora_compatible": False,
    "runtime_operation": RUNTIME_OPERATION,
    "codebook": "mcg",
    "mcg_multiplier": MCG_MULTIPLIER,
    "mcg_ownership": "adapter-config",
    "scale_shape": [],
}

AXIS_BY_PROJECTION = {"gate_proj": "output", "up_proj": "output", "down_proj": "input"}
# §3: rank-sharded split axis of the trellis (tile axis 1 for gate/up, 0 for down).
SPLIT_AXIS = {"gate_proj": 1, "up_proj": 1, "down_proj": 0}
LAYOUTS = ("full", "rank-sharded")

LABEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
LAYER_KEY_RE = re.compile(r"^(0|[1-9][0-9]*)$")

STAGE_K = range(1, 7)  # §1.3: stage K 1..6
BASE_K = range(2, 7)  # §1.3: base K 2..6

# §3 runtime key regexes: any `<prefix>.experts` layer part and any label text are parsed, then the
# layer part must be canonical (rule 19) and the component trellis/scale (rule 17).
KEY_RE = re.compile(
    r"^(?P<layer_part>.+\.experts)\.(?P<expert>[0-9]+)\.(?P<proj>gate_proj|up_proj|down_proj)"
    r"\.rank(?P<rank>[0-9]+)\.(?P<component>[A-Za-z0-9]+)_(?P<label>.+)$"
)
CANONICAL_LAYER_RE = re.compile(r"^model\.layers\.(?P<layer>0|[1-9][0-9]*)\.mlp\.experts$")
STAGE_COMPONENTS = ("trellis", "scale")
PROTOTYPE_COMPONENTS = ("suh", "svh", "mcg", "mul1")  # §1.2 prototype leftovers (rule 17)

# §5 closed `hybrid_tr3_tail` profile.
BASE_PROFILE = "exl3-msrt-base/1"
BASE_TENSOR_SCHEMA = "model.layers.{L}.mlp.experts.{E}.{proj}.rank{r}.{trellis|suh|svh|mcg}"
BASE_TENSOR_PARALLEL = {
    "storage_layout": "full-rank",
    "storage_world_size": 1,
    "storage_ranks": [0],
    "runtime_partitioning": "slice-full-rank",
    "slice_alignment": 128,
    "axis_by_projection": dict(AXIS_BY_PROJECTION),
}
BASE_TAIL_FIELDS: tuple[str, ...] = (
    "format",
    "runtime_profile",
    "bits",
    "codebook",
    "moe_layers",
    "moe_layer_coverage",
    "tensor_schema",
    "tensor_parallel",
    "mcg_multiplier",
    "compatibility_sha256",
    "compatibility_by_layer",
    "experts_per_layer",
)
BASE_COMPONENTS = ("trellis", "suh", "svh", "mcg")
MCG_MARKER_BYTES = bytes.fromhex("ed1faccb")  # §6.1: int32 -877912083 little-endian


def stage_key(layer: int, expert: int, proj: str, rank: int, component: str, label: str) -> str:
    """`model.layers.{L}.mlp.experts.{E}.{proj}.rank{r}.{trellis|scale}_{label}` (§3)."""
    return f"model.layers.{layer}.mlp.experts.{expert}.{proj}.rank{rank}.{component}_{label}"


def base_key(layer: int, expert: int, proj: str, component: str) -> str:
    """A base routed-expert tensor name (rank0 storage, §5)."""
    return f"model.layers.{layer}.mlp.experts.{expert}.{proj}.rank0.{component}"


def ceil128(n: int) -> int:
    return -(-n // 128) * 128


def io_sizes(proj: str, hidden: int, intermediate: int) -> tuple[int, int]:
    """(input, output) logical sizes of a projection (§3 geometry table)."""
    return (intermediate, hidden) if proj == "down_proj" else (hidden, intermediate)


def trellis_shape(proj: str, hidden: int, intermediate: int, k: int) -> tuple[int, int, int]:
    """The packed trellis shape `[ceil128(in)/16, ceil128(out)/16, 16·K]` (§3)."""
    i, o = io_sizes(proj, hidden, intermediate)
    return (ceil128(i) // 16, ceil128(o) // 16, 16 * k)


def base_sizes(config: object) -> tuple[int | None, int | None, int | None]:
    """(hidden, MoE intermediate, routed experts) from a base config.json, None where absent."""
    if not isinstance(config, dict):
        return None, None, None

    def first_int(*keys: str) -> int | None:
        for key in keys:
            v = config.get(key)
            if type(v) is int and v > 0:
                return v
        return None

    return (
        first_int("hidden_size"),
        first_int("moe_intermediate_size", "intermediate_size"),
        first_int("num_experts", "n_routed_experts", "num_local_experts"),
    )


def dump_manifest(manifest: Mapping[str, Any]) -> bytes:
    """The bytes exl3tool writes for an adapter_config.json (indent 2, field order kept)."""
    return (json.dumps(manifest, indent=2, ensure_ascii=True) + "\n").encode()


__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_CONSTANTS",
    "ADAPTER_FIELDS",
    "ADAPTER_SCHEMA",
    "AXIS_BY_PROJECTION",
    "BASE_PROFILE",
    "PROJECTIONS",
    "SPLIT_AXIS",
]
