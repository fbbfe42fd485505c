"""Per-rank runtime tables a serving runtime materializes from a cartridge (§1.3, §7).

Pure numpy, no torch: the reference runtime drives its MSRT application from exactly these tables,
and `stage-cartridge` records their summaries. Per layer and projection:

* `stages`: the chain order restricted to the labels present at that layer (stage compaction);
* `bits` int32 [S]: one K per stage, from `chain[].k`, uniform across experts;
* `inverse_scale` float32 [S, E]: `1.0 / scale` computed in double, rejected unless finite and
  within FP32, stored as FP32; 0.0 where the (stage, expert) is sparse, so the kernel skips it;
* `tensor_name` [S][E]: the trellis key of this rank, None where sparse;
* `pointer_name` [S][E]: what the pointer table points at: the tensor itself, or for a sparse
  entry the fallback: the first present expert of that stage and projection, otherwise the
  fallback of the same expert in the previous stage (the first tensor of an earlier stage);
* `max_residual_bits`: the largest K of the layer's bit table.

For a `full` cartridge every rank uses the rank0 keys (the runtime slices at load, §8); for a
`rank-sharded` one, rank r uses the `rank{r}` keys and the world size must match.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from exl3tool.formats.cartridge import Cartridge, StageKey
from exl3tool.formats.names import PROJECTIONS
from exl3tool.io.views import TensorReader

FP32_MAX = float(np.finfo(np.float32).max)


class TablesError(ValueError):
    """The cartridge cannot be materialized (the message names the rule it breaks)."""


@dataclass
class LayerTables:
    layer: int
    num_experts: int
    stages: list[str]
    bits: np.ndarray  # int32 [S]
    inverse_scale: dict[str, np.ndarray]  # proj -> float32 [S, E]
    tensor_name: dict[str, list[list[str | None]]]  # proj -> [S][E]
    pointer_name: dict[str, list[list[str]]]  # proj -> [S][E], fallback resolved
    max_residual_bits: int

    def present(self, proj: str) -> np.ndarray:
        """bool [S, E]: which (stage, expert) entries hold a tensor."""
        return np.array([[n is not None for n in row] for row in self.tensor_name[proj]], bool)

    def summary(self) -> dict[str, Any]:
        """A JSON summary (what `exl3tool-staging.json` records per layer)."""
        return {
            "layer": self.layer,
            "num_experts": self.num_experts,
            "stages": list(self.stages),
            "bits": [int(b) for b in self.bits],
            "max_residual_bits": self.max_residual_bits,
            "present": {p: [int(c) for c in self.present(p).sum(axis=1)] for p in PROJECTIONS},
            "inverse_scale_sha256": {
                p: hashlib.sha256(self.inverse_scale[p].astype("<f4").tobytes()).hexdigest()
                for p in PROJECTIONS
            },
        }


def inverse_scale(scale: float) -> float:
    """§1.2: 1/scale in double; must be finite and representable in FP32."""
    if not math.isfinite(scale) or scale <= 0:
        raise TablesError(f"scale {scale!r} is not finite and positive")
    inv = 1.0 / scale
    if not math.isfinite(inv) or inv > FP32_MAX:
        raise TablesError(f"inverse scale of {scale!r} is not finite in FP32")
    return inv


def _keys_for_rank(
    cart: Cartridge, rank: int, world_size: int
) -> dict[int, dict[tuple[str, str, int], dict[str, StageKey]]]:
    """{layer: {(label, proj, expert): {component: key}}} of the keys this rank reads."""
    layout = cart.layout
    if layout == "rank-sharded":
        if cart.world_size != world_size:
            raise TablesError(
                f"cartridge TP topology world_size={cart.world_size} does not match runtime TP "
                f"size {world_size}"
            )
        want = rank
    elif layout == "full":
        want = 0
    else:
        raise TablesError(f"unknown tensor_parallel layout {layout!r}")
    if not (0 <= rank < world_size):
        raise TablesError(f"invalid TP rank: rank={rank}, size={world_size}")
    out: dict[int, dict[tuple[str, str, int], dict[str, StageKey]]] = {}
    for key in cart.stage_keys():
        if key.layer is None or key.rank != want:
            continue
        slot = out.setdefault(key.layer, {}).setdefault((key.label, key.proj, key.expert), {})
        slot[key.component] = key
    return out


def _read_scale(reader: TensorReader, cart: Cartridge, name: str) -> float:
    ref = cart.keys[name]
    if ref.info.dtype != "F32" or ref.info.shape != ():
        raise TablesError(f"{name}: scale must be a float32 scalar")
    return float(reader.array(ref.shard, ref.info))


def materialize_layer(
    cart: Cartridge,
    layer: int,
    slots: dict[tuple[str, str, int], dict[str, StageKey]],
    num_experts: int,
    reader: TensorReader,
) -> LayerTables:
    chain_k = cart.chain_k()
    present_labels = {label for label, _p, _e in slots}
    unknown = present_labels - set(chain_k)
    if unknown:
        raise TablesError(
            f"layer {layer}: tensor stages are absent from adapter_config.json: {sorted(unknown)}"
        )
    stages = [label for label in cart.chain_labels if label in present_labels]
    S, E = len(stages), num_experts
    bits = np.zeros(S, np.int32)
    inv = {p: np.zeros((S, E), np.float32) for p in PROJECTIONS}
    names: dict[str, list[list[str | None]]] = {
        p: [[None] * E for _ in range(S)] for p in PROJECTIONS
    }
    for s, label in enumerate(stages):
        bits[s] = chain_k[label]
        for (lab, proj, expert), comps in slots.items():
            if lab != label:
                continue
            if not (0 <= expert < E):
                raise TablesError(f"layer {layer}: expert {expert} outside [0, {E})")
            t, sc = comps.get("trellis"), comps.get("scale")
            if t is None or sc is None:
                raise TablesError(
                    f"layer {layer}: {label}/{proj}/expert {expert} lacks a trellis or scale"
                )
            info = cart.keys[t.name].info
            k = info.shape[-1] // 16 if len(info.shape) == 3 else None
            if k != bits[s]:
                raise TablesError(
                    f"{t.name}: chain declares K={int(bits[s])} but tensor contains K={k}; packed "
                    "cartridge stage bitrate must be uniform across experts"
                )
            names[proj][s][expert] = t.name
            inv[proj][s, expert] = np.float32(inverse_scale(_read_scale(reader, cart, sc.name)))
    for s, label in enumerate(stages):
        experts = {e for (lab, _p, e) in slots if lab == label}
        for e in experts:
            missing = [p for p in PROJECTIONS if names[p][s][e] is None]
            if missing:
                raise TablesError(
                    f"Incomplete MSRT cartridge expert stages: layer {layer} stage {label} "
                    f"expert {e} lacks {', '.join(missing)}"
                )
    pointers: dict[str, list[list[str]]] = {}
    for p in PROJECTIONS:
        rows: list[list[str]] = []
        for s in range(S):
            first = next((n for n in names[p][s] if n is not None), None)
            row = []
            for e in range(E):
                n = names[p][s][e]
                if n is None:
                    n = first if first is not None else rows[s - 1][e]
                row.append(n)
            rows.append(row)
        pointers[p] = rows
    return LayerTables(
        layer=layer,
        num_experts=E,
        stages=stages,
        bits=bits,
        inverse_scale=inv,
        tensor_name=names,
        pointer_name=pointers,
        max_residual_bits=int(bits.max()) if S else 0,
    )


MAX_TABLE_EXPERTS = 1 << 16  # far above any MoE's routed experts (256-512 in 2026)


def materialize_tables(
    cartridge: Cartridge, *, rank: int = 0, world_size: int = 1, num_experts: int | None = None
) -> dict[int, LayerTables]:
    """Tables of every selected layer for TP rank `rank` of `world_size`.

    num_experts: the runtime's routed expert count (E of the [S, E] tables); default the base
    size is unknown here, so max(selected_experts) + 1. Raises TablesError on a cartridge the
    runtime would reject while materializing (validate first for complete findings).
    """
    if num_experts is None:
        selected = cartridge.field("selected_experts") or []
        ids = [e for e in selected if type(e) is int]
        num_experts = max(ids) + 1 if ids else 0
    if not 0 <= num_experts <= MAX_TABLE_EXPERTS:  # [S, E] tables: E is a declared count
        raise TablesError(f"{num_experts} routed experts: beyond {MAX_TABLE_EXPERTS} (tables)")
    per_layer = _keys_for_rank(cartridge, rank, world_size)
    with TensorReader() as reader:
        return {
            layer: materialize_layer(cartridge, layer, slots, num_experts, reader)
            for layer, slots in sorted(per_layer.items())
        }


def max_residual_bits(tables: dict[int, LayerTables]) -> int:
    """The model-level `max_residual_bits` (maximum over every bit table; kernel limit 8)."""
    return max((t.max_residual_bits for t in tables.values()), default=0)


__all__ = [
    "LayerTables",
    "TablesError",
    "inverse_scale",
    "materialize_tables",
    "max_residual_bits",
]
