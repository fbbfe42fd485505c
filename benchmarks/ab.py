"""Interleaved A/B of one exl3tool command line between two source trees (same minutes, same load).

    python benchmarks/ab.py ROUNDS OLD_TREE NEW_TREE -- ARGS...
    e.g. git archive 12f12c1 | tar -x -C /tmp/old
         python benchmarks/ab.py 6 /tmp/old . -- validate --no-hash /tmp/glm52

Each round runs `python -m exl3tool ARGS` once per tree, alternating which goes first, from a
neutral working directory (`python -m` puts the working directory first on sys.path) with the
tree first on PYTHONPATH (what it held follows). Prints the minimum and median wall time and CPU
time (user + sys of the child) per tree, and the load average at the end.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from time import perf_counter


def main() -> int:
    if len(sys.argv) < 5 or "--" not in sys.argv:
        print(__doc__)
        return 2
    cut = sys.argv.index("--")
    rounds, old, new = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    args = sys.argv[cut + 1 :]
    trees = {"old": str(Path(old).resolve()), "new": str(Path(new).resolve())}
    runs: dict[str, list[tuple[float, float, int]]] = {k: [] for k in trees}
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    with tempfile.TemporaryDirectory() as cwd:
        for r in range(rounds):
            for name in list(trees) if r % 2 == 0 else list(trees)[::-1]:
                # the tree first; what PYTHONPATH held (a --target site of dependencies) after it
                env = dict(os.environ, PYTHONPATH=os.pathsep.join([trees[name], *extra]))
                c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                t0 = perf_counter()
                proc = subprocess.run([sys.executable, "-m", "exl3tool", *args], cwd=cwd,
                                      env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)  # fmt: skip
                wall = perf_counter() - t0
                c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = c1.ru_utime - c0.ru_utime + c1.ru_stime - c0.ru_stime
                runs[name].append((wall, cpu, proc.returncode))
    for name, rows in runs.items():
        wall = [w for w, _, _ in rows]
        cpu = [c for _, c, _ in rows]
        codes = sorted({rc for _, _, rc in rows})
        print(f"{name} ({trees[name]}): wall min {min(wall):.3f} median "
              f"{statistics.median(wall):.3f} s; cpu min {min(cpu):.3f} median "
              f"{statistics.median(cpu):.3f} s; exit {codes}")  # fmt: skip
    print("load average:", Path("/proc/loadavg").read_text().split()[:3])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
