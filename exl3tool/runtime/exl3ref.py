"""Cross-check against exllamav3's CUDA extension (check 7; docs/formats/exl3.md §5.1, §5.6, §8.2).

* `ext.reconstruct` gives Ŵ; our `decode_rotated` must equal it bit for bit;
* `ext.exl3_gemm` is the serving GEMM (tensor-core MMA, fp32 accumulation, not bit-reproducible off
  the GPU, §5.4); our `x.float() @ W_eff.float()` must agree within GEMM_REL_TOL (relative L2).
"""

from __future__ import annotations

from typing import Any

import torch

from exl3tool.runtime.linear import CODEBOOK
from exl3tool.trellis.decode import decode_rotated

# exl3_gemm rounds the Hadamard-rotated input to fp16 and accumulates MMA tiles in another order:
# relative L2 differences of ~1e-3 are expected, a wrong decode or a wrong scale is O(1).
GEMM_REL_TOL = 1e-2


def load_ext() -> tuple[Any | None, str]:
    """(the exllamav3 extension, "") or (None, why not)."""
    if not torch.cuda.is_available():
        return None, "no CUDA device"
    try:
        from exllamav3.ext import exllamav3_ext as ext
    except Exception as exc:  # not installed, or the extension cannot load
        why = f"{type(exc).__name__}: {exc}"
        return None, f"exllamav3 is not importable ({why}); pip install 'exl3tool[cuda]'"
    return ext, ""


def reconstruct(ext: Any, trellis: torch.Tensor) -> torch.Tensor:
    k, n, words = trellis.shape[0] * 16, trellis.shape[1] * 16, trellis.shape[2]
    out = torch.empty((k, n), dtype=torch.float16, device=trellis.device)
    ext.reconstruct(out, trellis, words // 16, CODEBOOK == "mcg", False)
    return out


def exl3_gemm(
    ext: Any, x16: torch.Tensor, trellis: torch.Tensor, suh: torch.Tensor, svh: torch.Tensor
) -> torch.Tensor:
    y = torch.empty((x16.shape[0], trellis.shape[1] * 16), dtype=torch.float32, device=x16.device)
    xh = torch.empty_like(x16)
    ext.exl3_gemm(x16, trellis, y, suh, xh, svh, -1, CODEBOOK == "mcg", False, 0)
    return y


def ours_rotated(trellis: torch.Tensor) -> torch.Tensor:
    return decode_rotated(trellis, CODEBOOK)
