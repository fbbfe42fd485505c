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


def model_config(config: Any) -> dict[str, Any]:
    """The decoder's settings: config.json with its `text_config` (vision-language models)
    laid over it; {} for a config that is not an object."""
    cfg = config if isinstance(config, dict) else {}
    text = cfg.get("text_config")
    return {**cfg, **text} if isinstance(text, dict) else cfg


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
    """Index every `model.layers.L.mlp.experts.…` tensor (the hot path of a GLM-5.2 checkpoint,
    176,000 names): a name is split once per `{prefix}` before its last dot, which a
    projection's trellis, markers and vectors share; its field is then only a key."""
    table = ExpertTable()
    where: dict[str, Any] = {}  # prefix -> the entry dict, ("vector", layer, head), or None
    other = table.other
    for name, ref in tensors.items():
        if ".mlp.experts." not in name:
            continue
        prefix, _, field = name.rpartition(".")
        hit = where.get(prefix, _UNSEEN)
        if hit is _UNSEEN:
            hit = where[prefix] = _place(table, prefix)
        if type(hit) is dict:
            hit[field] = ref
        elif hit is None:
            other[name] = ref
        elif hit[0] == "vector":
            table.layer_vectors[(hit[1], hit[2] + field)] = ref
        else:  # a prefix of fewer than 6 segments: its field takes part in the parse
            _add(table, name, ref)
    return table


_UNSEEN = object()


def _place(table: ExpertTable, prefix: str) -> Any:
    """Where every name `{prefix}.{field}` goes, as `_add` would place it."""
    p = prefix.split(".")
    if len(p) < 6:
        return ("name",)
    layer = _index(p[2])
    if p[0] != "model" or p[1] != "layers" or p[3:5] != ["mlp", "experts"] or layer is None:
        return None
    who = p[5]
    if who in ("r7_shared", "shared_h"):
        return ("vector", layer, ".".join(p[5:]) + ".")
    expert = _index(who)
    if expert is None or len(p) not in (7, 8) or p[6] not in _PROJ:
        return None
    if len(p) == 7:
        entry = table.plain.get((layer, expert, p[6]))
        if entry is None:
            entry = table.plain[(layer, expert, p[6])] = {}
        return entry
    rank = _index(p[7][4:]) if p[7].startswith("rank") else None
    if rank is None:
        return None
    entry = table.ranked.get((layer, expert, p[6], rank))
    if entry is None:
        entry = table.ranked[(layer, expert, p[6], rank)] = {}
    return entry


def _add(table: ExpertTable, name: str, ref: TensorRef) -> None:
    """Place one `…mlp.experts.…` name by its segments (the reference for `_place`)."""
    plain, ranked, vectors, other = table.plain, table.ranked, table.layer_vectors, table.other
    p = name.split(".")
    layer = _index(p[2]) if len(p) >= 6 else None
    if p[0] != "model" or p[1] != "layers" or p[3:5] != ["mlp", "experts"] or layer is None:
        other[name] = ref
        return
    who = p[5]
    if who in ("r7_shared", "shared_h"):
        if len(p) > 6:
            vectors[(layer, ".".join(p[5:]))] = ref
        else:
            other[name] = ref
        return
    expert = _index(who)
    if expert is None or len(p) not in (8, 9) or p[6] not in _PROJ:
        other[name] = ref
        return
    if len(p) == 8:
        plain.setdefault((layer, expert, p[6]), {})[p[7]] = ref
        return
    rank = _index(p[7][4:]) if p[7].startswith("rank") else None
    if rank is None:
        other[name] = ref
        return
    ranked.setdefault((layer, expert, p[6], rank), {})[p[8]] = ref
