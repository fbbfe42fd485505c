"""Hashing ahead (identity/early) from leased mappings vs pread, alone, in the same minutes.

    python benchmarks/early_read_probe.py DIR [--algo blake3|sha256] [--workers N] [--rounds 4]

Starts identity/early's forked workers on every shard of DIR and waits for them, alternating
reads from leased mappings only, pread only, and both measured by each worker on its first
units, the faster kept (`early.READS`, the default); prints the least and
median wall time and the least CPU time of the workers per mode.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from pathlib import Path

from exl3tool.identity import early


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--algo", choices=("blake3", "sha256"), default="blake3")
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    runs: dict[str, list[tuple[float, float]]] = {"mapped": [], "pread": [], "measured": []}
    reads = {"mapped": (True,), "pread": (False,), "measured": (True, False)}
    for _ in range(args.rounds):
        for mode in runs:
            early.READS = reads[mode]
            c, t = _children_cpu(), time.perf_counter()
            ahead = early.start(args.dir, args.algo, args.workers)
            if ahead is None:
                raise SystemExit("nothing hashed ahead here (too small, or no fork)")
            ahead._finish()
            runs[mode].append((time.perf_counter() - t, _children_cpu() - c))
    size = sum(p.stat().st_size for p in args.dir.glob("*.safetensors")) / 1e9
    print(f"{size:.2f} GB, {args.algo}, {args.workers} workers, {args.rounds} rounds")
    for mode, v in runs.items():
        walls = [w for w, _ in v]
        print(
            f"{mode}: wall min {min(walls):.3f} median {statistics.median(walls):.3f} s, "
            f"{size / min(walls):.2f} GB/s; workers' CPU min {min(c for _, c in v):.3f} s"
        )


if __name__ == "__main__":
    main()
