"""EXL3 linear layer of the reference runtime, from decoded effective weights.

Precision policy (mirrors the serving kernels, docs/formats/msrt.md §1.2 "Precision"):

* activations are fp16 (the kernel's `xh` workspace is fp16 even for BF16 models);
* weights are `W_eff` fp16 `[in, out]`, decoded bit-exactly (docs/formats/exl3.md §5.3) once per linear;
* every GEMM accumulates in fp32: `x.float() @ W_eff.float()` (TF32 off on CUDA);
* a projection's base output and its MSRT stage outputs are summed in fp32 (`out32`) and rounded to
  fp16 once, after the last stage;
* the MoE combine (top-k weight × down output) and the TP all-reduce stay in fp32; the block output
  is rounded to fp16 once at the end.

Two runs that perform these operations on equal operands, in the same order and with the same
shapes, give equal bits on one machine; this is what the hot == cold checks rely on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from exl3tool.trellis.weight import effective_weight, effective_weights

CODEBOOK = "mcg"  # MSRT bases and cartridges are MCG only (docs/formats/msrt.md §4 row 10)


def set_precision_policy() -> None:
    """fp32 GEMMs must really be fp32: never TF32 (it would change bits between runs)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def gemm32(x16: torch.Tensor, w16: torch.Tensor) -> torch.Tensor:
    """fp32 `[rows, out]` = fp16 `x` @ fp16 `W_eff`, accumulated in fp32."""
    return x16.float() @ w16.float()


def decode_weight(
    trellis: torch.Tensor,
    suh: torch.Tensor,
    svh: torch.Tensor,
    device: torch.device | str,
) -> torch.Tensor:
    """W_eff fp16 `[in, out]` of one linear (trellis, suh, svh already sliced to this rank).

    The inputs move to `device` in one copy each, before the decode's row blocks slice them."""
    t, su, sv = (x.to(device) for x in (trellis, suh, svh))
    return effective_weight(t, su, sv, CODEBOOK).contiguous()


def decode_weights(
    items: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], device: torch.device | str
) -> list[torch.Tensor]:
    """W_eff of many linears [(trellis, suh, svh)], bit for bit what `decode_weight` gives each;
    on CUDA one kernel launch per (shape, K) group (a layer's experts of one projection)."""
    return effective_weights(items, CODEBOOK, device=device)


@dataclass
class Exl3Linear:
    """One EXL3 linear held as its decoded effective weight (rotated-basis math, §5.2)."""

    weight: torch.Tensor  # fp16 [in, out]

    @classmethod
    def decode(
        cls, trellis: torch.Tensor, suh: torch.Tensor, svh: torch.Tensor, device: torch.device | str
    ) -> Exl3Linear:
        return cls(decode_weight(trellis, suh, svh, device))

    @classmethod
    def decode_many(
        cls, items: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], device
    ) -> list[Exl3Linear]:
        return [cls(w) for w in decode_weights(items, device)]

    def forward32(self, x16: torch.Tensor) -> torch.Tensor:
        return gemm32(x16, self.weight)

    def forward(self, x16: torch.Tensor) -> torch.Tensor:
        return self.forward32(x16).half()
