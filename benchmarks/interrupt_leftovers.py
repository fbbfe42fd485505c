"""What an interrupted writer leaves behind: exit codes, tracebacks, hangs and leftovers of
`exl3tool slice` stopped by SIGINT / SIGTERM at random moments (data safety: 130/143 leave the
output absent or complete, and nothing else).

    python3 benchmarks/interrupt_leftovers.py --runs 800 --window 0.10,0.22 [--vs OTHER_CHECKOUT]

Each run slices examples/msrt-base-tiny at TP 2 into a fresh folder, sends SIGINT or SIGTERM
(alternating) after a delay drawn from the window (seeded), and counts the exit code, a
traceback on stderr, a run still going 10 s later, and anything but the output in the folder
afterwards (a `.OUT.tmp-*` or `.OUT.lock`). With --vs, each run is repeated with that
checkout's code at the same delay and signal, in alternating order (compile both first:
`python3 -m compileall -q exl3tool`, or the one with .pyc files starts faster).
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one(tree: Path, sig: int, delay: float, work: Path) -> list[str]:
    """The outcome labels of one interrupted slice with `tree`'s code."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    out = work / "sl"
    env = dict(os.environ, EXL3TOOL_NO_PROGRESS="1", PYTHONPATH=str(tree))
    cmd = [sys.executable, "-m", "exl3tool", "slice", str(tree / "examples" / "msrt-base-tiny")]
    p = subprocess.Popen(
        [*cmd, "--tp", "2", "-o", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    time.sleep(delay)
    p.send_signal(sig)
    labels = []
    try:
        _, err = p.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
        labels.append("HANG")
    labels.append(f"rc{p.returncode}")
    if b"Traceback" in err:
        labels.append("TRACEBACK")
    if [x for x in os.listdir(work) if x != "sl"]:
        labels.append("LEFTOVER")
    return labels


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=400)
    ap.add_argument("--window", default="0.10,0.22", help="LO,HI seconds before the signal")
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("--vs", type=Path, default=None, help="another checkout, run paired")
    opts = ap.parse_args()
    lo, hi = map(float, opts.window.split(","))
    rnd = random.Random(opts.seed)
    trees = {"this": ROOT} | ({"vs": opts.vs.resolve()} if opts.vs else {})
    counts: dict[str, collections.Counter[str]] = {name: collections.Counter() for name in trees}
    with tempfile.TemporaryDirectory(prefix="leftovers-") as tmp:
        for i in range(opts.runs):
            sig = signal.SIGINT if i % 2 == 0 else signal.SIGTERM
            delay = rnd.uniform(lo, hi)
            order = list(trees.items()) if i % 4 < 2 else list(reversed(trees.items()))
            for name, tree in order:
                counts[name].update(one(tree, sig, delay, Path(tmp) / "w"))
            if (i + 1) % 100 == 0 or i + 1 == opts.runs:
                for name in trees:
                    print(f"{i + 1} runs, {name}: {dict(sorted(counts[name].items()))}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
