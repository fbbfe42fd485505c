"""The R7 read-ahead's packed reads and NaN/Inf scans in forked children (issue 17).

    python3 benchmarks/readahead_fork_probe.py DIR [--rounds 3]

DIR: a GLM-5.2-shaped checkpoint (`bench_validate.py --keep DIR`). Each round forks one child
per variant, in turn; the child reads the facts of every layer shard as validate's read-ahead
worker does (`checks.payload.fact_reads`, then `read_facts`) and reports its wall and CPU
seconds. Variants: the scan in steps of `payload.SCAN_WORDS` words (as shipped) or over whole
arrays (as before), each with glibc's default malloc settings or with freed memory kept
(`mallopt`: no trimming, no own mapping under 32 MB). Prints the median of each.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import statistics
import sys
import time
from pathlib import Path

from exl3tool.checks import payload

LAYER_SHARD = re.compile(r"r7-experts-layer-\d+\.safetensors")


def _child(root: Path, labels: list[str], stepped: bool, keep: bool, w: int) -> None:
    if keep:
        mallopt = ctypes.CDLL(None).mallopt
        mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
        mallopt(-1, 512 << 20)  # M_TRIM_THRESHOLD
    if not stepped:
        payload.SCAN_WORDS = 1 << 62  # one step: whole-array temporaries
    reads = [payload.fact_reads(root / n, n) for n in labels]
    t, c = time.perf_counter(), time.process_time()
    with payload.RandomAccessReader() as reader:
        for r in reads:
            if r is not None:
                payload.read_facts(r, reader, True)
    os.write(w, f"{time.perf_counter() - t} {time.process_time() - c}\n".encode())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    labels = sorted(n for n in os.listdir(args.dir) if LAYER_SHARD.fullmatch(n))
    if not labels:
        raise SystemExit(f"{args.dir}: no r7-experts-layer-*.safetensors")
    import numpy  # noqa: F401  (imported once here, not in each child's timing)

    variants = {
        (stepped, keep): [] for stepped in (True, False) for keep in (False, True)
    }  # fmt: skip
    for _ in range(args.rounds):
        for (stepped, keep), got in variants.items():
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                try:
                    _child(args.dir, labels, stepped, keep, w)
                finally:
                    os._exit(0)
            os.close(w)
            with os.fdopen(r) as fh:
                line = fh.read()
            os.waitpid(pid, 0)
            got.append(tuple(map(float, line.split())))
    print(f"{len(labels)} layer shards, {args.rounds} rounds, medians (wall, CPU seconds):")
    for (stepped, keep), got in variants.items():
        scan = "scan in steps (shipped)" if stepped else "scan over whole arrays"
        heap = "freed memory kept" if keep else "malloc defaults"
        wall = statistics.median(g[0] for g in got)
        cpu = statistics.median(g[1] for g in got)
        print(f"  {scan:26s} {heap:18s} {wall:.3f} s  {cpu:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
