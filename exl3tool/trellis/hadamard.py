"""128-block Hadamard transforms, bit-exact with exllamav3 (docs/formats/exl3.md §5.3-§5.5, §5.7).

`had_left` / `had_right` evaluate each 128-term fp32 dot product in the sequential-FMA order that
cuBLAS used for `get_weight_tensor` (§5.4). The reference evaluation emulates fma32 as
f32(f64(a)·f64(b) + f64(acc)), vectorized over the whole block, 128 steps. A plain fp32 matmul is
used instead only where a runtime self-check has shown it gives the same bits on that device.
"""

from __future__ import annotations

import math
import threading

import torch

from exl3tool.trellis.bitstream import _cached
from exl3tool.trellis.errors import TrellisError

HAD = 128
# fp32(1/sqrt(128)), the scale preapply_had_l/r multiply into the ±1 matrix (§5.3)
HAD_SCALE_F32 = float(torch.tensor(1 / math.sqrt(HAD), dtype=torch.float32))
# had_r_128's in-kernel constant 0.088388347648f (§5.7)
HAD_R_SCALE = 0.088388347648
# fused path: rs = fp16(0.08838834764831845) = 0x2DA8 (§5.5)
FUSED_RS = float(torch.tensor(0.08838834764831845, dtype=torch.float16))

# Rows/columns of fp32 work per chunk: bounds the transient to a few MB per chunk
_CHUNK_ELEMS = 1 << 21


def hadamard_signs(device: torch.device | str | None = None) -> torch.Tensor:
    """Sylvester H_128 as fp32 ±1: H[a, b] = (-1)^popcount(a & b)."""
    dev = torch.device(device if device is not None else "cpu")

    def build():
        a = torch.arange(HAD)
        x = a[:, None] & a[None, :]
        pop = torch.zeros_like(x)
        for b in range(7):
            pop += (x >> b) & 1
        return (1 - 2 * (pop & 1)).to(torch.float32).to(dev)

    return _cached(("hsign", str(dev)), build)


def hadamard_matrix(device: torch.device | str | None = None) -> torch.Tensor:
    """fp32 C = H_128 · fp32(1/√128), symmetric (exllamav3's `get_hadamard_dt(128, ., float, 1/√128)`)."""
    dev = torch.device(device if device is not None else "cpu")
    return _cached(("hmat", str(dev)), lambda: hadamard_signs(dev) * HAD_SCALE_F32)


# --- sequential-FMA reference -------------------------------------------------------------


def _fma_seq(x: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    """fp32 [B, 128(i), m] = Σ_t C[i, t]·x[B, t, m], accumulated t = 0..127 with fma32.

    x: fp32 [B, 128(t), m].
    """
    cx = x.to(torch.float64) * HAD_SCALE_F32  # exact: 24 x 24 bit product
    acc = torch.zeros((x.shape[0], HAD, x.shape[2]), dtype=torch.float64, device=x.device)
    for t in range(HAD):
        term = signs[:, t].view(1, HAD, 1).to(torch.float64) * cx[:, t : t + 1, :]
        acc = (acc + term).to(torch.float32).to(torch.float64)
    return acc.to(torch.float32)


def _left_fma(x: torch.Tensor) -> torch.Tensor:
    """fp32 [k, n]: per 128-row block, C @ block (rows mixed), FMA order."""
    k, n = x.shape
    signs = hadamard_signs(x.device)
    out = torch.empty_like(x)
    xb, ob = x.view(k // HAD, HAD, n), out.view(k // HAD, HAD, n)
    cols = max(1, _CHUNK_ELEMS // (HAD * 8))
    for b in range(k // HAD):
        for c0 in range(0, n, cols):
            ob[b : b + 1, :, c0 : c0 + cols] = _fma_seq(xb[b : b + 1, :, c0 : c0 + cols], signs)
    return out


def _right_fma(x: torch.Tensor) -> torch.Tensor:
    """fp32 [k, n]: per 128-column block, block @ C (columns mixed), FMA order."""
    k, n = x.shape
    signs = hadamard_signs(x.device).to(torch.float64)
    out = torch.empty_like(x)
    rows = max(1, _CHUNK_ELEMS // (n * 8))
    for r0 in range(0, k, rows):
        cx = x[r0 : r0 + rows].reshape(-1, HAD).to(torch.float64) * HAD_SCALE_F32  # [m, t]
        acc = torch.zeros_like(cx)  # [m, i]
        for t in range(HAD):
            acc = (acc + cx[:, t : t + 1] * signs[t]).to(torch.float32).to(torch.float64)
        out[r0 : r0 + rows] = acc.to(torch.float32).view(-1, n)
    return out


# --- matmul fast path -------------------------------------------------------------------------


def _left_matmul(x: torch.Tensor) -> torch.Tensor:
    k, n = x.shape
    had = hadamard_matrix(x.device)
    out = torch.empty_like(x)
    rows = max(HAD, (_CHUNK_ELEMS // n) // HAD * HAD)
    for r0 in range(0, k, rows):
        blk = x[r0 : r0 + rows]
        out[r0 : r0 + rows] = (had @ blk.view(-1, HAD, n)).view(-1, n)
    return out


def _right_matmul(x: torch.Tensor) -> torch.Tensor:
    k, n = x.shape
    had = hadamard_matrix(x.device)
    out = torch.empty_like(x)
    rows = max(1, _CHUNK_ELEMS // n)
    for r0 in range(0, k, rows):
        blk = x[r0 : r0 + rows]
        out[r0 : r0 + rows] = (blk.reshape(-1, HAD) @ had).view(-1, n)
    return out


class _NoTF32:
    """Keep TF32 off for fp32 matmuls on CUDA (exllamav3 runs them with TF32 off, §5.3)."""

    def __enter__(self):
        self.prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32 = self.prev


_matmul_ok: dict[str, bool] = {}
_matmul_lock = threading.Lock()


def matmul_matches_fma(device: torch.device | str | None = None) -> bool:
    """Whether fp32 matmul on `device` reproduces the sequential-FMA order (checked once, cached).

    The check runs both evaluations on random fp16-valued data (128 x 256, both sides).
    """
    dev = torch.device(device if device is not None else "cpu")
    key = str(dev)
    if key not in _matmul_ok:
        with _matmul_lock:
            if key not in _matmul_ok:
                g = torch.Generator().manual_seed(1234)
                x = torch.randn((128, 256), generator=g).mul_(2.0).half().float().to(dev)
                threads = torch.get_num_threads()
                # 128 small steps: OpenMP barriers would cost more than the work on a busy CPU
                if dev.type == "cpu":
                    torch.set_num_threads(1)
                try:
                    with _NoTF32():
                        same = torch.equal(_left_fma(x), _left_matmul(x)) and torch.equal(
                            _right_fma(x), _right_matmul(x)
                        )
                finally:
                    torch.set_num_threads(threads)
                _matmul_ok[key] = bool(same)
    return _matmul_ok[key]


def _pick(method: str, device: torch.device) -> str:
    if method == "auto":
        return "matmul" if matmul_matches_fma(device) else "fma"
    if method not in ("fma", "matmul"):
        raise TrellisError(f"unknown Hadamard method {method!r}; expected auto, fma or matmul")
    return method


def _check_2d(w: torch.Tensor, what: str) -> None:
    if w.dim() != 2 or w.shape[0] % HAD or w.shape[1] % HAD:
        raise TrellisError(
            f"{what} must be 2-D with both dimensions multiples of 128, got {tuple(w.shape)}"
        )


def had_left(w: torch.Tensor, method: str = "auto") -> torch.Tensor:
    """fp16 B_H(k) · w for fp16 w [k, n] (exllamav3's `preapply_had_l`, bit-exact)."""
    _check_2d(w, "w")
    x = w.to(torch.float32)
    with _NoTF32():
        y = _left_matmul(x) if _pick(method, w.device) == "matmul" else _left_fma(x)
    return y.to(torch.float16)


def had_right(w: torch.Tensor, method: str = "auto") -> torch.Tensor:
    """fp16 w · B_H(n) for fp16 w [k, n] (exllamav3's `preapply_had_r`, bit-exact)."""
    _check_2d(w, "w")
    x = w.to(torch.float32)
    with _NoTF32():
        y = _right_matmul(x) if _pick(method, w.device) == "matmul" else _right_fma(x)
    return y.to(torch.float16)


# --- had_r_128 (§5.7) -------------------------------------------------------------------------


def _fwht_stages(x: torch.Tensor, stages) -> torch.Tensor:
    """In-dtype FWHT stages over the last dim (128): (a, b) -> (a + b, a - b) on index bit `s`."""
    lead = x.shape[:-1]
    for s in stages:
        h = 1 << s
        v = x.reshape(*lead, HAD // (2 * h), 2, h)
        a, b = v[..., 0, :], v[..., 1, :]
        x = torch.stack((a + b, a - b), dim=-2).reshape(*lead, HAD)
    return x


def had_r_128(
    x: torch.Tensor,
    pre_scale: torch.Tensor | None = None,
    post_scale: torch.Tensor | None = None,
    scale: float = 1.0,
) -> torch.Tensor:
    """exllamav3's `ext.had_r_128` on fp16 x [..., cols] (cols % 128 == 0), bit-exact.

    Per row and 128-column block: optional fp16 pre-scale, FWHT in fp32, × fp32(scale·0.088388347648f),
    round to fp16, optional fp16 post-scale (only one of pre/post applies; pre wins).
    """
    if x.dtype != torch.float16:
        raise TrellisError(f"had_r_128 takes fp16 input, got {x.dtype}")
    cols = x.shape[-1]
    if cols % HAD:
        raise TrellisError(
            f"had_r_128 needs the last dimension to be a multiple of 128, got {cols}"
        )
    v = x
    if pre_scale is not None:
        v = v * pre_scale.to(torch.float16)
    lead = v.shape[:-1]
    f = v.to(torch.float32).reshape(*lead, cols // HAD, HAD)
    f = _fwht_stages(f, range(7))
    k = torch.tensor(HAD_R_SCALE, dtype=torch.float32) * torch.tensor(scale, dtype=torch.float32)
    y = (f * k.to(f.device)).to(torch.float16).reshape(*lead, cols)
    if pre_scale is None and post_scale is not None:
        y = y * post_scale.to(torch.float16)
    return y


# --- fused fp16 path = ext.reconstruct_had_slice (§5.5) ---------------------------------------


def fused_transform(w: torch.Tensor, suh: torch.Tensor, svh: torch.Tensor) -> torch.Tensor:
    """fp16 W_eff by the fused fp16 kernel's arithmetic, from fp16 Ŵ [k, n], suh [k], svh [n]."""
    _check_2d(w, "w")
    k, n = w.shape
    rs = torch.tensor(FUSED_RS, dtype=torch.float16, device=w.device)
    # along k: transpose so the 128-row blocks lie on the last dim
    x = w.t().reshape(n, k // HAD, HAD)
    x = _fwht_stages(x, (0, 1)) * rs
    x = _fwht_stages(x, range(2, 7))
    x = x.reshape(n, k).t()
    # along n: stages 0, 1 in fp32, then fp16
    y = x.reshape(k, n // HAD, HAD).to(torch.float32)
    y = _fwht_stages(y, (0, 1)).to(torch.float16) * rs
    y = _fwht_stages(y, range(2, 7)).reshape(k, n)
    y = y * suh.to(torch.float16).view(k, 1)
    return (y * svh.to(torch.float16).view(1, n)).contiguous()
