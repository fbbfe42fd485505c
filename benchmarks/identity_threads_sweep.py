"""`identity --threads N` for several N against b3sum, alternating rounds (issue 17).

    python3 benchmarks/identity_threads_sweep.py DIR --threads 16,15,14,12 --rounds 7

DIR: shards as `bench_identity.py --keep DIR` builds them (`model-*.safetensors`). Each round
runs `b3sum --num-threads <cores>` once, then `exl3tool identity DIR --no-compat --threads N`
for each N (the order reversed every other round); prints each median and the ratio of b3sum's
median to it. Set EXL3TOOL_NO_AHEAD=1 in the environment to compare without headers parsed ahead.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--threads", default="16,15,14,12")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    b3sum = shutil.which("b3sum")
    if b3sum is None:
        raise SystemExit("b3sum is not installed")
    counts = [int(t) for t in args.threads.split(",")]
    files = sorted(str(p) for p in args.dir.glob("model-*.safetensors"))
    total = sum(os.path.getsize(f) for f in files)
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, EXL3TOOL_NO_PROGRESS="1", PYTHONPATH=path)
    cores = str(os.cpu_count() or 1)
    times: dict[str, list[float]] = {"b3sum": []} | {str(n): [] for n in counts}
    for r in range(args.rounds):
        t = time.perf_counter()
        subprocess.run(
            [b3sum, "--num-threads", cores, *files], stdout=subprocess.DEVNULL, check=True
        )
        times["b3sum"].append(time.perf_counter() - t)
        for n in counts if r % 2 == 0 else counts[::-1]:
            cmd = [sys.executable, "-m", "exl3tool", "identity", str(args.dir), "--no-compat",
                   "--threads", str(n)]  # fmt: skip
            t = time.perf_counter()
            subprocess.run(cmd, stdout=subprocess.DEVNULL, env=env, check=True)
            times[str(n)].append(time.perf_counter() - t)
    ref = statistics.median(times["b3sum"])
    for name, runs in times.items():
        m = statistics.median(runs)
        print(f"{name:>6}: median {m:.3f} s, min {min(runs):.3f} s, b3sum / median {ref / m:.2f}, "
              f"{total / m / 1e9:.2f} GB/s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
