"""How long a checkpoint's index takes to read by its groups and by the strict parse.

    python benchmarks/index_scan_probe.py DIR [--rounds 7]

Times, in this process and in the same rounds, `io.index_scan.scan_index` (the C pass over the
weight_map's groups that `load_checkpoint` tries first) and `io.jsonfile.parse_json` (the strict
parse it falls back to, and the only one without the C module) of DIR's
`model.safetensors.index.json`, already read into memory; prints the median of each, their
ratio, and whether the scan took the document. DIR: e.g. the checkpoint `bench_validate.py
--keep DIR` builds (a GLM-5.2-shaped index of 176,812 names).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from exl3tool.formats.checkpoint import INDEX_NAME
from exl3tool.io.index_scan import scan_index
from exl3tool.io.jsonfile import parse_json
from exl3tool.rules.registry import Findings


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    data = (args.dir / INDEX_NAME).read_bytes()
    took: dict[str, list[float]] = {"scan": [], "parse": []}
    scanned = None
    for _ in range(args.rounds):
        t = time.perf_counter()
        scanned = scan_index(data)
        took["scan"].append(time.perf_counter() - t)
        t = time.perf_counter()
        parse_json(data, Findings(), INDEX_NAME)
        took["parse"].append(time.perf_counter() - t)
    scan, parse = (statistics.median(took[k]) for k in ("scan", "parse"))
    print(f"index: {len(data) / 1e6:.1f} MB, {args.rounds} rounds")
    if scanned is None:
        print("scan: declined (no C module, a fixed PYTHONHASHSEED, or not the plain form)")
    else:
        print(f"scan: {scanned.entries} names in {len(scanned.groups)} files")
    print(f"scan_index  median {1e3 * scan:8.1f} ms")
    print(f"parse_json  median {1e3 * parse:8.1f} ms  ({parse / scan:.1f}x the scan)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
