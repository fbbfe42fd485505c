"""Interleaved A/B of the checkpoint loader alone between two source trees (issue 17).

    python benchmarks/ab_loader.py ROUNDS OLD_TREE NEW_TREE DIR

Each round runs one fresh process per tree (alternating which goes first) that times
`load_checkpoint(DIR)` and, in the same process, the header scans (`_scan_compact`) of DIR's
shards from memory (the cyclic collector paused, as the loader pauses it); prints the median and minimum of both per tree. DIR: e.g. the checkpoint
`bench_validate.py --keep DIR` builds; OLD_TREE: e.g. `git archive REV exl3tool | tar -x -C OLD`.
"""

from __future__ import annotations

import statistics
import subprocess
import sys

_CODE = """
import gc, struct, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from exl3tool.formats.checkpoint import load_checkpoint
from exl3tool.io import safetensors
from exl3tool.rules.registry import Findings
root = Path(sys.argv[2])
t = time.perf_counter()
load_checkpoint(root, Findings())
load = time.perf_counter() - t
heads = []
for p in sorted(root.glob("*.safetensors")):
    with open(p, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        heads.append(fh.read(n).decode())
gc.disable()  # as `read_header` runs it
t = time.perf_counter()
got = [safetensors._scan_compact(h) for h in heads]
scan = time.perf_counter() - t
assert all(g is not None for g in got)
print(load, scan)
"""


def main() -> int:
    if len(sys.argv) != 5:
        print(__doc__)
        return 2
    rounds, trees, root = int(sys.argv[1]), {"old": sys.argv[2], "new": sys.argv[3]}, sys.argv[4]
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in trees}
    for r in range(rounds):
        for name in list(trees) if r % 2 == 0 else list(trees)[::-1]:
            out = subprocess.run(
                [sys.executable, "-c", _CODE, trees[name], root],
                capture_output=True, text=True, check=True, cwd="/",
            ).stdout  # fmt: skip
            load, scan = map(float, out.split())
            runs[name].append((load, scan))
    for name, got in runs.items():
        loads, scans = [g[0] for g in got], [g[1] for g in got]
        print(
            f"{name} ({trees[name]}): load_checkpoint median {statistics.median(loads):.3f} s "
            f"min {min(loads):.3f}; header scans median {statistics.median(scans):.3f} s "
            f"min {min(scans):.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
