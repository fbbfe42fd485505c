"""`exl3tool validate --no-hash` of this checkout and of other trees, run alternately (paired).

    python benchmarks/pair_validate.py DIR [--tree NAME=PATH ...]
                                       [--env NAME=VAR=VALUE[,VAR=VALUE] ...]
                                       [--rounds 12] [--format text|json]

Each round runs every variant once, in turn, as a fresh process; the first round is a warm-up.
A tree is another checkout of exl3tool (`git worktree add /tmp/old REV`), put first on
PYTHONPATH; `--env` runs this checkout with more environment variables (e.g.
`pure=EXL3TOOL_PURE_SCAN=1`; several are joined by commas, so a value holds none). Prints the
median and least wall seconds of each variant. Paired rounds compare code on a machine whose
speed drifts (the 2-core VM's floor moved 15 % within one session).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--tree", action="append", default=[], help="NAME=PATH of another checkout")
    ap.add_argument(
        "--env", action="append", default=[], help="NAME=VAR=VALUE[,VAR=VALUE] for this checkout"
    )
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--format", default="text", choices=("text", "json"))
    args = ap.parse_args()
    variants: dict[str, dict[str, str]] = {"this": {}}
    for spec in args.tree:
        name, path = spec.split("=", 1)
        variants[name] = {"PYTHONPATH": path}
    for spec in args.env:
        name, pairs = spec.split("=", 1)
        variants[name] = dict(kv.split("=", 1) for kv in pairs.split(","))
    argv = [sys.executable, "-m", "exl3tool", "validate", "--no-hash", "--format", args.format]
    times: dict[str, list[float]] = {k: [] for k in variants}
    for i in range(args.rounds + 1):
        for name, env in variants.items():
            t = time.perf_counter()
            done = subprocess.run(
                [*argv, args.dir], env={**os.environ, **env}, cwd="/", capture_output=True
            )
            took = time.perf_counter() - t
            if done.returncode not in (0, 1):
                sys.stderr.write(done.stderr.decode(errors="replace")[-2000:])
                return 1
            if i:
                times[name].append(took)
    print(
        f"cores: {len(os.sched_getaffinity(0))}, {args.rounds} paired rounds, --format {args.format}"
    )
    for name, got in times.items():
        print(f"{name:>10}: median {statistics.median(got):.3f} s, least {min(got):.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
