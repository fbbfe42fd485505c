"""Triton kernel for the rotated decode on CUDA (one pass: trellis words in, fp16 Ŵ out).

Each program decodes TR tile rows x BLOCK_N columns straight into the row-major output, so stores are
coalesced. The state window (§3.3), the tile permutation (§3.4) and the codebook (§4) are computed
in-kernel with integer ops; the codebook arithmetic is the same as the table's, so results equal the
torch path bit for bit. With TRITON_INTERPRET=1 the kernel also runs on CPU tensors (tests only).
"""

from __future__ import annotations

import os

import torch

try:  # pragma: no cover - depends on the environment
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except Exception:
    HAVE_TRITON = False

_CB_ID = {"3inst": 0, "mcg": 1, "mul1": 2}


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def available(device: torch.device) -> bool:
    """Whether the kernel can run on `device`."""
    if not HAVE_TRITON:
        return False
    if device.type == "cuda":
        return torch.cuda.is_available() and not interpreting()
    return device.type == "cpu" and interpreting()


if HAVE_TRITON:

    @triton.jit
    def ring_window(rr, cc, WD, KB, HALF):
        """(word, next word, bit offset) of the state of tile element (rr, cc) (broadcastable).

        p is the element's position, the inverse of TC_PERM (§3.4); its state is the 16 ring bits
        ending at bit E(p) (§3.3), read from the int16 word pair (w ^ 1, w2 ^ 1) at offset o.
        Terms of the row alone are computed on rr, before broadcasting."""
        R: tl.constexpr = 16 * WD
        pr = 8 * ((rr & 7) >> 1) + (rr & 1) + 2 * (rr >> 3)
        pc = 32 * (cc & 7) + 4 * (cc >> 3)
        p = pr + pc
        e = (p + 1) * (2 * KB + 1) >> 1 if HALF else (p + 1) * KB
        st = e + (R - 16)
        st = tl.where(st >= R, st - R, st)
        w = st >> 4
        w2 = w + 1
        w2 = tl.where(w2 == WD, 0, w2)
        return w, w2, st & 15

    @triton.jit
    def tile_values(trellis_ptr, row, col, tiles_n, mask, WD, KB, HALF, CB):
        """fp16 Ŵ[row, col] straight from the trellis words (row, col: broadcastable int tensors).

        The state window (§3.3), the tile permutation (§3.4) and the codebook (§4) use integer ops
        only, the same arithmetic as exl3tool.trellis.codebook, so the result equals the torch path.
        """
        w, w2, o = ring_window(row & 15, col & 15, WD, KB, HALF)
        base = ((row >> 4) * tiles_n + (col >> 4)) * WD
        a = tl.load(trellis_ptr + base + (w ^ 1), mask=mask, other=0)
        b = tl.load(trellis_ptr + base + (w2 ^ 1), mask=mask, other=0)
        return state_value(a, b, o, CB)

    @triton.jit
    def state_value(a, b, o, CB):
        """fp16 codebook value (§4) of the 16 ring bits at offset o of the int16 word pair (a, b)."""
        a = a.to(tl.uint16, bitcast=True).to(tl.uint32)
        b = b.to(tl.uint16, bitcast=True).to(tl.uint32)
        v = (a << 16) | b
        s = (v >> (16 - o).to(tl.uint32)) & 0xFFFF
        if CB == 2:
            x = s * tl.full((), 0x83DCD12D, tl.uint32)
            bsum = (x & 255) + ((x >> 8) & 255) + ((x >> 16) & 255) + (x >> 24)
            f = (bsum + 1024).to(tl.float32) * 0.00676727294921875 + (-10.3828125)
            val = f.to(tl.float16)
        else:
            if CB == 0:
                x = s * tl.full((), 89226354, tl.uint32) + tl.full((), 64248484, tl.uint32)
            else:
                x = s * tl.full((), 0xCBAC1FED, tl.uint32)
            x = (x & tl.full((), 0x8FFF8FFF, tl.uint32)) ^ tl.full((), 0x3B603B60, tl.uint32)
            lo = (x & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True)
            hi = (x >> 16).to(tl.uint16).to(tl.float16, bitcast=True)
            val = (lo.to(tl.float32) + hi.to(tl.float32)).to(tl.float16)
        return val

    @triton.jit
    def _decode_kernel(
        trellis_ptr,
        out_ptr,
        k_rows,
        n_cols,
        tiles_n,
        WD: tl.constexpr,
        KB: tl.constexpr,
        HALF: tl.constexpr,
        CB: tl.constexpr,
        TR: tl.constexpr,
        BLOCK_N: tl.constexpr,
    ):
        pid_r = tl.program_id(0)
        pid_n = tl.program_id(1)
        row = pid_r * (16 * TR) + tl.arange(0, 16 * TR)  # output row
        c = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (row < k_rows)[:, None] & (c < n_cols)[None, :]
        val = tile_values(trellis_ptr, row[:, None], c[None, :], tiles_n, mask, WD, KB, HALF, CB)
        tl.store(out_ptr + row[:, None] * n_cols + c[None, :], val, mask=mask)


# (TR, BLOCK_N, num_warps); chosen per shape by a one-off timing on first use (CUDA only)
CONFIGS = ((1, 256, 4), (2, 256, 8), (1, 512, 8), (4, 128, 8), (2, 512, 8), (4, 256, 8))
_best: dict[tuple, tuple[int, int, int]] = {}


# Compiled kernels by everything that selects a specialization. Re-launching a cached kernel
# directly skips `JITFunction.run`'s argument binding, which costs about as much as decoding one
# 6144x2048 expert on an H200 (the launch, not the GPU, was the bottleneck there).
_compiled: dict[tuple, object] = {}
_fast_ok = True


def _launch(trellis, out, cb_id, rate, cfg):
    global _fast_ok
    tr, bn, nw = cfg
    k, n = out.shape
    tiles_n = trellis.shape[1]
    grid = (triton.cdiv(k, 16 * tr), triton.cdiv(n, bn), 1)
    consts = (rate.words, rate.bits, rate.half, cb_id, tr, bn)
    key = (k, n, tiles_n, consts, nw, out.device, trellis.data_ptr() % 16, out.data_ptr() % 16)
    kernel = _compiled.get(key) if _fast_ok and out.device.type == "cuda" else None
    if kernel is not None:
        try:
            stream = torch.cuda.current_stream(out.device).cuda_stream
            # triton >= 3.3 launcher ABI: grid, stream, function, metadata, launch metadata,
            # enter/exit hooks, then every bound argument (constexprs included) in order.
            kernel.run(*grid, stream, kernel.function, kernel.packed_metadata, None, None, None,
                       trellis, out, k, n, tiles_n, *consts)  # fmt: skip
            return
        except Exception:  # another triton ABI: use the regular path from now on
            _fast_ok = False
    kernel = _decode_kernel[grid](
        trellis,
        out,
        k,
        n,
        tiles_n,
        WD=rate.words,
        KB=rate.bits,
        HALF=rate.half,
        CB=cb_id,
        TR=tr,
        BLOCK_N=bn,
        num_warps=nw,
    )
    if out.device.type == "cuda" and hasattr(kernel, "run") and hasattr(kernel, "function"):
        _compiled[key] = kernel


def _pick_config(trellis, out, cb_id, rate) -> tuple[int, int, int]:
    key = (out.shape[0] >= 4096, out.shape[1], rate.words, cb_id, out.device)
    cfg = _best.get(key)
    if cfg is not None:
        return cfg
    if out.device.type != "cuda" or out.numel() < (1 << 24):
        cfg = CONFIGS[0]
    else:
        times = []
        for cand in CONFIGS:
            _launch(trellis, out, cb_id, rate, cand)  # compile + warm
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(5):
                _launch(trellis, out, cb_id, rate, cand)
            end.record()
            end.synchronize()
            times.append((start.elapsed_time(end), cand))
        cfg = min(times)[1]
    _best[key] = cfg
    return cfg


def decode_rotated(
    trellis: torch.Tensor, codebook: str, rate, out: torch.Tensor, config=None
) -> None:
    """Decode trellis [tk, tn, Wd] into out fp16 [16·tk, 16·tn] on the trellis's device."""
    trellis = trellis.contiguous()
    cb_id = _CB_ID[codebook]
    cfg = config if config is not None else _pick_config(trellis, out, cb_id, rate)
    _launch(trellis, out, cb_id, rate, cfg)
