"""MoE block of the reference runtime: router top-k, gate/up → SiLU → down, weighted sum.

An expert is a function `expert_fn(e, x16) -> fp32 [rows, hidden]` returning the (TP-partial) down
output; `reduce` all-reduces the fp32 block output across TP ranks before the one fp16 rounding
(precision policy in `runtime.linear`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from exl3tool.runtime.linear import gemm32

ExpertFn = Callable[[int, torch.Tensor], torch.Tensor]
Reduce = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Routing:
    ids: torch.Tensor  # int64 [T, k]
    weights: torch.Tensor  # fp32 [T, k]
    source: str  # "checkpoint" (mlp.gate.weight) or "synthetic"

    def routed_experts(self) -> list[int]:
        return sorted(int(e) for e in torch.unique(self.ids))


def tokens_needed(tokens: int, num_experts: int, topk: int) -> int:
    """At least enough tokens for the synthetic router to reach every expert once."""
    return max(tokens, math.ceil(num_experts / topk))


def route(
    x16: torch.Tensor,
    router_weight: torch.Tensor | None,
    num_experts: int,
    topk: int,
    seed: int,
) -> Routing:
    """Top-k routing of fp16 tokens `x16 [T, hidden]`.

    With the checkpoint's router (`mlp.gate.weight` fp16 [E, hidden]): softmax over fp32 logits,
    top-k, weights renormalized to sum 1 (Qwen3-MoE `norm_topk_prob`). Without it: a seeded
    synthetic router whose slots walk a seeded permutation of all experts, so T·k ≥ E tokens route
    every expert at least once; its weights are a softmax over seeded logits.
    """
    T = x16.shape[0]
    k = min(topk, num_experts)
    if router_weight is not None:
        logits = gemm32(x16, router_weight.t().to(x16.device))
        probs = torch.softmax(logits, dim=-1)
        w, ids = torch.topk(probs, k, dim=-1)
        return Routing(ids, w / w.sum(dim=-1, keepdim=True), "checkpoint")
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_experts, generator=g)
    slots = torch.arange(T * k).view(T, k) % num_experts
    ids = perm[slots]
    w = torch.softmax(torch.randn(T, k, generator=g), dim=-1)
    return Routing(ids.to(x16.device), w.to(x16.device), "synthetic")


def expert_mlp(
    proj16: Callable[[str, torch.Tensor], torch.Tensor],
    down32: Callable[[torch.Tensor], torch.Tensor],
    x16: torch.Tensor,
) -> torch.Tensor:
    """gate/up (fp16, MSRT stages already added before SiLU) → SiLU(gate)·up in fp32 → fp16 → down."""
    g = proj16("gate_proj", x16)
    u = proj16("up_proj", x16)
    a16 = (F.silu(g.float()) * u.float()).half()
    return down32(a16)


def moe_forward(
    x16: torch.Tensor, routing: Routing, expert_fn: ExpertFn, reduce: Reduce, hidden: int
) -> torch.Tensor:
    """fp16 `[T, hidden]` block output; experts accumulate into fp32 in ascending expert order."""
    T = x16.shape[0]
    out32 = torch.zeros((T, hidden), dtype=torch.float32, device=x16.device)
    for e in routing.routed_experts():
        tok, slot = (routing.ids == e).nonzero(as_tuple=True)
        y32 = expert_fn(e, x16[tok])
        # each token routes to an expert at most once: unique indices, deterministic on CUDA too
        out32.index_add_(0, tok, y32 * routing.weights[tok, slot].unsqueeze(1))
    return reduce(out32).half()


def expert_probe(
    x16: torch.Tensor, experts: list[int], expert_fn: ExpertFn, reduce: Reduce
) -> torch.Tensor:
    """fp32 `[E_sel, T, hidden]`: every listed expert on every token, whatever the router picks.

    Checks compare this as well as the routed block output, so no expert escapes a check because
    the checkpoint's router happened not to pick it.
    """
    out = torch.stack([expert_fn(e, x16) for e in experts])
    return reduce(out)
