"""Effective (original-basis) weight W = diag(suh)·B_H·Ŵ·B_H·diag(svh) (docs/formats/exl3.md §5.2-§5.5)."""

from __future__ import annotations

import torch

from exl3tool.trellis import _triton
from exl3tool.trellis.bitstream import TILE, _check_trellis
from exl3tool.trellis.decode import _as_range, check_rate_codebook, decode_rotated, slice_trellis
from exl3tool.trellis.errors import TrellisError
from exl3tool.trellis.hadamard import (
    HAD,
    _pick,
    fused_transform,
    had_left,
    had_right,
    hadamard_matrix,
)

# Weights decoded and transformed per block: the fp32 transients stay a few tens of MB, so a
# layer needs about 2x its fp16 output in all (docs/formats/exl3.md §5.3 steps run per 128-row block)
_BLOCK_ELEMS = 1 << 21


def _check_scale(x: torch.Tensor, size: int, what: str) -> None:
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float16 or x.shape != (size,):
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        dtype = getattr(x, "dtype", None)
        raise TrellisError(f"{what} must be fp16 [{size}], got {dtype} {shape}")


def _range128(r, size: int, what: str) -> tuple[int, int]:
    start, stop = _as_range(r, size, what)
    if start % HAD or stop % HAD:
        raise TrellisError(
            f"{what} range [{start}, {stop}) must lie on 128-channel boundaries: a slice must not "
            "cut a Hadamard block (docs/formats/exl3.md §6)"
        )
    return start, stop


def effective_weight(
    trellis: torch.Tensor,
    suh: torch.Tensor,
    svh: torch.Tensor,
    codebook: str,
    *,
    rows=None,
    cols=None,
    device: torch.device | str | None = None,
    method: str = "auto",
) -> torch.Tensor:
    """W_eff fp16 [k, n] (in, out), bit-exact with exllamav3's `LinearEXL3.get_weight_tensor()`.

    suh fp16 [k], svh fp16 [n]: the full vectors. rows / cols: element ranges on 128-channel
    boundaries (TP slices). method: "auto" / "fma" / "matmul" for get_weight_tensor's fp32 order
    (auto = fp32 matmul where a self-check shows it matches the sequential-FMA order, else the
    emulation, "kernel" = the fused Triton kernel, which evaluates that order with true fp32 FMAs;
    auto takes it on CUDA), or "fused" for `ext.reconstruct_had_slice`'s fp16 arithmetic.
    """
    rate = _check_trellis(trellis)
    check_rate_codebook(rate, codebook)
    if trellis.dim() != 3:
        raise TrellisError(
            f"trellis must be 3-D [k/16, n/16, 16K], got shape {tuple(trellis.shape)}"
        )
    k, n = trellis.shape[0] * TILE, trellis.shape[1] * TILE
    if k % HAD or n % HAD:
        raise TrellisError(f"matrix [{k}, {n}] must have both dimensions multiples of 128")
    _check_scale(suh, k, "suh")
    _check_scale(svh, n, "svh")
    r0, r1 = _range128(rows, k, "rows")
    c0, c1 = _range128(cols, n, "cols")
    dev = torch.device(device) if device is not None else trellis.device
    suh_d = suh[r0:r1].to(dev)
    svh_d = svh[c0:c1].to(dev)
    if _use_kernel(method, dev):
        return _kernel_weight(trellis, suh_d, svh_d, codebook, (r0, r1), (c0, c1), dev)
    fused = method == "fused"
    if not fused:
        method = _pick(method, dev)
    out = torch.empty((r1 - r0, c1 - c0), dtype=torch.float16, device=dev)
    step = max(HAD, (_BLOCK_ELEMS // (c1 - c0)) // HAD * HAD)
    for b0 in range(r0, r1, step):
        b1 = min(r1, b0 + step)
        w = decode_rotated(trellis, codebook, rows=(b0, b1), cols=(c0, c1), device=dev)
        s_u, o = suh_d[b0 - r0 : b1 - r0], out[b0 - r0 : b1 - r0]
        if fused:
            o.copy_(fused_transform(w, s_u, svh_d))
            continue
        w = had_left(w, method)
        w.mul_(s_u.view(-1, 1))
        w = had_right(w, method)
        torch.mul(w, svh_d.view(1, -1), out=o)
    return out


def _use_kernel(method: str, dev: torch.device) -> bool:
    if method == "kernel":
        if not _triton.available(dev):
            raise TrellisError("the fused Triton kernel is not available on this device")
        return True
    return method == "auto" and dev.type == "cuda" and _triton.available(dev)


def _kernel_weight(trellis, suh_d, svh_d, codebook, rows, cols, dev) -> torch.Tensor:
    from exl3tool.trellis import _triton_group

    rate = _check_trellis(trellis)
    name = check_rate_codebook(rate, codebook)
    whole = rows == (0, trellis.shape[0] * TILE) and cols == (0, trellis.shape[1] * TILE)
    sub = trellis if whole else slice_trellis(trellis, rows, cols)
    sub = sub.to(dev).contiguous()
    out = torch.empty((rows[1] - rows[0], cols[1] - cols[0]), dtype=torch.float16, device=dev)
    _triton_group.weight_group(
        [sub], [suh_d.contiguous()], [svh_d.contiguous()], [out], hadamard_matrix(dev), name, rate
    )
    return out


def effective_weights(
    items: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    codebook: str,
    *,
    device: torch.device | str | None = None,
) -> list[torch.Tensor]:
    """W_eff of many whole matrices [(trellis, suh, svh)], each as `effective_weight` gives it.

    On CUDA, matrices of one shape and rate are decoded by one launch of the fused kernel (all
    experts of a projection at once); elsewhere one `effective_weight` call each.
    """
    if not items:
        return []
    dev = torch.device(device) if device is not None else items[0][0].device
    if not _triton.available(dev):  # CUDA, or the CPU under the interpreter (tests)
        return [effective_weight(t, su, sv, codebook, device=dev) for t, su, sv in items]
    from exl3tool.trellis import _triton_group

    for t, su, sv in items:
        check_rate_codebook(_check_trellis(t), codebook)
        if t.dim() != 3 or (t.shape[0] * TILE) % HAD or (t.shape[1] * TILE) % HAD:
            raise TrellisError(f"trellis shape {tuple(t.shape)} is not a whole 128-block matrix")
        _check_scale(su, t.shape[0] * TILE, "suh")
        _check_scale(sv, t.shape[1] * TILE, "svh")
    had = hadamard_matrix(dev)

    def launch(idx, outs, name, rate):
        ts, sus, svs = ([items[i][f].to(dev).contiguous() for i in idx] for f in range(3))
        _triton_group.weight_group(ts, sus, svs, outs, had, name, rate)

    return _triton_group.launch_grouped([t for t, _, _ in items], codebook, dev, launch)
