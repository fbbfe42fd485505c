"""How long `exl3tool` takes to end after a Ctrl-C at given moments of a run.

    python3 benchmarks/interrupt_latency.py --delays 0.3,0.6,0.9,1.2 -- identity DIR

Starts `python -m exl3tool ARGS` once per delay, sends SIGINT after that many seconds, and
prints the exit code, the milliseconds from the signal to the exit and the last stderr line
(130 and `exl3tool: interrupted` when the run was still going).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--delays", default="0.3,0.6,0.9,1.2")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    opts = ap.parse_args()
    args = [a for a in opts.args if a != "--"]
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, EXL3TOOL_NO_PROGRESS="1", PYTHONPATH=path)
    for delay in (float(d) for d in opts.delays.split(",")):
        p = subprocess.Popen([sys.executable, "-m", "exl3tool", *args], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
        time.sleep(delay)
        sent = time.perf_counter()
        p.send_signal(signal.SIGINT)
        _, err = p.communicate()
        took = (time.perf_counter() - sent) * 1000
        last = err.decode(errors="replace").strip().splitlines()[-1:] or [""]
        print(f"at {delay:.2f} s: exit {p.returncode}, {took:.0f} ms after the signal, {last[0]!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
