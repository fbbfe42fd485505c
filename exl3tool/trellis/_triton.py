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
        return codebook_value((v >> (16 - o).to(tl.uint32)) & 0xFFFF, CB)

    @triton.jit
    def codebook_value(s, CB):
        """fp16 codebook value (§4) of the uint32 16-bit states s (the table's arithmetic)."""
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
    def _run_decode_kernel(
        words_ptr,
        out_ptr,
        table_ptr,
        tiles_k,
        n_cols,
        row_stride,
        WD: tl.constexpr,
        KB: tl.constexpr,
        HALF: tl.constexpr,
        CB: tl.constexpr,
        RUN: tl.constexpr,
        TR: tl.constexpr,
        BLOCK_N: tl.constexpr,
        GROUPED: tl.constexpr,
    ):
        """Ŵ of TR tile rows x BLOCK_N columns, one run of RUN consecutive positions per thread.

        Positions 4m .. 4m+3 of a tile are rows b, b+1, b+8, b+9 of one column (§3.4), and their
        states lie in RUN·K + 16 - K consecutive ring bits (§3.3): one pair of u32 words (MSB-first)
        holds them all, so each run costs two loads and one shift per weight. The run's word
        pair and offset are the same in every tile, so they are computed once per program.
        words_ptr: the int16 trellis, read as u32 [tiles, Wd/2] with row_stride u32 words per
        tile row; with GROUPED, entry m of the int64 table is the trellis of matrix program_id(2)
        and its output follows the previous one's in out_ptr (outputs stacked)."""
        pid_r = tl.program_id(0)
        pid_n = tl.program_id(1)
        if GROUPED:
            m = tl.program_id(2)
            words_ptr = tl.load(table_ptr + m).to(tl.pointer_type(tl.int32))
            out_ptr += m.to(tl.int64) * (tiles_k * 16 * n_cols)
        else:
            words_ptr = words_ptr.to(tl.pointer_type(tl.int32))
        WU: tl.constexpr = WD // 2
        R: tl.constexpr = 16 * WD
        RUNS: tl.constexpr = 16 // RUN
        g = tl.arange(0, RUNS)[:, None]
        c = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        cc = c & 15
        # first row of run g and its position (rows b + (0, 1) [+ (8, 9)], §3.4)
        if RUN == 4:
            b = 2 * g
            q = 8 * g + 32 * (cc & 7) + 4 * (cc >> 3)
        else:
            b = 2 * (g & 3) + 8 * (g >> 2)
            q = 8 * (g & 3) + 2 * (g >> 2) + 32 * (cc & 7) + 4 * (cc >> 3)
        e = (q + 1) * (2 * KB + 1) >> 1 if HALF else (q + 1) * KB
        st = e + (R - 16)
        st = tl.where(st >= R, st - R, st)
        j = st >> 5
        j2 = tl.where(j + 1 == WU, 0, j + 1)
        o = (st & 31).to(tl.uint64)
        off_hi = (c >> 4) * WU + j
        off_lo = (c >> 4) * WU + j2
        out_off = b * n_cols + c
        cmask = c < n_cols
        for t in range(TR):
            tk = pid_r * TR + t
            mask = cmask & (tk < tiles_k)
            base = words_ptr + tk * row_stride
            hi = tl.load(base + off_hi, mask=mask, other=0).to(tl.uint32, bitcast=True)
            lo = tl.load(base + off_lo, mask=mask, other=0).to(tl.uint32, bitcast=True)
            v = (hi.to(tl.uint64) << 32) | lo.to(tl.uint64)
            row = out_ptr + tk * 16 * n_cols + out_off
            for i in tl.static_range(RUN):
                # bits from position q's state to position q+i's: q is even, so this is constant
                D = (1 + i * (2 * KB + 1)) >> 1 if HALF else i * KB
                s = ((v >> (48 - D - o)) & 0xFFFF).to(tl.uint32)
                tl.store(row + ((i & 1) + 8 * (i >> 1)) * n_cols, codebook_value(s, CB), mask=mask)


def run_length(rate) -> int:
    """Positions per thread run: 4 while their states fit one u32 word pair, else 2 (K > 5)."""
    last = (1 + 3 * (2 * rate.bits + 1)) >> 1 if rate.half else 3 * rate.bits
    return 4 if last + 16 <= 33 else 2


# (TR, BLOCK_N, num_warps); chosen per shape by a one-off timing on first use (CUDA only)
CONFIGS = ((1, 128, 1), (1, 256, 1), (1, 64, 1), (4, 128, 1), (1, 256, 2), (4, 128, 2))
TUNE_CALLS = 20
_best: dict[tuple, tuple[int, int, int]] = {}

# Compiled kernels by everything that selects a specialization. Re-launching a cached kernel
# directly skips `JITFunction.run`'s argument binding, which costs about as much as decoding one
# 6144x2048 expert on an H200 (the launch, not the GPU, was the bottleneck there).
_compiled: dict[tuple, object] = {}
_fast_ok = True


def _current_stream(device: torch.device) -> int:
    try:
        return torch._C._cuda_getCurrentRawStream(device.index)
    except Exception:  # pragma: no cover - other torch builds
        return torch.cuda.current_stream(device).cuda_stream


def _geometry(tiles_k, n, cb_id, rate, cfg, grid_z, grouped) -> tuple[tuple, tuple]:
    """(grid, constexpr arguments) of one run-decode launch."""
    tr, bn, _ = cfg
    grid = (triton.cdiv(tiles_k, tr), triton.cdiv(n, bn), grid_z)
    return grid, (rate.words, rate.bits, rate.half, cb_id, run_length(rate), tr, bn, grouped)


def _specialized(*args) -> tuple:
    """What Triton specializes a compiled kernel on, per argument: a pointer's 16-byte alignment,
    an integer's divisibility by 16 and equality to 1. A kernel kept for relaunch is reused only
    for arguments that would have compiled to the same specialization."""
    return tuple(
        a.data_ptr() % 16 == 0 if isinstance(a, torch.Tensor) else (a == 1, a % 16 == 0)
        for a in args
    )


def _starter(kernel) -> tuple:
    """(launch function, its arguments between the stream and the kernel's own) of a compiled kernel.

    Triton's launcher object (>= 3.3) takes grid, stream, function, metadata, launch metadata and
    enter/exit hooks, then every bound argument (constexprs too). Where its call only forwards to
    the compiled C launcher (no scratch memory, Triton 3.5/3.6), that launcher is called directly,
    one Python frame less per launch."""
    run = kernel.run
    head = (kernel.function, kernel.packed_metadata, None, None, None)
    call = getattr(type(run).__call__, "__code__", None)
    if (
        call is not None
        and "allocate_scratch" in call.co_varnames
        and callable(getattr(run, "launch", None))
        and getattr(run, "global_scratch_size", 1) == 0
        and getattr(run, "profile_scratch_size", 1) == 0
        and hasattr(run, "launch_cooperative_grid")
        and hasattr(run, "launch_pdl")
    ):
        fixed = (run.launch_cooperative_grid, run.launch_pdl, None, None)
        return run.launch, (kernel.function, *fixed, *head[1:])
    return run, head


def _run_compiled(starter, grid, device, args) -> None:
    """Launch a compiled kernel directly (see `_starter`). Pointer arguments are passed as
    addresses: the launcher then skips its own per-pointer driver query; every caller has already
    checked that they are CUDA tensors on `device`."""
    fn, head = starter
    fn(*grid, _current_stream(device), *head, *args)


def launch(trellis, out, table, tiles_k, n, row_stride, cb_id, rate, cfg, grid_z=1):
    """One launch of the run decode; (compiled kernel, starter) on CUDA, for `remember`, or None.

    trellis: int16 with contiguous tiles (any of the group when `table` is given); out: the
    output, or with a table the stacked outputs of all grid_z matrices."""
    global _fast_ok
    tr, bn, nw = cfg
    grouped = table is not None
    grid, consts = _geometry(tiles_k, n, cb_id, rate, cfg, grid_z, grouped)
    dev = out.device
    table_arg = table if grouped else trellis
    key = (consts, nw, dev, _specialized(trellis, out, table_arg, tiles_k, n, row_stride))
    kept = _compiled.get(key) if _fast_ok and dev.type == "cuda" else None
    if kept is not None:
        try:
            _run_compiled(kept[1], grid, dev, (trellis.data_ptr(), out.data_ptr(),
                          table_arg.data_ptr(), tiles_k, n, row_stride, *consts))  # fmt: skip
            return kept
        except Exception:  # another triton ABI: use the regular path from now on
            _fast_ok = False
    kernel = _run_decode_kernel[grid](
        trellis,
        out,
        table_arg,
        tiles_k,
        n,
        row_stride,
        WD=rate.words,
        KB=rate.bits,
        HALF=rate.half,
        CB=cb_id,
        RUN=run_length(rate),
        TR=tr,
        BLOCK_N=bn,
        GROUPED=grouped,
        num_warps=nw,
    )
    if dev.type == "cuda" and hasattr(kernel, "run") and hasattr(kernel, "function"):
        kept = _compiled[key] = (kernel, _starter(kernel))
        return kept
    return None


def tile_rows(trellis: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(trellis [tk, tn, Wd] with contiguous tiles at a 4-byte address, u32 words per tile row)."""
    if trellis.is_contiguous() and not trellis.data_ptr() % 4:
        return trellis, trellis.shape[1] * trellis.shape[2] // 2
    if trellis.stride(2) != 1 or trellis.stride(1) != trellis.shape[2] or trellis.data_ptr() % 4:
        trellis = trellis.contiguous()
    if trellis.data_ptr() % 4:  # pragma: no cover - torch allocations are aligned
        trellis = trellis.clone()
    if trellis.shape[0] > 1:
        return trellis, trellis.stride(0) // 2
    return trellis, trellis.shape[1] * trellis.shape[2] // 2


def pick_config(tiles_k, n, cb_id, rate, device, try_launch, agrees) -> tuple[int, int, int] | None:
    """The fastest of CONFIGS for this shape and rate whose output equals the torch path's bit for
    bit, chosen once per process; None when no config does (the caller then decodes with torch).

    try_launch(config) decodes with that config; agrees() then says whether its output equals the
    torch path. Timed on CUDA for shapes of at least 2^20 weights, else the first config that
    agrees. The bits are checked because a build can miscompile one config: with Triton 3.6 on
    an H200, (1, 256, 1) decoded K = 2 wrongly, every other config right (RESULTS, eighth landing)."""
    key = (tiles_k, n, rate.words, cb_id, device)
    if key in _best:
        return _best[key]
    timed = device.type == "cuda" and 16 * tiles_k * n >= (1 << 20)
    good: list[tuple[float, tuple[int, int, int]]] = []
    for cand in CONFIGS:
        try_launch(cand)  # compile + warm
        if not agrees():
            continue
        if not timed:
            good.append((0.0, cand))
            break
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(TUNE_CALLS):
            try_launch(cand)
        end.record()
        end.synchronize()
        good.append((start.elapsed_time(end), cand))
    cfg = min(good)[1] if good else None
    _best[key] = cfg
    return cfg


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


def torch_decode(trellis: torch.Tensor, codebook: str) -> torch.Tensor:
    """Ŵ by the torch path (the reference a kernel config must equal)."""
    from exl3tool.trellis.decode import decode_rotated as decode

    return decode(trellis, codebook, backend="torch")


def decode_rotated(
    trellis: torch.Tensor, codebook: str, rate, out: torch.Tensor, remember=None
) -> None:
    """Decode trellis [tk, tn, Wd] into out fp16 [16·tk, 16·tn] on the same device.

    remember: the caller's codebook argument; when given (the whole-matrix call of the public
    API, arguments already checked) a CUDA launch is kept for `relaunch` under this call's key."""
    words, row_stride = tile_rows(trellis)
    tiles_k = trellis.shape[0]
    n = out.shape[1]
    cb_id = _CB_ID[codebook]
    cfg = pick_config(
        tiles_k, n, cb_id, rate, out.device,
        lambda cand: launch(words, out, None, tiles_k, n, row_stride, cb_id, rate, cand),
        lambda: same_bits(out, torch_decode(trellis, codebook)),
    )  # fmt: skip
    if cfg is None:  # no config of this build decodes this rate right: the torch path
        out.copy_(torch_decode(trellis, codebook))
        return
    kept = launch(words, out, None, tiles_k, n, row_stride, cb_id, rate, cfg)
    if remember is not None and kept is not None and words is trellis and _fast_ok:
        grid, consts = _geometry(tiles_k, n, cb_id, rate, cfg, 1, False)
        _plans[_plan_key(trellis, remember, out)] = (
            kept[1],
            grid,
            out.device,
            (tiles_k, n, row_stride, *consts),
        )


# Whole-matrix calls already seen, by everything their checks depended on: a repeat call
# (the next expert of the same shape) relaunches the compiled kernel with no other Python.
_plans: dict[tuple, tuple] = {}


def _plan_key(trellis: torch.Tensor, codebook, out: torch.Tensor) -> tuple:
    return (
        trellis.shape, trellis.stride(), trellis.dtype, trellis.device, codebook,
        out.shape, out.stride(), out.dtype, out.device,
        trellis.data_ptr() % 16, out.data_ptr() % 16,
    )  # fmt: skip


def relaunch(trellis: torch.Tensor, codebook, out: torch.Tensor) -> bool:
    """Decode like a previous whole-matrix call with the same key; False when there was none."""
    global _fast_ok
    if not _fast_ok:
        return False
    plan = _plans.get(_plan_key(trellis, codebook, out))
    if plan is None:
        return False
    starter, grid, dev, args = plan
    try:
        words = trellis.data_ptr()
        _run_compiled(starter, grid, dev, (words, out.data_ptr(), words, *args))
    except Exception:  # another triton ABI: the regular path from now on
        _fast_ok = False
        return False
    return True
