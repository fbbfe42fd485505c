"""MSRT additive application per projection (docs/formats/msrt.md §1.2, §1.3).

    y_p(x) = base_p(x) + Σ_s inv_scale[s, e] · stage_s,p(x)

Stages are decoded with the BASE layer's own suh/svh (rotation reuse, §1.1); sparse table entries
(inverse scale 0.0) are skipped, exactly as the kernel skips their GEMM. Everything the runtime
applies comes from `exl3tool.formats.cartridge_tables.materialize_tables` (one implementation of the tables
that `stage-cartridge` records): the stage order, the FP32 inverse scales and the tensor names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from exl3tool.formats.names import PROJECTIONS
from exl3tool.runtime.linear import Exl3Linear, gemm32


@dataclass
class StageTerm:
    """One (stage, expert, projection) GEMM with its FP32 inverse scale (a 0-dim tensor)."""

    stage: int
    label: str
    inverse_scale: torch.Tensor  # fp32 []
    linear: Exl3Linear
    k: int = 0  # the stage's bits per weight from the table (`bits[s]`)
    tensor: str = ""  # the pointer-table name the trellis was read from


def project32(base: Exl3Linear, terms: list[StageTerm], x16: torch.Tensor) -> torch.Tensor:
    """fp32 output of one projection: base GEMM + Σ inverse-scaled stage GEMMs, in stage order."""
    y = gemm32(x16, base.weight)
    for t in terms:
        y = y + t.inverse_scale * gemm32(x16, t.linear.weight)
    return y


def table_inverse_scale(tables: Any, proj: str) -> torch.Tensor:
    """The FP32 `[S, E]` inverse-scale table of one projection as a CPU tensor."""
    inv = tables.inverse_scale[proj]
    t = inv if isinstance(inv, torch.Tensor) else torch.from_numpy(inv.copy())
    if t.dtype != torch.float32:
        raise TypeError(f"inverse-scale table of {proj} is {t.dtype}, not float32 (§1.2)")
    return t.cpu()


@dataclass
class CartridgeLayer:
    """A layer's cartridge runtime: stage terms per (expert, projection), built from its tables."""

    layer: int
    tables: Any  # cartridge.tables.LayerTables
    terms: dict[tuple[int, str], list[StageTerm]] = field(default_factory=dict)

    def terms_for(self, expert: int, proj: str) -> list[StageTerm]:
        return self.terms.get((expert, proj), [])

    def release(self) -> None:
        self.terms.clear()

    @property
    def num_terms(self) -> int:
        return sum(len(v) for v in self.terms.values())


def build_layer(
    layer: int,
    tables: Any,
    experts: range | list[int],
    read_stages: Callable[[list[tuple[str, str]]], list[torch.Tensor]],
    base_rotations: Mapping[tuple[int, str], tuple[torch.Tensor, torch.Tensor]],
    device: torch.device | str,
    into: CartridgeLayer | None = None,
) -> CartridgeLayer:
    """Decode every non-sparse table entry of `layer` into stage terms.

    read_stages([(proj, tensor_name), ...]): this rank's local trellis of each stage tensor, in
    order (one batch, so that the reads can run on threads). base_rotations:
    (expert, proj) -> this rank's (suh, svh) of the base linear. `into`: an existing runtime of this
    layer to refill (swap A → B reuses common layers, §10.5).
    """
    rt = into if into is not None else CartridgeLayer(layer, tables)
    rt.release()
    rt.tables = tables
    labels = list(tables.stages)
    pending: list[tuple[tuple[int, str], int, str, torch.Tensor, str]] = []
    wanted: list[tuple[str, str]] = []
    rotations: list[tuple[torch.Tensor, torch.Tensor]] = []
    for proj in PROJECTIONS:
        inv = table_inverse_scale(tables, proj)
        # the pointer table, as the kernel reads it: a sparse entry points at a fallback tensor
        # and only its 0.0 inverse scale keeps it out of the sum (§1.3)
        names = tables.pointer_name[proj]
        for e in experts:
            suh, svh = base_rotations[(e, proj)]
            for s, label in enumerate(labels):
                scale = inv[s, e]
                if float(scale) == 0.0:  # sparse entry: the kernel skips this GEMM (§1.3)
                    continue
                wanted.append((proj, names[s][e]))
                rotations.append((suh, svh))
                pending.append(((e, proj), s, label, scale, names[s][e]))
    items = [(t, su, sv) for t, (su, sv) in zip(read_stages(wanted), rotations, strict=True)]
    # the layer's stage terms in one call: one kernel launch per (shape, K) group on CUDA
    for (key, s, label, scale, name), lin in zip(
        pending, Exl3Linear.decode_many(items, device), strict=True
    ):
        term = StageTerm(s, label, scale.clone().to(device), lin, int(tables.bits[s]), name)
        rt.terms.setdefault(key, []).append(term)
    return rt
