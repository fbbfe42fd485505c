"""The per-layer steps of verify-swap: inputs, hot and cold outputs, and the comparisons.

`cold_pass` walks one layer's experts in ascending order and decodes each cold expert once
(straight from the original files, `runtime.cold`), then uses it for everything that needs it
before dropping it: its probe and routed outputs, the table and effective-weight comparison with
the hot runtime, the TP concatenation, the TP=1 reference outputs and the quality ladder. A layer
therefore never holds more than one cold expert (memory bound, issue 16).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from exl3tool.runtime import cold, quality
from exl3tool.runtime.base import BaseModel
from exl3tool.runtime.compare import Diff, Tally, compare
from exl3tool.runtime.distributed import Comm
from exl3tool.runtime.engine import SwapEngine
from exl3tool.runtime.moe import Routing, route, tokens_needed

Outputs = dict[int, tuple[torch.Tensor, torch.Tensor]]  # layer -> (block output, expert probe)


@dataclass
class Inputs:
    x: dict[int, torch.Tensor]
    routing: dict[int, Routing]
    experts: list[int]


def make_inputs(base: BaseModel, tokens: int, seed: int, device: torch.device) -> Inputs:
    xs, rs = {}, {}
    for L in base.layers:
        router = base.routers.get(L)
        T = tokens if router is not None else tokens_needed(tokens, base.num_experts, base.topk)
        g = torch.Generator().manual_seed(seed * 1000003 + L)
        x = torch.randn((T, base.hidden), generator=g).half().to(device)
        xs[L] = x
        rs[L] = route(x, router, base.num_experts, base.topk, seed + L)
    return Inputs(xs, rs, list(range(base.num_experts)))


def hot_outputs(engine: SwapEngine, inp: Inputs) -> Outputs:
    return {
        L: (engine.forward(L, x, inp.routing[L]), engine.probe(L, x, inp.experts))
        for L, x in inp.x.items()
    }


def exact(got: Outputs, want: Outputs, tally: Tally | None = None) -> Tally:
    t = tally or Tally()
    for L in sorted(want):
        t.add(compare(got[L][0], want[L][0], f"layer {L} block output"))
        t.add(compare(got[L][1], want[L][1], f"layer {L} expert probe"))
    return t


# --- tables and effective weights, hot vs cold ----------------------------------------------


def _mismatch(where: str, got: Any, want: Any, size: float) -> Diff:
    return Diff(False, size, 1.0, {"where": where, "index": None, "got": got, "want": want})


def compare_tables(
    engine: SwapEngine, layer: int, ex: cold.ColdExpert, comm: Comm, tally: Tally
) -> None:
    """Bit-level comparison of what the hot runtime applies for one expert with the cold build.

    Per projection: the base W_eff; the list of applied stages (labels in chain order, so a
    sparse entry given a non-zero inverse scale, or a dropped stage, is a difference); and per
    stage its K, its FP32 inverse scale (bit pattern) and its decoded W_eff (this rank's cut)."""
    rank, world = comm.rank, comm.world_size
    rt = engine.active.get(layer)
    e = ex.expert
    for p in cold.PROJS:
        where = f"layer {layer} expert {e} {p}"
        hot_w = engine.base.linears[layer][(e, p)].linear.weight
        tally.add(compare(hot_w, cold.rank_cut(ex.base[p], p, rank, world), f"{where} base W_eff"))
        terms = rt.terms_for(e, p) if rt is not None else []
        got = [t.label for t in terms]
        want = [s.label for s in ex.stages[p]]
        if got != want:
            extra = [float(t.inverse_scale) for t in terms if t.label not in want]
            size = max([abs(v) for v in extra] + [float(s.inverse_scale) for s in ex.stages[p]])
            tally.add(_mismatch(f"{where}: applied stages", str(got), str(want), size))
            continue
        for t, s in zip(terms, ex.stages[p], strict=True):
            at = f"{where} stage {s.label}"
            if t.k != s.k:
                tally.add(_mismatch(f"{at} K", t.k, s.k, float(abs(t.k - s.k))))
            tally.add(compare(t.inverse_scale.cpu(), s.inverse_scale.cpu(), f"{at} inverse scale"))
            tally.add(
                compare(t.linear.weight, cold.rank_cut(s.weight, p, rank, world), f"{at} W_eff")
            )


def concat_expert(
    engine: SwapEngine, layer: int, ex: cold.ColdExpert, comm: Comm, tally: Tally
) -> None:
    """Gather every rank's decoded weights of one expert; they must concatenate (gate/up on the
    output axis, down on the input axis) to the full TP=1 weights bit for bit."""
    rt = engine.active.get(layer)
    for p in cold.PROJS:
        e = ex.expert
        ts = rt.terms_for(e, p) if rt is not None else []
        local = [engine.base.linears[layer][(e, p)].linear.weight, *(t.linear.weight for t in ts)]
        full = [ex.base[p], *(s.weight for s in ex.stages[p])]
        counts = comm.gather_objects(len(local))
        if len(set(counts)) != 1 or counts[0] != len(full):
            tally.add(_mismatch(f"layer {layer} expert {e} {p}: stage count", counts, len(full), 1))
            continue
        for s, (w, ref) in enumerate(zip(local, full, strict=True)):
            cat = torch.cat(comm.all_gather(w), dim=0 if p == "down_proj" else 1)
            what = "base" if s == 0 else f"stage {s}"
            tally.add(compare(cat, ref, f"layer {layer} expert {e} {p} {what} W_eff"))


# --- the cold pass over one layer --------------------------------------------------------------


@dataclass
class ColdPass:
    """What one streaming pass over a cold layer produced."""

    outputs: Outputs = field(default_factory=dict)
    tp1: Outputs = field(default_factory=dict)  # TP=1 outputs (full weights), when asked for
    tables: Tally = field(default_factory=Tally)
    concat: Tally = field(default_factory=Tally)
    quality: list[quality.StageStats] = field(default_factory=list)


@dataclass
class ColdPassSpec:
    index: cold.ColdIndex
    layer: int
    inp: Inputs
    comm: Comm
    device: torch.device
    engine: SwapEngine | None = None  # compare tables/weights with this hot runtime
    tp1: bool = False
    ladder: Callable[[cold.ColdExpert], list[quality.StageStats]] | None = None


class _Accum:
    """Block output (fp32, experts in ascending order) and probe rows of one weight cut."""

    def __init__(self, x: torch.Tensor, hidden: int) -> None:
        self.out32 = torch.zeros((x.shape[0], hidden), dtype=torch.float32, device=x.device)
        self.probes: list[torch.Tensor] = []

    def add(self, fn, x: torch.Tensor, routing: Routing, e: int, routed: bool) -> None:
        self.probes.append(fn(x))
        if routed:
            tok, slot = (routing.ids == e).nonzero(as_tuple=True)
            self.out32.index_add_(0, tok, fn(x[tok]) * routing.weights[tok, slot].unsqueeze(1))

    def finish(self, reduce) -> tuple[torch.Tensor, torch.Tensor]:
        # the same collectives in the same order as SwapEngine.forward then .probe
        return reduce(self.out32).half(), reduce(torch.stack(self.probes))


def cold_pass(spec: ColdPassSpec) -> ColdPass:
    L, comm = spec.layer, spec.comm
    x, routing = spec.inp.x[L], spec.inp.routing[L]
    routed = set(routing.routed_experts())
    hidden = x.shape[1]
    res = ColdPass()
    acc, acc1 = _Accum(x, hidden), _Accum(x, hidden)
    # the next experts' files are read on threads while this one decodes (runtime.cold)
    for ex in spec.index.experts(L, spec.inp.experts, spec.device):
        e = ex.expert
        acc.add(cold.expert_weights_fn(ex, comm.rank, comm.world_size), x, routing, e, e in routed)
        if spec.tp1:
            acc1.add(cold.expert_weights_fn(ex, 0, 1), x, routing, e, e in routed)
        if spec.engine is not None:
            compare_tables(spec.engine, L, ex, comm, res.tables)
            if comm.world_size > 1:
                concat_expert(spec.engine, L, ex, comm, res.concat)
        if spec.ladder is not None:
            res.quality.extend(spec.ladder(ex))
        del ex
    res.outputs[L] = acc.finish(comm.all_reduce_sum)
    if spec.tp1:
        res.tp1[L] = acc1.finish(lambda t: t)
    return res


def merge_stats(into: dict[tuple[int, int], quality.StageStats], stats) -> None:
    """Fold per-expert ladder statistics into per-(layer, stage) ones."""
    for st in stats:
        key = (st.layer, st.stage)
        have = into.get(key)
        if have is None:
            into[key] = st
            continue
        have.experts |= st.experts
        have.ratio.extend(st.ratio)
        have.rel_next.extend(st.rel_next)
        have.rel_dense.extend(st.rel_dense)
        have.failures.extend(st.failures)


def ladder_fn(
    layer: int,
    base_label: str,
    base_k: int,
    chain_k: dict[str, int],
    dense: dict[tuple[int, str], torch.Tensor] | None,
) -> Callable[[cold.ColdExpert], list[quality.StageStats]]:
    def fn(ex: cold.ColdExpert) -> list[quality.StageStats]:
        weights = {
            (ex.expert, p): (
                ex.base[p],
                [(s.label, s.inverse_scale, s.weight) for s in ex.stages[p]],
            )
            for p in cold.PROJS
        }
        return quality.ladder(layer, base_label, base_k, chain_k, weights, dense)

    return fn
