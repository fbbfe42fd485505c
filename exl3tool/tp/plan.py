"""The slicing plan: which bytes of which tensor each TP rank holds. Pure: headers only, no I/O.

Rules (docs/formats/exl3.md §6; docs/formats/r7.md §3.4, §7.1; docs/formats/msrt.md §5, §8):
* routed experts, `--mode tensor`: gate/up column-parallel, down row-parallel, on N equal
  128-aligned ranges of the expert intermediate size; `--mode expert`: whole experts, contiguous
  per rank, as even as possible;
* R7 `r7_shared.gate_up_suh` / `down_svh` are hidden-side: replicated; markers replicated;
* dense EXL3 linears by role: q/k/v/gate/up (and lm_head) column-parallel, o/down row-parallel;
  attention split by KV heads widened to 128-channel units (config `num_key_value_heads`,
  `head_dim`); other dense splits in whole 128-channel blocks, as even as possible;
* anything else is replicated; a linear that no rule can split is also reported (TP003);
* a split that cuts a Hadamard block (TP001) or leaves a rank empty (TP002) refuses the plan.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from exl3tool.formats.checkpoint import Checkpoint, TensorRef
from exl3tool.formats.detect import Kind
from exl3tool.formats.exl3 import group_linears
from exl3tool.formats.experts import model_config
from exl3tool.formats.names import R7_SHARED_RE, ExpertPrefixes, parse_expert, split_field
from exl3tool.formats.tail import RANK_SLICED_K
from exl3tool.rules import tp as tp_rules
from exl3tool.rules.registry import Findings, Rule
from exl3tool.tp.linear import field_cut, field_size
from exl3tool.tp.ranges import HAD, SplitError, channel_ranges, expert_ranges, intermediate_ranges
from exl3tool.tp.slices import (
    LAYOUTS,
    MODES,
    PlanRefused,
    RankPlan,
    Reported,
    SlicePlan,
    TensorSlice,
    new_slice,
)

COLUMN = frozenset(("gate_proj", "up_proj", "w1", "w3", "lm_head"))
ROW = frozenset(("down_proj", "w2"))
ATTENTION = frozenset(("q_proj", "k_proj", "v_proj", "o_proj"))
EXPERT_ROLE = {"gate_proj": "column", "up_proj": "column", "down_proj": "row"}
SLICEABLE_KINDS = (Kind.EXL3, Kind.R7, Kind.MSRT_BASE, Kind.SAFETENSORS, Kind.UNKNOWN)
# per-expert fields that the R7 shared vectors become in the rank-sliced layout (§3.1)
SHARED_VECTORS = {
    "gate_up_suh": (("gate_proj", "suh"), ("up_proj", "suh")),
    "down_svh": (("down_proj", "svh"),),
}


@dataclass(frozen=True)
class _Split:
    """How one linear group is cut: `ranges[r]` = channels of rank r (None: whole / not held)."""

    role: str
    ranges: tuple[tuple[int, int], ...]  # a tuple: a cut is hashable (build memoizes by it)


@dataclass(frozen=True)
class _Owner:
    """Expert parallel: the whole group lives on one rank."""

    rank: int


class _Refusals:
    """Refused splits, one finding per distinct reason (first tensor named, the rest counted)."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], list] = {}

    def add(self, rule: Rule, message: str, tensor: str) -> None:
        entry = self._seen.setdefault((rule.code, message), [rule, tensor, 0])
        entry[2] += 1

    def raise_if_any(self) -> None:
        if not self._seen:
            return
        f = Findings()
        for (_code, msg), (rule, tensor, n) in self._seen.items():
            more = f" ({n - 1} more tensors with the same geometry)" if n > 1 else ""
            f.add(rule, msg + more, tensor=tensor)
        raise PlanRefused(f)


def source_order(ckpt: Checkpoint) -> list[str]:
    """Tensor names in the order of one sequential pass: shard by shard, by payload offset."""
    return sorted(ckpt.tensors, key=lambda n: (ckpt.tensors[n].file, ckpt.tensors[n].info.begin))


def _check_bounds(
    name: str, axis: int | None, start: int, stop: int, shape: tuple[int, ...]
) -> None:
    if axis is not None and (axis >= len(shape) or stop > shape[axis]):
        what = "exceeds" if axis < len(shape) else "is past the last axis of"
        raise _refuse_input(
            f"slice [{start}, {stop}) on axis {axis} {what} shape {list(shape)}; "
            "the linear's tensors disagree in size (run `exl3tool validate`)",
            name,
        )


def _refuse_input(message: str, tensor: str | None = None) -> PlanRefused:
    f = Findings()
    f.add(tp_rules.TP_UNSUPPORTED, message, tensor=tensor)
    return PlanRefused(f)


def _int(cfg: dict, key: str) -> int | None:
    v = cfg.get(key)
    return v if type(v) is int and v > 0 else None


def attention_geometry(config: dict | None) -> tuple[int, int] | None:
    """(num_key_value_heads, head_dim) from config.json, or None when it does not say."""
    cfg = model_config(config)
    kv = _int(cfg, "num_key_value_heads") or _int(cfg, "num_attention_heads")
    head_dim = _int(cfg, "head_dim")
    if head_dim is None and _int(cfg, "hidden_size") and _int(cfg, "num_attention_heads"):
        hs, nh = cfg["hidden_size"], cfg["num_attention_heads"]
        head_dim = hs // nh if hs % nh == 0 else None
    return (kv, head_dim) if kv and head_dim else None


def _dims(ref: TensorRef) -> tuple[int, int] | None:
    s = ref.info.shape
    return (s[0] * 16, s[1] * 16) if len(s) == 3 else None


def _anchor(group) -> str:
    """The tensor that names a linear group in messages (its trellis when present)."""
    return (group.trellis or next(iter(group.parts.values()))).name


def _group_size(role: str, parts: dict[str, TensorRef]) -> int | None:
    """Channels on the split side, from the trellis (else from a sliced vector)."""
    order = ("trellis", "svh", "suh", "sv", "su", "bias")
    for fld in order:
        ref = parts.get(fld)
        if ref is not None:
            n = field_size(role, fld, ref.info.shape)
            if n is not None:
                return n
    return None


class _Planner:
    def __init__(self, ckpt: Checkpoint, kind: Kind, tp: int, mode: str, layout: str) -> None:
        self.ckpt, self.kind, self.tp, self.mode, self.layout = ckpt, kind, tp, mode, layout
        self.refusals = _Refusals()
        self.reported: list[Reported] = []
        self.splits: dict[str, _Split | _Owner | None] = {}  # group prefix -> cut (None: whole)
        self.group_of: dict[str, tuple[str, str]] = {}  # tensor -> (prefix, field)
        self.expert_groups: set[str] = set()
        self.layer_experts: dict[str, list[int]] = {}  # "model.layers.L.mlp.experts" -> ids

    # --- classification ----------------------------------------------------------------
    def classify(self) -> None:
        tensors = self.ckpt.tensors
        experts: dict[str, dict[str, TensorRef]] = {}
        rest: dict[str, TensorRef] = {}
        # rank0 names hold full logical tensors when no other rank exists (MSRT bases, a tp=1
        # legacy tail such as R7's carried MTP layer: docs/formats/r7.md §6, §7.1)
        parse = ExpertPrefixes().logical  # (prefix, rank, field) per name, or None
        parsed = [(name, ref, parse(name)) for name, ref in tensors.items()]
        multi = {e[0] for _, _, e in parsed if e is not None and e[1]}
        for name, ref, e in parsed:
            if e is not None and (e[1] is None or (e[1] == 0 and e[0] not in multi)):
                experts.setdefault(e[0], {})[e[2]] = ref
                self.group_of[name] = (e[0], e[2])
            elif e is not None:
                self.reported.append(
                    Reported(name, f"already rank-sliced (rank{e[1]}); carried whole")
                )
            else:
                rest[name] = ref
        self.expert_groups = set(experts)
        for prefix in experts:
            layer_prefix, _, eid = prefix.rpartition(".")[0].rpartition(".")
            self.layer_experts.setdefault(layer_prefix, []).append(int(eid))
        for ids in self.layer_experts.values():
            ids[:] = sorted(set(ids))
        if self.mode == "expert":
            self._plan_expert_parallel(experts)
        else:
            for prefix, parts in experts.items():
                role = EXPERT_ROLE[prefix.rpartition(".")[2]]
                self._split_equal(prefix, role, parts)
        dense = group_linears({n: r for n, r in rest.items() if not R7_SHARED_RE.match(n)})
        for prefix, g in dense.items():
            for fld, ref in g.parts.items():
                self.group_of[ref.name] = (prefix, fld)
        self._plan_dense(dense)
        for name in rest:
            if name in self.group_of or R7_SHARED_RE.match(name):
                continue
            prefix, fld = split_field(name)
            leaf = prefix.rpartition(".")[2]
            if fld == "weight" and (leaf in COLUMN | ROW | ATTENTION):
                self.reported.append(Reported(name, "unquantized linear; not split"))

    def _split_equal(self, prefix: str, role: str, parts: dict[str, TensorRef]) -> None:
        size = _group_size(role, parts)
        anchor = (parts.get("trellis") or next(iter(parts.values()))).name
        if size is None:
            self.splits[prefix] = None
            self.reported.append(Reported(anchor, "no sliceable field; carried whole"))
            return
        try:
            self.splits[prefix] = _Split(role, tuple(intermediate_ranges(size, self.tp)))
        except SplitError as exc:
            self.refusals.add(exc.rule, f"expert intermediate {exc}", anchor)

    def _plan_expert_parallel(self, experts: dict[str, dict[str, TensorRef]]) -> None:
        by_layer: dict[str, set[int]] = {}
        for prefix in experts:
            head, _, _proj = prefix.rpartition(".")
            layer_prefix, _, eid = head.rpartition(".")
            by_layer.setdefault(layer_prefix, set()).add(int(eid))
        owner: dict[tuple[str, int], int] = {}
        for layer_prefix, ids in by_layer.items():
            order = sorted(ids)
            try:
                ranges = expert_ranges(len(order), self.tp)
            except SplitError as exc:
                self.refusals.add(exc.rule, str(exc), f"{layer_prefix}.{order[0]}")
                continue
            for r, (a, b) in enumerate(ranges):
                for e in order[a:b]:
                    owner[(layer_prefix, e)] = r
        for prefix in experts:
            head, _, _proj = prefix.rpartition(".")
            layer_prefix, _, eid = head.rpartition(".")
            r = owner.get((layer_prefix, int(eid)))
            if r is not None:
                self.splits[prefix] = _Owner(r)

    def _plan_dense(self, dense: dict) -> None:
        geometry = attention_geometry(self.ckpt.config)
        attn: dict[str, dict[str, object]] = {}
        for prefix, g in dense.items():
            parent, _, leaf = prefix.rpartition(".")
            if leaf in ATTENTION:
                attn.setdefault(parent, {})[leaf] = g
            elif leaf in COLUMN or leaf in ROW:
                role = "column" if leaf in COLUMN else "row"
                size = _group_size(role, g.parts)
                anchor = _anchor(g)
                if size is None:
                    self._whole(prefix, anchor, "no sliceable field")
                    continue
                try:
                    self.splits[prefix] = _Split(role, tuple(channel_ranges(size, self.tp)))
                except SplitError as exc:
                    self.refusals.add(exc.rule, f"{role}-parallel {leaf}: {exc}", anchor)
            else:
                self._whole(prefix, _anchor(g), f"no TP role for '{leaf}'")
        for parent, projs in attn.items():
            self._plan_attention(parent, projs, geometry)

    def _whole(self, prefix: str, anchor: str, why: str) -> None:
        self.splits[prefix] = None
        self.reported.append(Reported(anchor, f"{why}; replicated"))

    def _plan_attention(self, parent: str, projs: dict, geometry) -> None:
        anchor_name = _anchor(next(iter(projs.values())))
        if geometry is None:
            for leaf, g in projs.items():
                why = "attention without num_key_value_heads/head_dim in config.json"
                self._whole(f"{parent}.{leaf}", _anchor(g), why)
            return
        kv, head_dim = geometry
        unit_heads = HAD // math.gcd(HAD, head_dim)  # smallest KV-head count 128 channels wide
        widths: dict[str, int] = {}
        for leaf, g in projs.items():
            role = "row" if leaf == "o_proj" else "column"
            size = _group_size(role, g.parts)
            if (
                size is None
                or size % kv
                or (leaf in ("k_proj", "v_proj") and size != kv * head_dim)
            ):
                widths = {}
                break
            widths[leaf] = size // kv
        if not widths or kv % unit_heads or any((w * unit_heads) % HAD for w in widths.values()):
            why = f"attention ({kv} KV heads x {head_dim}) does not split into 128-channel KV-head units"
            for leaf, g in projs.items():
                self._whole(f"{parent}.{leaf}", _anchor(g), why)
            return
        try:
            units = channel_ranges(kv // unit_heads, self.tp, unit=1)
        except SplitError as exc:
            self.refusals.add(
                exc.rule,
                f"attention {kv // unit_heads} KV-head units of {unit_heads} heads: {exc}",
                anchor_name,
            )
            return
        for leaf in projs:
            w = widths[leaf] * unit_heads
            role = "row" if leaf == "o_proj" else "column"
            self.splits[f"{parent}.{leaf}"] = _Split(role, tuple((a * w, b * w) for a, b in units))

    # --- slices ------------------------------------------------------------------------
    def build(self) -> SlicePlan:
        self.classify()
        self.refusals.raise_if_any()
        order = source_order(self.ckpt)
        ranks = [RankPlan(r) for r in range(self.tp)]
        tensors, group_of, splits = self.ckpt.tensors, self.group_of, self.splits
        per_rank = self.layout == "per-rank"
        appends = [rp.slices.append for rp in ranks]
        # per rank, a tensor's slices in the per-rank layout are its own name's and depend on
        # nothing else but its cut, field, shape and dtype: computed once for each such kind (a
        # few dozen in a model of 10^5 tensors), then stamped with the name
        memo: dict[tuple[Any, ...], list[list[tuple[Any, ...]]]] = {}
        for name in order:
            info = tensors[name].info
            shape, dtype = tuple(info.shape), info.dtype
            group = group_of.get(name)
            cut = splits.get(group[0]) if group else None
            shared = R7_SHARED_RE.match(name)
            if not per_rank:
                for r, append in enumerate(appends):
                    for target, axis, start, stop, rep in self._cuts(
                        name, group, cut, shared, r, shape
                    ):
                        _check_bounds(name, axis, start, stop, shape)
                        append(TensorSlice(name, target, axis, start, stop, rep, dtype, shape))
                continue
            key = (shared is not None, cut, group[1] if group else None, shape, dtype)
            rows = memo.get(key)
            if rows is None:
                rows = memo[key] = self._rows(name, group, cut, shared, shape, dtype)
            for append, rank_rows in zip(appends, rows, strict=True):
                for axis, start, stop, rep, sliced, nbytes in rank_rows:
                    append(
                        new_slice(name, name, axis, start, stop, rep, dtype, shape, sliced, nbytes)
                    )
        return SlicePlan(
            self.kind.value, self.tp, self.mode, self.layout, ranks, self.reported, order
        )

    def _rows(
        self,
        name: str,
        group: tuple[str, str] | None,
        cut: _Split | _Owner | None,
        shared: re.Match[str] | None,
        shape: tuple[int, ...],
        dtype: str,
    ) -> list[list[tuple[Any, ...]]]:
        """Per rank, (axis, start, stop, replicated, shape, nbytes) of each slice of a tensor
        like `name` in the per-rank layout; raises for a cut past its shape (named `name`)."""
        rows = []
        for r in range(self.tp):
            rank_rows = []
            for _target, axis, start, stop, rep in self._cuts(name, group, cut, shared, r, shape):
                _check_bounds(name, axis, start, stop, shape)
                s = TensorSlice(name, name, axis, start, stop, rep, dtype, shape)
                rank_rows.append((axis, start, stop, rep, s.shape, s.nbytes))
            rows.append(rank_rows)
        return rows

    def _cuts(self, name, group, cut, shared, r, shape):
        """(target, axis, start, stop, replicated) entries of `name` on rank r."""
        rank_sliced = self.layout == "rank-sliced"
        if shared is not None:
            if not rank_sliced:
                return [(name, None, 0, 0, True)]
            # per_expert_v1: every expert carries the layer's hidden-side vector (§3.1, §7.1)
            experts = name.rpartition(".r7_shared.")[0]
            return [
                (f"{experts}.{e}.{proj}.rank{r}.{fld}", None, 0, 0, True)
                for e in self.layer_experts.get(experts, ())
                for proj, fld in SHARED_VECTORS[shared.group("field")]
            ]
        is_expert = group is not None and group[0] in self.expert_groups
        if rank_sliced and not is_expert:
            # the legacy profile rank-slices routed experts only; the rest is stored once
            return [(name, None, 0, 0, False)] if r == 0 else []
        target = f"{group[0]}.rank{r}.{group[1]}" if rank_sliced else name
        if cut is None:
            return [(target, None, 0, 0, True)]
        if isinstance(cut, _Owner):
            return [(target, None, 0, 0, False)] if cut.rank == r else []
        fc = field_cut(cut.role, group[1], *cut.ranges[r])
        if not fc.present:
            return []
        if fc.axis is None:
            return [(target, None, 0, 0, fc.replicated)]
        return [(target, fc.axis, fc.start, fc.stop, False)]


def plan_slices(
    ckpt: Checkpoint, kind: Kind | str, tp: int, mode: str = "tensor", *, layout: str = "per-rank"
) -> SlicePlan:
    """The plan for `tp` ranks; raises PlanRefused (TP001/TP002/TP009 findings) when impossible."""
    kind = Kind(kind)
    if type(tp) is not int or tp < 1:
        raise ValueError(f"TP size must be a positive integer, got {tp!r}")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {MODES}")
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of {LAYOUTS}")
    if kind not in SLICEABLE_KINDS:
        raise _refuse_input(f"a {kind.value} artifact cannot be sliced by this planner")
    if layout == "rank-sliced" and mode != "tensor":
        raise _refuse_input("the rank-sliced layout splits experts by tensor (--mode tensor) only")
    if not ckpt.tensors:
        raise _refuse_input("the artifact has no readable tensors")
    cartridge_only: dict[int, int] = {}
    if layout == "rank-sliced":
        _check_uniform_expert_k(ckpt)
        _check_contiguous_layers(ckpt)
        layer_ks = _layer_ks(ckpt)
        _check_two_tiers(layer_ks)
        cartridge_only = _check_served_k(layer_ks)
    plan = _Planner(ckpt, kind, tp, mode, layout).build()
    plan.cartridge_only = cartridge_only
    return plan


def _check_served_k(layer_ks: dict[int, set[int]]) -> dict[int, int]:
    """The K the output's tail will declare is served by some runtime revision (TP014); the
    layers of a uniform tail that only the cartridge revision serves (K 2: TP013, a warning)."""
    every = sorted({k for ks in layer_ks.values() for k in ks})
    if len(every) == 1:  # a uniform tail: bits K
        (k,) = every
        if k in RANK_SLICED_K["public"]:
            return {}
        if k in RANK_SLICED_K["cartridge"]:
            return {layer: k for layer in sorted(layer_ks)}
        why = f"every expert is K {k}: a uniform rank-sliced tail runs at K 3..6 (2..6 on the "
        why += "cartridge revision)"
    else:  # a mixed tail: k_values
        odd = [k for k in every if k not in RANK_SLICED_K["public"]]
        if not odd:
            return {}
        why = f"the experts use K {every}, so the tail is mixed, and a mixed tail runs only "
        why += f"with every K in 3..6 (not {odd})"
    f = Findings()
    layer = min(layer_ks)
    f.add(
        tp_rules.TP_UNSERVED_K,
        f"{why}: no runtime revision serves it; use --layout per-rank",
        tensor=f"model.layers.{layer}.mlp.experts",
    )
    raise PlanRefused(f)


def _check_uniform_expert_k(ckpt: Checkpoint) -> None:
    """The legacy profile records one K per expert (tier_bitmap `k`, §7.1): refuse experts whose
    projections differ in K (R7 chooses K per projection, §3.2)."""
    ks: dict[tuple[int, int], dict[str, int]] = {}
    for name, ref in ckpt.tensors.items():
        e = parse_expert(name)
        if e is not None and e.field == "trellis" and len(ref.info.shape) == 3:
            ks.setdefault((e.layer, e.expert), {})[e.proj] = ref.info.shape[2] // 16
    mixed = sorted(key for key, by_proj in ks.items() if len(set(by_proj.values())) > 1)
    if mixed:
        layer, expert = mixed[0]
        detail = ", ".join(f"{p} K={k}" for p, k in sorted(ks[mixed[0]].items()))
        more = f" ({len(mixed) - 1} more experts)" if len(mixed) > 1 else ""
        raise _refuse_input(
            f"the rank-sliced layout records one K per expert; layer {layer} expert {expert} has "
            f"{detail}{more}: use --layout per-rank",
            f"model.layers.{layer}.mlp.experts.{expert}",
        )


def _check_contiguous_layers(ckpt: Checkpoint) -> None:
    """The legacy profile declares its MoE layers as one range that the runtime claims whole
    (TP011): refuse experts that leave a layer of [first, last] without tensors."""
    layers = sorted(
        {e.layer for e in map(parse_expert, ckpt.tensors) if e is not None and e.field == "trellis"}
    )
    if not layers or layers[-1] - layers[0] + 1 == len(layers):
        return
    gaps = sorted(set(range(layers[0], layers[-1] + 1)) - set(layers))
    f = Findings()
    f.add(
        tp_rules.TP_SPARSE_LAYERS,
        f"MoE layers {layers} are not contiguous: the legacy profile would declare moe_layers "
        f"[{layers[0]}, {layers[-1]}] and the runtime would look for experts in layers "
        f"{gaps[:8]}{' …' if len(gaps) > 8 else ''}; use --layout per-rank",
        tensor=f"model.layers.{gaps[0]}.mlp.experts",
    )
    raise PlanRefused(f)


def _layer_ks(ckpt: Checkpoint) -> dict[int, set[int]]:
    """The K of each layer's expert trellises (the rank-sliced tail's `bits` or tier_bitmap)."""
    ks: dict[int, set[int]] = {}
    for name, ref in ckpt.tensors.items():
        e = parse_expert(name) if name.endswith(".trellis") else None
        if e is not None and len(ref.info.shape) == 3:
            ks.setdefault(e.layer, set()).add(ref.info.shape[2] // 16)
    return ks


def _check_two_tiers(ks: dict[int, set[int]]) -> None:
    """The legacy profile's mixed path serves exactly two bitrates per layer (TP012)."""
    bad = sorted(layer for layer, k in ks.items() if len(k) > 2)
    if bad:
        f = Findings()
        f.add(
            tp_rules.TP_TIERS,
            f"layer {bad[0]} uses K {sorted(ks[bad[0]])}"
            + (f" ({len(bad) - 1} more layers)" if len(bad) > 1 else "")
            + ": the runtime's mixed rank-sliced path serves two; use --layout per-rank",
            tensor=f"model.layers.{bad[0]}.mlp.experts",
        )
        raise PlanRefused(f)


__all__ = ["attention_geometry", "plan_slices", "source_order"]
