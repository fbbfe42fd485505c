"""Start-up time of the fast commands against a bare interpreter, measured in the same run.

    python benchmarks/bench_startup.py [--runs 15] [--top 12]

Times `exl3tool validate --help` (or `rules --help` while validate is not registered) and
`exl3tool rules` (which imports the whole rule catalogue) as `python -m exl3tool ...`, against
`python -c pass`; prints medians, the ratio and the overhead in ms, whether torch was imported,
and the slowest entries of `python -X importtime`. Prints a Markdown block for
benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _time(argv: list[str], runs: int) -> float:
    """Median wall time of `argv` in ms (one warm-up run first, for the page cache)."""
    subprocess.run(argv, cwd=ROOT, capture_output=True, check=True)
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, cwd=ROOT, capture_output=True, check=True)
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples)


def _has_validate() -> bool:
    out = subprocess.run(
        [sys.executable, "-m", "exl3tool", "--help"], cwd=ROOT, capture_output=True, text=True
    )
    return " validate " in out.stdout or "│ validate" in out.stdout


def _importtime(args: list[str], top: int) -> tuple[list[tuple[int, int, str]], bool]:
    """(self_us, cumulative_us, module) of the slowest top-level imports; and torch seen?"""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "exl3tool", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    rows = []
    torch = False
    for line in out.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cum_us, name = (x.strip() for x in line[len("import time:") :].split("|"))
        torch |= name.strip().split(".")[0] == "torch"
        rows.append((int(self_us), int(cum_us), name))
    rows.sort(key=lambda r: -r[1])
    return rows[:top], torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()

    help_cmd = ["validate", "--help"] if _has_validate() else ["rules", "--help"]
    py = [sys.executable]
    base = _time([*py, "-c", "pass"], args.runs)
    cases = {
        "exl3tool " + " ".join(help_cmd): [*py, "-m", "exl3tool", *help_cmd],
        "exl3tool rules": [*py, "-m", "exl3tool", "rules"],
    }
    print(f"python {platform.python_version()} on {platform.machine()}, runs={args.runs}")
    lines = [
        "| command | median ms | ratio vs `python -c pass` | overhead ms |",
        "| --- | ---: | ---: | ---: |",
        f"| `python -c pass` (reference) | {base:.0f} | 1.0 | 0 |",
    ]
    for label, argv in cases.items():
        ms = _time(argv, args.runs)
        lines.append(f"| `{label}` | {ms:.0f} | {ms / base:.1f} | {ms - base:.0f} |")
    top, torch = _importtime(help_cmd, args.top)
    lines += [
        "",
        f"torch imported by `exl3tool {' '.join(help_cmd)}`: {'YES' if torch else 'no'}",
        "",
        f"Slowest imports of `python -X importtime -m exl3tool {' '.join(help_cmd)}` (cumulative):",
        "",
        "| cumulative ms | self ms | module |",
        "| ---: | ---: | --- |",
    ]
    lines += [f"| {c / 1000:.1f} | {s / 1000:.1f} | `{n.strip()}` |" for s, c, n in top]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
