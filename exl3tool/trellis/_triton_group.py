"""Grouped Triton kernels: one launch decodes many same-shaped matrices (all experts of a projection).

* `decode_group`: Ŵ of each matrix (exllamav3's `ext.reconstruct`, bit for bit), through the
  per-matrix run decode of `_triton` with the matrix taken from program_id(2).
* `weight_group`: W_eff of each matrix (§5.3) in the sequential-FMA order of §5.4, fused: a program
  owns one 128 x 128 block, decodes it, runs the left Hadamard as 128 fp32 FMA steps, rounds, scales
  by suh, runs the right Hadamard the same way, rounds, scales by svh. The block's own output
  region is the scratch between the steps (the right transform reads the transposed intermediate
  row by row), so no other memory is touched.

Matrices are passed as a table of raw device addresses (int64), one row per matrix. With
TRITON_INTERPRET=1 both kernels run on CPU tensors (tests only); there the FMA is emulated in float64
(`EMU`), as the CPU reference in `hadamard.py` does.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch

from exl3tool.trellis import _triton
from exl3tool.trellis._triton import HAVE_TRITON

if HAVE_TRITON:  # pragma: no cover - depends on the environment
    import triton
    import triton.language as tl

    from exl3tool.trellis._triton import tile_values

    @triton.jit
    def _fma32(a, b, acc, EMU: tl.constexpr):
        if EMU:  # interpreter: numpy has no fma; f64 product is exact (§5.4 emulation)
            return (a.to(tl.float64) * b.to(tl.float64) + acc.to(tl.float64)).to(tl.float32)
        else:
            return tl.fma(a, b, acc)

    @triton.jit
    def _group_weight_kernel(
        table_ptr,
        had_ptr,
        row0,
        col0,
        n_out,
        tiles_n,
        WD: tl.constexpr,
        KB: tl.constexpr,
        HALF: tl.constexpr,
        CB: tl.constexpr,
        EMU: tl.constexpr,
        DOT: tl.constexpr,
    ):
        pid_r = tl.program_id(0)
        pid_c = tl.program_id(1)
        m = tl.program_id(2)
        trellis_ptr = tl.load(table_ptr + 4 * m).to(tl.pointer_type(tl.int16))
        suh_ptr = tl.load(table_ptr + 4 * m + 1).to(tl.pointer_type(tl.float16))
        svh_ptr = tl.load(table_ptr + 4 * m + 2).to(tl.pointer_type(tl.float16))
        out_ptr = tl.load(table_ptr + 4 * m + 3).to(tl.pointer_type(tl.float16))
        i = tl.arange(0, 128)
        j = tl.arange(0, 128)
        r_base = pid_r * 128
        c_base = pid_c * 128
        block = out_ptr + (r_base + i)[:, None] * n_out + (c_base + j)[None, :]
        if DOT:
            # the same FMA chains through the FMA dot (fp32, "ieee": no tensor cores), 16 steps
            # of t per dot; each dot continues its accumulator in t order, one tile row at a time
            acc = tl.zeros((128, 128), dtype=tl.float32)
            for tr in range(8):
                t16 = tr * 16 + tl.arange(0, 16)
                w = tile_values(
                    trellis_ptr,
                    (row0 + r_base + t16)[:, None],
                    (col0 + c_base + j)[None, :],
                    tiles_n,
                    (j < 128)[None, :],
                    WD,
                    KB,
                    HALF,
                    CB,
                )
                c = tl.load(had_ptr + i[:, None] * 128 + t16[None, :])
                acc = tl.dot(c, w.to(tl.float32), acc, input_precision="ieee")
            su = tl.load(suh_ptr + r_base + i).to(tl.float32)
            y = (acc.to(tl.float16).to(tl.float32) * su[:, None]).to(tl.float16)
            tl.store(block, y)
            tl.debug_barrier()
            acc = tl.zeros((128, 128), dtype=tl.float32)
            for tr in range(8):
                t16 = tr * 16 + tl.arange(0, 16)
                yt = tl.load(out_ptr + (r_base + i)[:, None] * n_out + (c_base + t16)[None, :])
                c = tl.load(had_ptr + t16[:, None] * 128 + j[None, :])
                acc = tl.dot(yt.to(tl.float32), c, acc, input_precision="ieee")
            sv = tl.load(svh_ptr + c_base + j).to(tl.float32)
            z = (acc.to(tl.float16).to(tl.float32) * sv[None, :]).to(tl.float16)
            tl.debug_barrier()
            tl.store(block, z)
        else:
            # 1. Ŵ of the block into its own output region
            w = tile_values(
                trellis_ptr,
                (row0 + r_base + i)[:, None],
                (col0 + c_base + j)[None, :],
                tiles_n,
                (j < 128)[None, :],
                WD,
                KB,
                HALF,
                CB,
            )
            tl.store(block, w)
            tl.debug_barrier()
            # 2. left transform: acc[i, j] = sum_t C[i, t] * Ŵ[t, j], t = 0..127, one fp32 FMA each
            acc = tl.zeros((128, 128), dtype=tl.float32)
            for t in range(128):
                x = tl.load(out_ptr + (r_base + t) * n_out + c_base + j).to(tl.float32)
                c = tl.load(had_ptr + i * 128 + t)
                acc = _fma32(c[:, None], x[None, :], acc, EMU)
            su = tl.load(suh_ptr + r_base + i).to(tl.float32)
            y = (acc.to(tl.float16).to(tl.float32) * su[:, None]).to(tl.float16)
            tl.debug_barrier()
            # 3. the intermediate, transposed, into the region: row t of the region = column t of y
            tl.store(out_ptr + (r_base + j)[None, :] * n_out + (c_base + i)[:, None], y)
            tl.debug_barrier()
            # 4. right transform: acc[i, j] = sum_t y[i, t] * C[t, j], same order
            acc = tl.zeros((128, 128), dtype=tl.float32)
            for t in range(128):
                yt = tl.load(out_ptr + (r_base + t) * n_out + c_base + i).to(tl.float32)
                c = tl.load(had_ptr + t * 128 + j)
                acc = _fma32(yt[:, None], c[None, :], acc, EMU)
            sv = tl.load(svh_ptr + c_base + j).to(tl.float32)
            z = (acc.to(tl.float16).to(tl.float32) * sv[None, :]).to(tl.float16)
            tl.debug_barrier()
            tl.store(block, z)


# matrices per launch: the grid's third dimension holds at most 65535 programs
MAX_GROUP = 65535
WEIGHT_WARPS = 8


def launch_grouped(
    trellises: Sequence[torch.Tensor],
    codebook: str,
    device: torch.device,
    launch,
    stacked: bool = False,
) -> list[torch.Tensor]:
    """fp16 outputs [16·tk, 16·tn] of many trellises, in their order: one `launch(idx, outs,
    codebook_name, rate)` per group of one shape and rate (at most MAX_GROUP matrices each).

    stacked: outs is one tensor [len(idx), 16·tk, 16·tn] (the outputs are its views), else a list."""
    from exl3tool.trellis.bitstream import TILE, _check_trellis
    from exl3tool.trellis.decode import check_rate_codebook

    groups: dict[tuple, list[int]] = {}
    for i, t in enumerate(trellises):
        groups.setdefault((tuple(t.shape), _check_trellis(t)), []).append(i)
    result: list[torch.Tensor | None] = [None] * len(trellises)
    for (shape, rate), idx in groups.items():
        name = check_rate_codebook(rate, codebook)
        size = (shape[0] * TILE, shape[1] * TILE)
        for a in range(0, len(idx), MAX_GROUP):
            part = idx[a : a + MAX_GROUP]
            if stacked:
                outs = torch.empty((len(part), *size), dtype=torch.float16, device=device)
                launch(part, outs, name, rate)
                views = outs.unbind(0)
            else:
                views = [torch.empty(size, dtype=torch.float16, device=device) for _ in part]
                launch(part, views, name, rate)
            for i, w in zip(part, views, strict=True):
                result[i] = w
    return result  # type: ignore[return-value]


def _table(rows: Sequence[Sequence[torch.Tensor]], device: torch.device) -> torch.Tensor:
    return torch.tensor([[t.data_ptr() for t in r] for r in rows], dtype=torch.int64).to(device)


def decode_group(
    trellises: Sequence[torch.Tensor],
    out: torch.Tensor,
    codebook: str,
    rate,
    config: tuple[int, int, int] | None = None,
) -> None:
    """Decode each trellis [tk, tn, Wd] into out[i] (out: contiguous fp16 [m, 16·tk, 16·tn]), in
    one launch. All trellises share shape and rate and lie on out's device."""
    tiles_k = trellises[0].shape[0]
    n = out.shape[2]
    views = [_triton.tile_rows(t) for t in trellises]
    if any(rs != views[0][1] for _, rs in views):
        views = [_triton.tile_rows(t.contiguous()) for t in trellises]
    row_stride = views[0][1]
    words = [w for w, _ in views]
    table = torch.tensor([w.data_ptr() for w in words], dtype=torch.int64).to(out.device)
    cb_id = _triton._CB_ID[codebook]

    def run(cfg):
        _triton.launch(words[0], out, table, tiles_k, n, row_stride, cb_id, rate, cfg,
                       grid_z=len(words))  # fmt: skip

    def agrees() -> bool:  # the first matrix stands for the group: one kernel decodes them all
        return _triton.same_bits(out[0], _triton.torch_decode(trellises[0], codebook))

    cfg = config or _triton.pick_config(tiles_k, n, cb_id, rate, out.device, run, agrees)
    if cfg is None:  # no config of this build decodes this rate right: the torch path
        for t, o in zip(trellises, out, strict=True):
            o.copy_(_triton.torch_decode(t, codebook))
        return
    run(cfg)


def weight_group(
    trellises: Sequence[torch.Tensor],
    suhs: Sequence[torch.Tensor],
    svhs: Sequence[torch.Tensor],
    outs: Sequence[torch.Tensor],
    had: torch.Tensor,
    codebook: str,
    rate,
    row0: int = 0,
    col0: int = 0,
    dot: bool | None = None,
) -> None:
    """W_eff of rows [row0, row0 + k), cols [col0, col0 + n) of each trellis into its out [k, n].

    trellises: contiguous, full [tk, tn, Wd], same shape and rate; suhs / svhs: fp16 [k] / [n],
    already cut to the range; had: fp32 C = H_128 / √128 [128, 128]; all on one device. Ranges lie
    on 128 boundaries. dot: use the FMA-dot form (default: where `dot_matches(device)`)."""
    k, n = outs[0].shape
    tiles_n = trellises[0].shape[1]
    dev = trellises[0].device
    if dot is None:
        dot = dot_matches(dev, had)
    table = _table(list(zip(trellises, suhs, svhs, outs, strict=True)), dev)
    grid = (k // 128, n // 128, len(trellises))
    cb = _triton._CB_ID[codebook]

    def run() -> None:
        _group_weight_kernel[grid](
            table,
            had,
            row0,
            col0,
            n,
            tiles_n,
            WD=rate.words,
            KB=rate.bits,
            HALF=rate.half,
            CB=cb,
            EMU=dev.type == "cpu",
            DOT=dot,
            num_warps=WEIGHT_WARPS,
        )

    variant = (dev, rate, cb, dot, _triton._specialized(row0, col0, n, tiles_n))
    if variant in _launched:
        run()
        return
    with _compile_lock(variant):  # a variant another thread is compiling is waited for
        run()
        _launched.add(variant)


# Kernel variants launched once (compiled): their first launch runs under a per-variant lock,
# so a warm-up thread (`warm_weights`) and the decode never compile the same variant twice.
_launched: set[tuple] = set()
_locks: dict[tuple, threading.Lock] = {}
_locks_guard = threading.Lock()


def _compile_lock(variant: tuple) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(variant, threading.Lock())


def warm_weights(device: torch.device, ks: Sequence[int], codebook: str = "mcg") -> list[int]:
    """Compile the W_eff kernel for each integer K on `device`; the K values warmed, in order.

    The variants are compiled in parallel where Triton can (`triton.AsyncCompileMode`; most of a
    compile runs outside the GIL): the dot-form check's two variants and, speculatively, the dot
    form of each K. Each K is then run once on a 256 x 256 matrix. Any failure stops the warm-up
    silently: the decode then compiles what it needs itself, as without a warm-up."""
    dev = _indexed(device)
    if dev.type != "cuda":
        return _warm(dev, ks, codebook)
    with torch.cuda.device(dev):  # a new thread's current device is 0, not this rank's
        return _warm(dev, ks, codebook)


def _warm(dev: torch.device, ks: Sequence[int], codebook: str) -> list[int]:
    from exl3tool.trellis.bitstream import rate_from_k
    from exl3tool.trellis.errors import TrellisError
    from exl3tool.trellis.hadamard import hadamard_matrix

    done: list[int] = []
    try:
        had = hadamard_matrix(dev)
        rates = []
        for k in ks:  # up to the first K that is no trellis rate
            try:
                rates.append(rate_from_k(k))
            except TrellisError:
                break
        if dev.type == "cuda":
            check = rate_from_k(DOT_CHECK_K)
            _compile_ahead(dev, had, [(check, False), (check, True)] + [(r, True) for r in rates],
                           codebook)  # fmt: skip
        dot = dot_matches(dev, had)
        g = torch.Generator().manual_seed(7)
        for k, rate in zip(ks, rates, strict=False):
            t = torch.randint(-32768, 32768, (16, 16, rate.words), dtype=torch.int16, generator=g)
            scale = torch.ones(256, dtype=torch.float16, device=dev)
            out = torch.empty(256, 256, dtype=torch.float16, device=dev)
            weight_group([t.to(dev)], [scale], [scale], [out], had, codebook, rate, dot=dot)
            done.append(k)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    except Exception:  # warm-up is an optimisation only
        pass
    return done


def _indexed(device: torch.device) -> torch.device:
    """`device` with its index (the form a tensor's `.device` has)."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return dev


def _compile_ahead(dev: torch.device, had: torch.Tensor, forms: list, codebook: str) -> None:
    """Compile the W_eff variants (rate, dot form) of a 256 x 256 launch in parallel, each under
    its variant lock, released as soon as that variant is ready (a decode waits for its own
    variant only, not for the whole batch); a variant already compiled or being compiled
    elsewhere is skipped. Without `triton.AsyncCompileMode` (older Triton) nothing is compiled
    here."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    mode = getattr(triton, "AsyncCompileMode", None)
    if mode is None:
        return
    cb = _triton._CB_ID[codebook]
    held: list[tuple[tuple, threading.Lock]] = []
    table = torch.zeros((1, 4), dtype=torch.int64, device=dev)
    try:
        for rate, dot in dict.fromkeys(forms):
            variant = (dev, rate, cb, dot, _triton._specialized(0, 0, 256, 16))
            lock = _compile_lock(variant)
            if variant in _launched or not lock.acquire(blocking=False):
                continue
            held.append((variant, lock))
        if not held:
            return
        with ThreadPoolExecutor(len(held)) as pool, mode(pool):
            pending = {}
            for variant, lock in held:
                _, rate, _, dot, _ = variant
                compiled = _group_weight_kernel.warmup(
                    table, had, 0, 0, 256, 16,
                    WD=rate.words, KB=rate.bits, HALF=rate.half, CB=cb, EMU=False, DOT=dot,
                    num_warps=WEIGHT_WARPS, grid=(1, 1, 1),
                )  # fmt: skip
                future = getattr(compiled, "future", None)
                if future is not None:
                    pending[future] = (variant, lock, compiled)
            for future in as_completed(pending):
                variant, lock, compiled = pending[future]
                compiled.result()  # into the kernel cache: a launch now finds it compiled
                _launched.add(variant)
                held.remove((variant, lock))
                lock.release()
        for variant, _ in held:
            _launched.add(variant)
    finally:
        for _, lock in held:
            lock.release()


_dot_ok: dict[torch.device, bool] = {}
DOT_CHECK_K = 4  # the rate of the matrix on which `dot_matches` compares the two forms


def dot_matches(device: torch.device, had: torch.Tensor) -> bool:
    """Whether the FMA-dot form gives the loop form's W_eff bit for bit here (checked once).

    The loop form issues the §5.4 FMAs one by one; the dot form relies on Triton's FMA dot
    continuing each accumulator in t order. Only CUDA builds take it (the interpreter's dot is a
    numpy matmul); a compile failure or any difference keeps the loop form."""
    if device.type != "cuda":
        return False
    ok = _dot_ok.get(device)
    if ok is not None:
        return ok
    with _compile_lock(("dot_matches", device)):
        ok = _dot_ok.get(device)
        if ok is None:
            ok = _dot_matches(device, had)
            _dot_ok[device] = ok
    return ok


def _dot_matches(device: torch.device, had: torch.Tensor) -> bool:
    from exl3tool.trellis.bitstream import _check_trellis

    g = torch.Generator().manual_seed(54)
    shape = (16, 16, 16 * DOT_CHECK_K)
    t = torch.randint(-32768, 32768, shape, dtype=torch.int16, generator=g).to(device)
    su = (torch.randn(256, generator=g) + 0.1).half().to(device)
    sv = (torch.randn(256, generator=g) + 0.1).half().to(device)
    outs = [torch.empty(256, 256, dtype=torch.float16, device=device) for _ in range(2)]
    rate = _check_trellis(t)
    try:
        for out, form in zip(outs, (False, True), strict=True):
            weight_group([t], [su], [sv], [out], had, "mcg", rate, dot=form)
        return torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))
    except Exception:  # any failure of the dot build keeps the loop form
        return False
