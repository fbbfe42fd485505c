"""Where a GLM-sized layer's one-time staging goes, without a GPU (issue 16).

    python benchmarks/profile_layer_staging.py [--dir /tmp/glml] [--keep]

Builds the layer of bench_verify_swap.py (256 experts, 6144/2048, base K3, a K4/K5 cartridge on 64
experts: 6.36 GB), then times the three host-side steps of verify-swap's first layer: the verified
staging copy (`stage_adapter`, with a cProfile of it), the corrupted copy of the failure drill
(`corrupt_copy`) and the staging attempt that must refuse it.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _took(t0: float, c0: float) -> str:
    """Wall seconds and this process's CPU seconds (user + system, all threads) since t0, c0."""
    return f"{time.perf_counter() - t0:.2f} s (CPU {time.process_time() - c0:.2f} s)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/glml")
    ap.add_argument("--keep", action="store_true", help="keep the built layer for the next run")
    args = ap.parse_args()
    from bench_verify_swap import build

    from exl3tool.runtime.engine import stage_adapter
    from exl3tool.runtime.verify_parts import corrupt_copy

    root = Path(args.dir)
    base, cart = root / "base", root / "cart"
    if not (cart / "adapter_config.json").is_file():
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        t0 = time.perf_counter()
        base, cart = build(root, 256, 6144, 2048, 64)
        print(f"built in {time.perf_counter() - t0:.1f} s")
    for p in sorted(cart.iterdir()):
        print(f"cartridge file {p.name}: {p.stat().st_size / 1e9:.2f} GB")
    try:
        print(f"load average {os.getloadavg()[0]:.2f}")
        prof = cProfile.Profile()
        t0, c0 = time.perf_counter(), time.process_time()
        prof.enable()
        stage_adapter(cart, base, 1, root / "staged")
        prof.disable()
        print(f"verified staging copy (stage_adapter): {_took(t0, c0)}")
        pstats.Stats(prof).sort_stats("tottime").print_stats(8)
        t0, c0 = time.perf_counter(), time.process_time()
        bad = corrupt_copy(cart, root / "corrupt")
        print(f"corrupted copy of the drill: {_took(t0, c0)}")
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            stage_adapter(bad, base, 1, root / "refused")
            print("the corrupted copy was staged: the drill would FAIL")
            status = 1
        except Exception as exc:  # the refusal the drill expects
            print(f"refused ({type(exc).__name__}: {str(exc)[:80]})")
            status = 0
        print(f"staging attempt of the corrupted copy: {_took(t0, c0)}")
        print(f"load average {os.getloadavg()[0]:.2f}")
    finally:
        for d in ("staged", "corrupt", "refused"):
            shutil.rmtree(root / d, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
