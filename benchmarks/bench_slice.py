"""Benchmark `exl3tool slice` on a ~4 GB R7-shaped checkpoint at TP 2 and 4 against `cp` of the same
files, in the same run (warm page cache for both), and the slicer's peak RSS.

    python benchmarks/bench_slice.py [--dir /var/tmp/bench-slice] [--gb 4] [--keep]

Prints, per TP size: seconds, source GB/s, the ratio to cp's throughput (target >= 0.8), peak
RSS of the slicing process (target < 500 MB). The slice run includes everything the manifest
needs: per-file sha256 + blake3 and the source's blake3 identity root.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def build(root: Path, gb: float) -> Path:
    from exl3tool.synth.r7 import build_r7

    hidden, inter, experts = 2048, 1024, 64
    per_layer = experts * 3 * hidden * inter * 4 // 8  # K averages 4 over {3, 4, 5}
    layers = max(1, round(gb * 1e9 / per_layer))
    return build_r7(
        root, num_hidden_layers=layers + 1, first_moe_layer=1, n_experts=experts, hidden=hidden,
        moe_intermediate=inter, mtp=False, seed=1,
    )  # fmt: skip


def run(cmd: list[str]) -> tuple[float, int, float]:
    """Wall seconds, peak RSS (bytes) and CPU seconds (user + sys) of a child process."""
    t = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    _, status, usage = os.wait4(proc.pid, 0)
    dt = time.perf_counter() - t
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}")
    subprocess.run(["sync"], check=True)  # the next run starts with no dirty pages
    return dt, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/bench-slice"))
    ap.add_argument("--gb", type=float, default=4.0)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    args.dir.mkdir(parents=True)
    src = build(args.dir / "src", args.gb)
    shards = sorted(src.glob("*.safetensors"))
    size = sum(p.stat().st_size for p in shards)
    print(f"source: {size / 1e9:.2f} GB in {len(shards)} shards ({os.cpu_count()} cores)")
    subprocess.run(["cat", *map(str, shards)], stdout=subprocess.DEVNULL, check=True)  # warm
    for tp in (2, 4):
        cp_dir = args.dir / f"cp{tp}"
        cp_dir.mkdir()
        t_cp, _, c_cp = run(["cp", *map(str, shards), str(cp_dir)])
        shutil.rmtree(cp_dir)
        out = args.dir / f"tp{tp}"
        cmd = [sys.executable, "-m", "exl3tool", "slice", str(src), "--tp", str(tp), "-o", str(out)]
        t_sl, rss, c_sl = run(cmd)
        written = sum(p.stat().st_size for p in out.rglob("*.safetensors"))
        shutil.rmtree(out)
        print(
            f"TP {tp}: cp {t_cp:.2f} s ({size / t_cp / 1e9:.2f} GB/s, cpu {c_cp:.1f} s); "
            f"slice {t_sl:.2f} s ({size / t_sl / 1e9:.2f} GB/s, cpu {c_sl:.1f} s, wrote "
            f"{written / 1e9:.2f} GB); ratio {t_cp / t_sl:.2f}x cp; peak RSS {rss / 2**20:.0f} MiB"
        )
    if not args.keep:
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
