"""Routed-expert tensors of a checkpoint by position, and the config fields that size them.

A model, not a rule: the R7, rank-sliced and inspect paths read the same table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from exl3tool.formats.checkpoint import TensorRef
from exl3tool.io.strict_json import is_json_int

EXPERT_COUNT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts")


def expert_count(config: dict[str, Any] | None) -> tuple[str, int] | None:
    """(key, count) of the routed expert count, whichever field the architecture uses."""
    cfg = config or {}
    for src in (cfg, cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}):
        for key in EXPERT_COUNT_KEYS:
            v = src.get(key)
            if is_json_int(v) and v > 0:
                return key, v
    return None


def config_int(config: dict[str, Any] | None, key: str) -> int | None:
    v = (config or {}).get(key)
    return v if is_json_int(v) else None


@dataclass(frozen=True)
class ExpertTable:
    """Routed-expert tensors by position: (layer, expert, proj) -> field -> ref; rank-sliced ones
    by (layer, expert, proj, rank); layer-level vectors (r7_shared, shared_h) by (layer, name)."""

    plain: dict[tuple[int, int, str], dict[str, TensorRef]] = field(default_factory=dict)
    ranked: dict[tuple[int, int, str, int], dict[str, TensorRef]] = field(default_factory=dict)
    layer_vectors: dict[tuple[int, str], TensorRef] = field(default_factory=dict)
    other: dict[str, TensorRef] = field(default_factory=dict)  # `…mlp.experts.*` not parsed

    def layers(self) -> set[int]:
        out = {k[0] for k in self.plain} | {k[0] for k in self.ranked}
        return out | {k[0] for k in self.layer_vectors}


_PROJ = frozenset(("gate_proj", "up_proj", "down_proj"))


_SMALL = {str(i): i for i in range(1024)}  # layer/expert/rank indices: a dict hit, not a parse


def _index(s: str) -> int | None:
    """A decimal index without sign or leading zeros (as the loaders' regexes accept)."""
    i = _SMALL.get(s)
    if i is not None:
        return i
    if s.isdigit() and s.isascii() and s[0] != "0":
        return int(s)
    return None


def expert_table(tensors: dict[str, TensorRef]) -> ExpertTable:
    """Index every `model.layers.L.mlp.experts.…` tensor: one split per name (the hot path of a
    GLM-5.2 checkpoint, 176,000 names)."""
    table = ExpertTable()
    plain, ranked, vectors, other = table.plain, table.ranked, table.layer_vectors, table.other
    for name, ref in tensors.items():
        if ".mlp.experts." not in name:
            continue
        p = name.split(".")
        layer = _index(p[2]) if len(p) >= 6 else None
        if p[0] != "model" or p[1] != "layers" or p[3:5] != ["mlp", "experts"] or layer is None:
            other[name] = ref
            continue
        who = p[5]
        if who in ("r7_shared", "shared_h"):
            if len(p) > 6:
                vectors[(layer, ".".join(p[5:]))] = ref
            else:
                other[name] = ref
            continue
        expert = _index(who)
        if expert is None or len(p) not in (8, 9) or p[6] not in _PROJ:
            other[name] = ref
            continue
        if len(p) == 8:
            entry = plain.get((layer, expert, p[6]))
            if entry is None:
                entry = plain[(layer, expert, p[6])] = {}
            entry[p[7]] = ref
            continue
        rank = _index(p[7][4:]) if p[7].startswith("rank") else None
        if rank is None:
            other[name] = ref
            continue
        ranked.setdefault((layer, expert, p[6], rank), {})[p[8]] = ref
    return table
