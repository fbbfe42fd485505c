"""Exact and tolerant comparisons of tensors, with the first differing element for reports."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Diff:
    """Result of comparing `got` with `want` (same shape)."""

    equal: bool
    max_abs: float
    rel_l2: float
    first_difference: dict[str, Any] | None


def compare(got: torch.Tensor, want: torch.Tensor, where: str) -> Diff:
    """Bit-level comparison (NaN-safe); max_abs and the relative L2 error in fp64."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return Diff(
            False,
            float("inf"),
            float("inf"),
            {
                "where": where,
                "index": None,
                "got": f"{got.dtype} {list(got.shape)}",
                "want": f"{want.dtype} {list(want.shape)}",
            },
        )
    a, b = got.detach(), want.detach()
    itemsize = a.element_size()
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[itemsize]
    neq = a.contiguous().view(bits) != b.contiguous().view(bits)
    if not bool(neq.any()):  # the usual case: one pass, one sync, no fp64 copies
        return Diff(True, 0.0, 0.0, None)
    diff = a.double() - b.double()
    max_abs = float(diff.abs().max())
    nb = float(b.double().norm())
    rel = float(diff.norm()) / nb if nb > 0 else (0.0 if max_abs == 0 else 1.0)
    flat = int(torch.nonzero(neq.reshape(-1))[0])
    index = list(torch.unravel_index(torch.tensor(flat), a.shape)) if a.dim() else []
    return Diff(
        False,
        max_abs,
        rel,
        {
            "where": where,
            "index": [int(i) for i in index],
            "got": float(a.reshape(-1)[flat]),
            "want": float(b.reshape(-1)[flat]),
        },
    )


@dataclass
class Tally:
    """Accumulates many comparisons into one check's numbers."""

    equal: bool = True
    max_abs: float = 0.0
    rel_l2: float = 0.0
    compared: int = 0
    first_difference: dict[str, Any] | None = None

    def add(self, d: Diff) -> Diff:
        self.compared += 1
        self.max_abs = max(self.max_abs, d.max_abs)
        self.rel_l2 = max(self.rel_l2, d.rel_l2)
        if not d.equal:
            self.equal = False
            if self.first_difference is None:
                self.first_difference = d.first_difference
        return d
