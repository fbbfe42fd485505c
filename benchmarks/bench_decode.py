"""Trellis decode throughput (issue 3): exl3tool vs exllamav3 `reconstruct`, same run.

    python benchmarks/bench_decode.py [--cpu] [--cuda] [--codebook mcg] [--repeat 20]
                                      [--experts 64] [--no-dense] [--sweep]

Shapes: a 6144x2048 K=4 expert and an 8192x8192 K=4 dense layer (in x out). Reports weights/s for
the rotated decode (Ŵ) and the effective weight (W_eff, matmul/FMA order and fused fp16 path), the
ratio to exllamav3 (when importable) and the HBM bound = (trellis + fp16 output bytes) / 4.3 TB/s.

With --cuda it also times the expert shapes of issue 16 (6144x2048 and 2048x6144, K 2-5, MCG and
MUL1): the grouped decode (one launch for --experts matrices) against exllamav3's `reconstruct` per
call and back-to-back, and the fused effective-weight kernel against exllamav3's
`get_weight_tensor` and the previous matmul path; every output is compared bit for bit.
"""

# ruff: noqa: B023 - each timed lambda runs inside its own loop iteration

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

# On the lent H200 (torch 2.11.0+cu130), the default expandable-segments allocator made this
# script's first grouped 2048x6144 launch fail with an illegal address once exllamav3's
# get_weight_tensor and empty_cache had run in the same process (reproduced three times; with
# CUDA_LAUNCH_BLOCKING too). exl3tool's kernels alone, in the same order, pass; compute-sanitizer's
# memcheck saw no invalid access. With plain segments the whole run passes, so they are the default
# here (RESULTS, "Issue 16, sixth landing").
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exl3tool import trellis as tc
from exl3tool.trellis import _triton_group
from exl3tool.trellis.hadamard import hadamard_matrix

SHAPES = ((6144, 2048, 4), (8192, 8192, 4))
HBM_BYTES_PER_S = 4.3e12


def _cpu_time(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _cuda_time(fn, repeat: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def _cuda_stream_time(fn, repeat: int) -> float:
    """Per-call time of `repeat` back-to-back calls between two events: host launch work
    overlaps with the GPU, as when a runtime decodes a layer's experts one after another."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(repeat):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / 1e3 / repeat


def _fmt(label: str, k: int, n: int, sec: float, extra: str = "") -> str:
    return f"  {label:<34} {sec * 1e6:10.1f} us  {k * n / sec / 1e6:10.1f} M weights/s  {extra}"


def bench_cpu(cb: str, repeat: int) -> None:
    print(f"CPU ({torch.get_num_threads()} threads), codebook {cb}")
    for k, n, K in SHAPES:
        t = torch.randint(-32768, 32768, (k // 16, n // 16, 16 * K), dtype=torch.int16)
        suh, svh = torch.randn(k).half(), torch.randn(n).half()
        print(f" {k}x{n} K={K}")
        s = _cpu_time(lambda t=t: tc.decode_rotated(t, cb), repeat)
        print(_fmt("rotated (torch, new output)", k, n, s))
        out = torch.empty((k, n), dtype=torch.float16)
        s = _cpu_time(lambda t=t, out=out: tc.decode_rotated(t, cb, out=out), repeat)
        print(_fmt("rotated (torch, out= reused)", k, n, s))
        r = max(1, repeat // 5)
        s = _cpu_time(lambda t=t, suh=suh, svh=svh: tc.effective_weight(t, suh, svh, cb), r)
        print(_fmt(f"effective (auto, matmul={tc.matmul_matches_fma('cpu')})", k, n, s))
        s = _cpu_time(
            lambda t=t, suh=suh, svh=svh: tc.effective_weight(t, suh, svh, cb, method="fused"), r
        )
        print(_fmt("effective (fused fp16)", k, n, s))


def bench_cuda(cb: str, repeat: int) -> None:
    try:
        from exllamav3.ext import exllamav3_ext as ext
    except Exception as exc:
        print(f"exllamav3 not importable ({exc}); exl3tool figures only")
        ext = None
    mcg, mul1 = cb == "mcg", cb == "mul1"
    print(f"CUDA {torch.cuda.get_device_name(0)}, codebook {cb}")
    for k, n, K in SHAPES:
        t = torch.randint(
            -32768, 32768, (k // 16, n // 16, 16 * K), dtype=torch.int16, device="cuda"
        )
        suh = torch.randn(k, device="cuda").half()
        svh = torch.randn(n, device="cuda").half()
        out = torch.empty((k, n), dtype=torch.half, device="cuda")
        moved = t.numel() * 2 + k * n * 2
        bound = moved / HBM_BYTES_PER_S
        print(
            f" {k}x{n} K={K}: HBM bound {bound * 1e6:.1f} us ({moved / 1e6:.1f} MB moved at 4.3 TB/s)"
        )
        ours = _cuda_time(lambda t=t, out=out: tc.decode_rotated(t, cb, out=out), repeat)
        torch_path = _cuda_time(
            lambda t=t, out=out: tc.decode_rotated(t, cb, out=out, backend="torch"), repeat
        )
        gbs = moved / ours / 1e9
        if ext is not None:
            ref = torch.empty_like(out)
            theirs = _cuda_time(
                lambda t=t, ref=ref: ext.reconstruct(ref, t, float(K), mcg, mul1), repeat
            )
            same = torch.equal(tc.decode_rotated(t, cb).view(torch.int16), ref.view(torch.int16))
            print(_fmt("exllamav3 reconstruct", k, n, theirs, f"{moved / theirs / 1e9:.0f} GB/s"))
            print(
                _fmt(
                    "exl3tool rotated (triton)",
                    k,
                    n,
                    ours,
                    f"{gbs:.0f} GB/s  ratio {theirs / ours:.2f}x  bit-exact={same}",
                )
            )
            print(
                _fmt(
                    "exl3tool rotated (torch ops)",
                    k,
                    n,
                    torch_path,
                    f"ratio {theirs / torch_path:.3f}x",
                )
            )
            ours_s = _cuda_stream_time(
                lambda t=t, out=out: tc.decode_rotated(t, cb, out=out), repeat
            )
            theirs_s = _cuda_stream_time(
                lambda t=t, ref=ref: ext.reconstruct(ref, t, float(K), mcg, mul1), repeat
            )
            print(_fmt("exllamav3 reconstruct, back-to-back", k, n, theirs_s))
            print(
                _fmt(
                    "exl3tool rotated, back-to-back",
                    k,
                    n,
                    ours_s,
                    f"{moved / ours_s / 1e9:.0f} GB/s  ratio {theirs_s / ours_s:.2f}x",
                )
            )
            fref = torch.empty_like(out)
            fused_ref = _cuda_time(
                lambda t=t, fref=fref: ext.reconstruct_had_slice(
                    fref, t, suh, svh, float(K), mcg, mul1, 0
                ),
                repeat,
            )
            print(_fmt("exllamav3 reconstruct_had_slice", k, n, fused_ref))
        else:
            print(_fmt("exl3tool rotated (triton)", k, n, ours, f"{gbs:.0f} GB/s"))
            print(_fmt("exl3tool rotated (torch ops)", k, n, torch_path))
        r = max(3, repeat // 4)
        eff = _cuda_time(lambda t=t: tc.effective_weight(t, suh, svh, cb), r)
        print(_fmt(f"exl3tool effective (matmul={tc.matmul_matches_fma('cuda')})", k, n, eff))
        fus = _cuda_time(lambda t=t: tc.effective_weight(t, suh, svh, cb, method="fused"), r)
        print(_fmt("exl3tool effective (fused fp16)", k, n, fus))


EXPERT_SHAPES = ((6144, 2048), (2048, 6144))


def _row(label: str, theirs: float, ours: float, bound: float, same: bool) -> str:
    return (
        f"  {label:<28} exllamav3 {theirs * 1e6:8.1f} us  ours {ours * 1e6:8.1f} us  "
        f"ratio {theirs / ours:5.2f}x  bound {bound * 1e6:5.1f} us  bit-exact={same}"
    )


def _weights_loop(ts, suh, svh, cb) -> None:
    """W_eff of every expert through the loop form of the fused kernel (one grouped launch)."""
    from exl3tool.trellis.bitstream import _check_trellis

    rate = _check_trellis(ts[0])
    outs = [torch.empty((16 * t.shape[0], 16 * t.shape[1]), dtype=torch.half, device="cuda")
            for t in ts]  # fmt: skip
    _triton_group.weight_group(ts, suh, svh, outs, hadamard_matrix("cuda"), cb, rate, dot=False)


def bench_cuda_experts(repeat: int, experts: int) -> None:
    """Issue 16: grouped decode and fused W_eff on expert-sized matrices, per expert."""
    try:
        from exllamav3.ext import exllamav3_ext as ext
        from exllamav3.modules.quant.exl3 import LinearEXL3
    except Exception as exc:
        print(f"exllamav3 not importable ({exc}); exl3tool figures only")
        ext = LinearEXL3 = None
    print(f"expert shapes, {experts} experts per grouped launch (times per expert)")
    dot_form = _triton_group.dot_matches(torch.device("cuda"), hadamard_matrix("cuda"))
    print(f"W_eff kernel: FMA-dot form bit-identical to the loop form here: {dot_form}")
    for cb in ("mcg", "mul1"):
        mcg, mul1 = cb == "mcg", cb == "mul1"
        for k, n in EXPERT_SHAPES:
            for K in (2, 3, 4, 5):
                g = torch.Generator().manual_seed(k + n + K)
                ts = [
                    torch.randint(
                        -32768, 32768, (k // 16, n // 16, 16 * K), dtype=torch.int16, generator=g
                    ).cuda()
                    for _ in range(experts)
                ]
                suh = [(torch.randn(k, generator=g) + 0.1).half().cuda() for _ in ts]
                svh = [(torch.randn(n, generator=g) + 0.1).half().cuda() for _ in ts]
                moved = ts[0].numel() * 2 + k * n * 2
                bound = moved / HBM_BYTES_PER_S
                label = f"{k}x{n} K={K} {cb}"
                group = _cuda_time(lambda ts=ts: tc.decode_rotated_many(ts, cb), repeat) / experts
                mine = tc.decode_rotated_many(ts, cb)
                outs = [torch.empty_like(w) for w in mine]
                single = _cuda_time(
                    lambda t=ts[0], o=outs[0]: tc.decode_rotated(t, cb, out=o), repeat
                )

                def each_expert(ts=ts, outs=outs):
                    for t, o in zip(ts, outs, strict=True):
                        tc.decode_rotated(t, cb, out=o)

                single_b2b = _cuda_time(each_expert, repeat) / experts
                loop_form = (
                    _cuda_time(lambda ts=ts, suh=suh, svh=svh: _weights_loop(ts, suh, svh, cb),
                               max(3, repeat // 4))
                    / experts
                )  # fmt: skip
                weights = tc.effective_weights(list(zip(ts, suh, svh, strict=True)), cb)
                wgroup = (
                    _cuda_time(
                        lambda ts=ts, suh=suh, svh=svh: tc.effective_weights(
                            list(zip(ts, suh, svh, strict=True)), cb
                        ),
                        max(3, repeat // 4),
                    )
                    / experts
                )
                old = _cuda_time(
                    lambda t=ts[0], a=suh[0], b=svh[0]: tc.effective_weight(
                        t, a, b, cb, method="matmul"
                    ),
                    max(3, repeat // 4),
                )
                print(f"  {label:<28} ours: decode 1 call {single * 1e6:6.1f} us, back-to-back "
                      f"{single_b2b * 1e6:6.1f} us, grouped {group * 1e6:6.1f} us (bound "
                      f"{bound * 1e6:4.1f} us); W_eff kernel {wgroup * 1e6:6.1f} us (dot form "
                      f"{dot_form}; loop form {loop_form * 1e6:6.1f} us), matmul path "
                      f"{old * 1e6:7.1f} us")  # fmt: skip
                if ext is None:
                    continue
                ref = torch.empty((k, n), dtype=torch.half, device="cuda")
                refs = [torch.empty_like(ref) for _ in ts]
                one = _cuda_time(
                    lambda t=ts[0], ref=ref: ext.reconstruct(ref, t, float(K), mcg, mul1), repeat
                )

                def all_experts(ts=ts, refs=refs):
                    for t, r in zip(ts, refs, strict=True):
                        ext.reconstruct(r, t, float(K), mcg, mul1)

                b2b = _cuda_time(all_experts, repeat) / experts
                same = all(
                    torch.equal(a.view(torch.int16), b.view(torch.int16))
                    for a, b in zip(mine, refs, strict=True)
                )
                same = same and all(
                    torch.equal(a.view(torch.int16), b.view(torch.int16))
                    for a, b in zip(outs, refs, strict=True)
                )
                print(_row(label + " decode/call", one, single, bound, same))
                print(_row(label + " decode/b2b", b2b, single_b2b, bound, same))
                print(_row(label + " grouped/b2b", b2b, group, bound, same))
                lins = [
                    LinearEXL3(None, k, n, suh=a, svh=b, trellis=t,
                               mcg=torch.tensor(-877912083, dtype=torch.int32) if mcg else None,
                               mul1=torch.tensor(-2082680531, dtype=torch.int32) if mul1 else None)
                    for t, a, b in zip(ts[:4], suh[:4], svh[:4], strict=True)
                ]  # fmt: skip
                gwt = _cuda_time(lambda lin=lins[0]: lin.get_weight_tensor(), max(3, repeat // 4))
                wsame = all(
                    torch.equal(w.view(torch.int16), lin.get_weight_tensor().view(torch.int16))
                    for w, lin in zip(weights[:4], lins, strict=True)
                )
                print(
                    f"  {label + ' W_eff':<28} get_weight_tensor {gwt * 1e6:8.1f} us  kernel "
                    f"{wgroup * 1e6:8.1f} us  ratio {gwt / wgroup:5.2f}x  (matmul path "
                    f"{old * 1e6:8.1f} us)  bit-exact={wsame}"
                )
                del ts, refs, mine, weights
                torch.cuda.empty_cache()


def sweep_configs(experts: int) -> None:
    """Time every (tile rows, columns, warps) of the run decode on grouped launches, kernel only:
    the table and the stacked output are built once, so host work is out of the figure."""
    import itertools

    from exl3tool.trellis import _triton
    from exl3tool.trellis.bitstream import _check_trellis

    print(f"run-decode configs, {experts} experts per launch, us per expert (kernel only)")
    for k, n, K in ((6144, 2048, 4), (2048, 6144, 4), (6144, 2048, 2)):
        ts = [torch.randint(-32768, 32768, (k // 16, n // 16, 16 * K), dtype=torch.int16,
                            device="cuda") for _ in range(experts)]  # fmt: skip
        out = torch.empty((experts, k, n), dtype=torch.half, device="cuda")
        rate = _check_trellis(ts[0])
        row_stride = _triton.tile_rows(ts[0])[1]
        table = torch.tensor([t.data_ptr() for t in ts], dtype=torch.int64, device="cuda")
        res = []
        for tr, bn, nw in itertools.product((1, 2, 4, 8, 16), (32, 64, 128, 256), (1, 2, 4, 8)):
            if bn * 16 // nw < 32:
                continue
            cfg = (tr, bn, nw)

            def once(cfg=cfg, ts=ts, out=out, table=table, rate=rate, rs=row_stride):
                _triton.launch(ts[0], out, table, k // 16, n, rs, 1, rate, cfg, grid_z=experts)

            t = _cuda_stream_time(once, 10)
            res.append((t / experts, cfg))
        res.sort()
        bound = (ts[0].numel() * 2 + k * n * 2) / HBM_BYTES_PER_S
        best = ", ".join(f"{c}: {t * 1e6:.1f}" for t, c in res[:6])
        worst = ", ".join(f"{c}: {t * 1e6:.1f}" for t, c in res[-3:])
        print(f"  {k}x{n} K={K} (bound {bound * 1e6:.1f} us) best {best}; worst {worst}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--cuda", action="store_true")
    ap.add_argument("--codebook", default="mcg", choices=tc.CODEBOOKS)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--no-dense", action="store_true", help="skip the 6144x2048/8192x8192 section")
    ap.add_argument("--sweep", action="store_true", help="time every run-decode config (CUDA)")
    args = ap.parse_args()
    do_cpu = args.cpu or not args.cuda
    do_cuda = args.cuda or (not args.cpu and torch.cuda.is_available())
    if do_cpu:
        bench_cpu(args.codebook, max(3, args.repeat // 4))
    if do_cuda:
        if args.sweep:
            sweep_configs(args.experts)
        if not args.no_dense:
            bench_cuda(args.codebook, args.repeat)
        bench_cuda_experts(args.repeat, args.experts)
        from exl3tool.trellis import _triton

        print(f"triton direct relaunch of cached kernels: {_triton._fast_ok}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
