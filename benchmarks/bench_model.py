"""Whole-model verify-swap: a GLM-5.2-shaped synthetic MSRT base and cartridge (issue 16).

    python benchmarks/bench_model.py --device cuda --layers 4 16 75     # one H200
    python benchmarks/bench_model.py --device cpu --layers 2 4 --experts 8 --hidden 512 \\
        --intermediate 512 --subset 4                                  # a small smoke run

For each layer count N: build (not timed, in a child process) a base of N MoE layers × E experts
(hidden × intermediate, K=3, synthetic trellis) and a 2-stage cartridge (K4, K5) on `subset`
experts per layer, then run the whole verify-swap in this process and report wall time, seconds
per layer, the time split by phase, peak host RSS and peak VRAM (torch's allocator peak). The
reference is linearity: seconds per layer at N should not grow with N, and peaks should not grow.
Artifacts need about N × (3.6 + 2 × 2.7) GB at the GLM geometry (base, cartridge, staged copy):
`--dir` must hold that (/dev/shm by default when it can), or `--base-dir` the base (3.6 GB per
layer, e.g. a disk) and `--dir` the rest.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BUILD = """
import sys
from pathlib import Path
from exl3tool.synth.msrt import build_adapter, build_base
root, base_root, n, e, h, i, s = Path(sys.argv[1]), Path(sys.argv[2]), *map(int, sys.argv[3:8])
base = build_base(base_root, layers=tuple(range(n)), experts=e, hidden=h, intermediate=i, k=3)
sel = list(range(s))
build_adapter(root / "cart", base, chain=(("k4", 4), ("k5", 5)), experts=[sel, sel])
"""


def _gb(n: int) -> float:
    return round(n / 2**30, 2)


def one(args: argparse.Namespace, n: int) -> dict:
    import torch

    from exl3tool.runtime.verify import VerifyOptions, run_verify

    tmp = Path(tempfile.mkdtemp(prefix="bench-model-", dir=args.dir))
    base_tmp = Path(tempfile.mkdtemp(prefix="bench-model-base-", dir=args.base_dir or tmp))
    try:
        t0 = time.perf_counter()
        geo = [n, args.experts, args.hidden, args.intermediate, args.subset]
        subprocess.run(
            [sys.executable, "-c", BUILD, str(tmp), str(base_tmp / "base"), *map(str, geo)],
            check=True,
            cwd=ROOT,
        )
        built = time.perf_counter() - t0
        roots = [tmp, base_tmp] if args.base_dir else [tmp]  # else the base is inside tmp
        size = sum(p.stat().st_size for d in roots for p in d.rglob("*") if p.is_file())
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        rep = run_verify(
            VerifyOptions(
                base_tmp / "base",
                tmp / "cart",
                device=args.device,
                tokens=args.tokens,
                work_dir=tmp,
                progress=True,
            )
        )
        wall = time.perf_counter() - t0
        doc = rep.to_json()
        vram = torch.cuda.max_memory_allocated() if args.device == "cuda" else 0
        layer_fp16 = args.experts * 3 * args.hidden * args.intermediate * 2
        return {
            "layers": n,
            "artifact_gb": _gb(size),
            "build_s": round(built, 1),
            "verify_s": round(wall, 1),
            "s_per_layer": round(wall / n, 2),
            "peak_host_rss_gb": _gb(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024),
            "peak_vram_gb": _gb(vram),
            "layer_fp16_gb": _gb(layer_fp16),
            "passed": doc["passed"],
            "checks": {c["name"]: c["passed"] for c in doc["checks"]},
            "timings": doc["timings"],
            "failed": [c["detail"] for c in doc["checks"] if c["passed"] is False],
        }
    finally:
        shutil.rmtree(base_tmp, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, nargs="+", default=[4, 16, 75])
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=6144)
    ap.add_argument("--intermediate", type=int, default=2048)
    ap.add_argument("--subset", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--dir", default="/dev/shm" if Path("/dev/shm").is_dir() else None)
    ap.add_argument("--base-dir", help="build the base here (default: in --dir)")
    args = ap.parse_args()
    ok = True
    for n in args.layers:
        weights = args.experts * 3 * args.hidden * args.intermediate
        need = {  # bytes per directory: base K3; cartridge K4 + K5 and its staged copy
            args.base_dir or args.dir: n * weights * 3 / 8,
        }
        rest = n * weights * 2 * 9 * args.subset / args.experts / 8
        need[args.dir] = need.get(args.dir, 0) + rest
        short = [
            f"needs ~{_gb(int(b))} GB, {_gb(free)} GB free in {d}"
            for d, b in need.items()
            if b > 0.9 * (free := shutil.disk_usage(d or tempfile.gettempdir()).free)
        ]
        if short:
            print(json.dumps({"layers": n, "skipped": "; ".join(short)}), flush=True)
            continue
        res = one(args, n)
        ok &= res["passed"]
        print(json.dumps(res), flush=True)
    print(f"bench_model: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
