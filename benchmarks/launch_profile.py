"""Where one decode call's time goes on CUDA (issue 16, per call): host work, step by step,
and GPU time with the host hidden, for exl3tool and exllamav3 `reconstruct` (when importable).

    python benchmarks/launch_profile.py [--calls 200] [--repeat 30]

Host µs: `--calls` calls queued behind a long `torch.cuda._sleep`, so the GPU never makes the
host wait; the batch's perf_counter time / calls. Steps of exl3tool's repeat call: the public
call (`decode_rotated(t, cb, out=o)`), `relaunch`, the plan lookup alone, the compiled start
with its arguments ready, and the launcher alone with the stream read once. References: a torch
`add_` on one element (torch's own launch path) and exllamav3's `reconstruct`.
GPU µs: one call between two events recorded behind a sleep (host work hidden).
Per call µs: one call between two events with an idle GPU, as `bench_decode.py` times it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exl3tool import trellis as tc
from exl3tool.trellis import _triton

SLEEP_CYCLES = 40_000_000  # ~20 ms at 2 GHz: longer than any batch of host work below
CASES = ((6144, 2048, 4, "mcg"), (2048, 6144, 4, "mcg"), (6144, 2048, 2, "mul1"))


def host_us(fn, calls: int, rounds: int = 5) -> float:
    """Median over rounds of the host time per call, the GPU kept busy by a sleep."""
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(rounds):
        torch.cuda._sleep(SLEEP_CYCLES)
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(out)


def _event_us(fn, repeat: int, before) -> float:
    """Median µs between two events around one call, `before()` run ahead of each."""
    out = []
    for _ in range(repeat):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        before()
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3)
    return statistics.median(out)


def gpu_us(fn, repeat: int) -> float:
    """GPU time of one call, its host work hidden behind a sleep."""
    return _event_us(fn, repeat, lambda: torch.cuda._sleep(SLEEP_CYCLES // 20))


def per_call_us(fn, repeat: int) -> float:
    """One call between two events on an idle GPU (host work included)."""
    return _event_us(fn, repeat, torch.cuda.synchronize)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=30)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to profile")
        return 0
    try:
        from exllamav3.ext import exllamav3_ext as ext
    except Exception as exc:
        print(f"exllamav3 not importable ({type(exc).__name__}: {exc}); exl3tool only")
        ext = None
    dev = torch.device("cuda")
    one = torch.zeros(1, device=dev)
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print(f"torch add_ on one element: host {host_us(lambda: one.add_(1), args.calls):.2f} us")
    print(
        f"_current_stream: host {host_us(lambda: _triton._current_stream(dev), args.calls):.2f} us"
    )
    for k, n, K, cb in CASES:
        g = torch.Generator().manual_seed(k + n + K)
        t = torch.randint(-32768, 32768, (k // 16, n // 16, 16 * K), dtype=torch.int16,
                          generator=g).to(dev)  # fmt: skip
        o = torch.empty((k, n), dtype=torch.half, device=dev)
        tc.decode_rotated(t, cb, out=o)  # the first call: checks, tuning, the plan
        plan = _triton._plans.get(_triton._plan_key(t, cb, o))
        print(f"{k}x{n} K={K} {cb}: plan kept: {plan is not None}, direct start "
              f"{_triton._fast_ok}")  # fmt: skip
        rows = [
            ("decode_rotated(t, cb, out=o)", lambda t=t, o=o, cb=cb: tc.decode_rotated(t, cb, out=o)),
            ("_triton.relaunch", lambda t=t, o=o, cb=cb: _triton.relaunch(t, cb, o)),
            ("plan lookup only", lambda t=t, o=o, cb=cb: _triton._plans.get(_triton._plan_key(t, cb, o))),
        ]  # fmt: skip
        if plan is not None:
            starter, grid, pdev, rest = plan
            ptrs = (t.data_ptr(), o.data_ptr(), t.data_ptr(), *rest)
            fn, head = starter
            stream = _triton._current_stream(pdev)
            rows.append(("_run_compiled, args ready",
                         lambda s=starter, gr=grid, d=pdev, a=ptrs: _triton._run_compiled(s, gr, d, a)))  # fmt: skip
            rows.append(("launcher alone, stream read once",
                         lambda fn=fn, gr=grid, s=stream, h=head, a=ptrs: fn(*gr, s, *h, *a)))  # fmt: skip
        if ext is not None:
            ref = torch.empty_like(o)
            rows.append(("exllamav3 reconstruct",
                         lambda r=ref, t=t, K=K, cb=cb: ext.reconstruct(r, t, float(K), cb == "mcg", cb == "mul1")))  # fmt: skip
        for label, fn in rows:
            print(f"  host {label:<36} {host_us(fn, args.calls):7.2f} us")
        ours = rows[0][1]
        print(f"  gpu  exl3tool {gpu_us(ours, args.repeat):7.2f} us, per call "
              f"{per_call_us(ours, args.repeat):7.2f} us")  # fmt: skip
        if ext is not None:
            theirs = rows[-1][1]
            same = torch.equal(o.view(torch.int16), ref.view(torch.int16))
            print(f"  gpu  exllamav3 {gpu_us(theirs, args.repeat):7.2f} us, per call "
                  f"{per_call_us(theirs, args.repeat):7.2f} us; bit-exact {same}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
