"""Peak memory of `exl3tool identity` with and without the compatibility block and the shard
headers parsed ahead (issue 17's < 300 MB target).

    python3 benchmarks/identity_memory_probe.py DIR [--rounds 3]

Each run's peak is `bench_identity.tree_peak`: the largest process's peak RSS, or the sum of
Pss over it and its forked workers sampled every 10 ms, if larger.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_identity import ROOT, tree_peak


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    base = dict(os.environ, EXL3TOOL_NO_PROGRESS="1", PYTHONPATH=path)
    cmd = [sys.executable, "-m", "exl3tool", "identity", str(args.dir)]
    for r in range(args.rounds):
        for ahead, env in (("ahead", base), ("no ahead", {**base, "EXL3TOOL_NO_AHEAD": "1"})):
            for block, extra in (("compat", []), ("no compat", ["--no-compat"])):
                mb = tree_peak(cmd + extra, env) / 1e6
                print(f"round {r}: {ahead:8s} {block:9s} {mb:6.0f} MB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
