"""The MSRT base as one TP rank holds it: its slice of every routed expert, decoded once.

An `exl3-msrt-base/1` base stores rank0 full logical tensors (docs/formats/msrt.md §5); each
rank slices its part at load (gate/up column-parallel on the expert intermediate axis, down
row-parallel, docs/formats/exl3.md §6) from the TP plan's ranges, and keeps only that slice: trellis,
the matching suh/svh and the decoded `W_eff`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from exl3tool.checks.routers import router_problem
from exl3tool.formats import msrt_spec as spec
from exl3tool.formats.checkpoint import Checkpoint, TensorRef, load_checkpoint
from exl3tool.formats.msrt_base import read_base_profile
from exl3tool.formats.names import PROJECTIONS
from exl3tool.formats.tail import config_tail
from exl3tool.io.views import TensorReader
from exl3tool.rules.errors import InputError
from exl3tool.rules.registry import Findings
from exl3tool.runtime import reads
from exl3tool.runtime.linear import Exl3Linear
from exl3tool.tp import linear as tp_linear
from exl3tool.tp import ranges as tp_ranges

# column-parallel projections split the output axis; down splits its input axis (§3, §8)
COLUMN_PARALLEL = ("gate_proj", "up_proj")
TP_FIELDS = ("trellis", "suh", "svh")


def local_range(intermediate: int, rank: int, world_size: int) -> tuple[int, int]:
    """This rank's intermediate channels [first, last), from the TP plan (128-aligned)."""
    return tp_ranges.intermediate_ranges(intermediate, world_size)[rank]


def role(proj: str) -> str:
    return "column" if proj in COLUMN_PARALLEL else "row"


def cut_field(proj: str, fld: str, t: torch.Tensor, first: int, last: int) -> torch.Tensor:
    """This rank's part of one whole field tensor, by the TP plan's field rules (docs/formats/
    exl3.md §6): a contiguous copy of the cut, or `t` itself when the field is not split."""
    cut = tp_linear.field_cut(role(proj), fld, first, last)
    if cut.axis is None:
        return t
    if cut.stop > t.shape[cut.axis]:
        raise InputError(f"{proj} {fld}: channels end at {cut.stop} beyond {tuple(t.shape)}")
    return t.narrow(cut.axis, cut.start, cut.stop - cut.start).contiguous()


def local_fields(
    proj: str, fields: dict[str, torch.Tensor], first: int, last: int, world_size: int
) -> tuple[torch.Tensor, ...]:
    """This rank's (trellis, suh, svh) of a base linear's whole tensors (all of them at TP 1;
    stages carry no suh/svh: rotation reuse, docs/formats/msrt.md §1.1)."""
    if world_size == 1:
        return tuple(fields[c] for c in TP_FIELDS)
    return tuple(cut_field(proj, c, fields[c], first, last) for c in TP_FIELDS)


def to_torch(a: np.ndarray) -> torch.Tensor:
    """A private contiguous copy (the pread buffer may be reused)."""
    return torch.from_numpy(np.ascontiguousarray(a).copy())


@dataclass
class BaseLinear:
    trellis: torch.Tensor  # int16, this rank's slice
    suh: torch.Tensor  # fp16, this rank's slice
    svh: torch.Tensor
    linear: Exl3Linear


@dataclass
class BaseModel:
    """Everything of the base that one rank holds."""

    path: Path
    config: dict[str, Any]
    hidden: int
    intermediate: int
    num_experts: int
    topk: int
    k: int
    rank: int
    world_size: int
    first: int  # local intermediate range
    last: int
    layers: list[int]
    linears: dict[int, dict[tuple[int, str], BaseLinear]] = field(default_factory=dict)
    routers: dict[int, torch.Tensor | None] = field(default_factory=dict)

    @property
    def root_sha256(self) -> str | None:
        tail = config_tail(self.config)
        return tail.compatibility_sha256 if tail is not None else None

    def rotations(self, layer: int) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
        return {key: (b.suh, b.svh) for key, b in self.linears[layer].items()}


def open_base(path: Path) -> tuple[Checkpoint, dict[str, Any]]:
    findings = Findings()
    ckpt = load_checkpoint(Path(path), findings)
    cfg = ckpt.config
    if findings.has_errors() or not isinstance(cfg, dict):
        first = findings.errors()[0].message if findings.errors() else "no config.json"
        raise InputError(f"{path}: not a readable MSRT base ({first})")
    return ckpt, cfg


def router_weight(
    rd: TensorReader, ref: TensorRef, path: Path, experts: int, hidden: int
) -> torch.Tensor:
    """A layer's router `mlp.gate.weight` as fp16 [experts, hidden] (BF16 reinterpreted, not
    cast from its raw integers); anything else is unusable input (validate: MB019)."""
    info = ref.info
    if router_problem(info.dtype, info.shape, experts, hidden, bias=False) is not None:
        raise InputError(
            f"{path}: router {ref.name} is {info.dtype}{list(info.shape)}, expected F16, BF16 "
            f"or F32 [{experts}, {hidden}] (MB019)"
        )
    t = to_torch(rd.array(ref.shard, info))
    return (t.view(torch.bfloat16) if info.dtype == "BF16" else t).to(torch.float16)


def base_geometry(cfg: dict[str, Any], path: Path) -> tuple[int, int, int, int, int, list[int]]:
    """(hidden, intermediate, experts, top-k, K, MoE layers) of an exl3-msrt-base/1 config."""
    base = read_base_profile(cfg)
    hidden, inter, experts = (base.hidden, base.intermediate, base.experts) if base else (None,) * 3
    if base is None or hidden is None or inter is None or experts is None:
        raise InputError(f"{path}: config.json lacks the MSRT base sizes or hybrid_tr3_tail (§5)")
    topk = base.top_k if base.top_k is not None and base.top_k > 0 else 8
    if base.layers is None:
        raise InputError(f"{path}: hybrid_tr3_tail.moe_layer_coverage is not a list of layers")
    if base.k is None:
        raise InputError(f"{path}: hybrid_tr3_tail.bits {base.tail.bits!r} is not a whole K (§5)")
    return hidden, inter, experts, min(topk, experts), base.k, list(base.layers)


def load_base(
    path: Path,
    layers: list[int],
    rank: int,
    world_size: int,
    device: torch.device,
    *,
    opened: tuple[Checkpoint, dict[str, Any]] | None = None,
) -> BaseModel:
    """Read, slice and decode the selected layers' routed experts for this rank (`opened`: the
    base as `open_base` already returned it, so that a layer-by-layer run parses it once)."""
    ckpt, cfg = opened if opened is not None else open_base(Path(path))
    hidden, inter, experts, topk, k, moe_layers = base_geometry(cfg, Path(path))
    first, last = local_range(inter, rank, world_size)
    model = BaseModel(
        Path(path), cfg, hidden, inter, experts, topk, k, rank, world_size, first, last, layers
    )
    threads = reads.read_threads(world_size)
    with TensorReader() as rd:

        def field_reads(layer: int, e: int) -> list[reads.TensorRead]:
            out = []
            for proj in PROJECTIONS:
                for c in TP_FIELDS:
                    ref = ckpt.tensors.get(name := spec.base_key(layer, e, proj, c))
                    if ref is None:
                        raise InputError(f"{path}: base tensor {name} is missing")
                    out.append(reads.tensor_read(rd, ref.shard, ref.info))
            return out

        for layer in layers:
            if layer not in moe_layers:
                raise InputError(f"{path}: layer {layer} is not an MoE layer of this base")
            parts: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
            # one expert's nine tensors per group, read ahead while earlier ones copy to the
            # device; the trellis stays there (a host copy of every layer's trellis would cost
            # host RSS, 3/16 of the fp16 layer at K=3, for nothing)
            groups = (field_reads(layer, e) for e in range(experts))
            got = reads.stream_groups(groups, device, threads=threads, ahead=4)
            for e, tensors in enumerate(got):
                for j, proj in enumerate(PROJECTIONS):
                    fields = dict(zip(TP_FIELDS, tensors[3 * j : 3 * j + 3], strict=True))
                    parts[(e, proj)] = local_fields(proj, fields, first, last, world_size)
            # the whole layer in one call: one kernel launch per projection shape on CUDA
            lins = Exl3Linear.decode_many(list(parts.values()), device)
            model.linears[layer] = {
                key: BaseLinear(*parts[key], lin) for key, lin in zip(parts, lins, strict=True)
            }
            router = ckpt.tensors.get(f"model.layers.{layer}.mlp.gate.weight")
            model.routers[layer] = (
                router_weight(rd, router, Path(path), experts, hidden).to(device)
                if router is not None
                else None
            )
    return model
