"""Start-up time of the fast commands against a bare interpreter, measured in the same run.

    python benchmarks/bench_startup.py [--runs 15] [--top 12]

Times `exl3tool --help`, `exl3tool validate --help` (target: < 150 ms), `exl3tool rules` (the
whole rule catalogue) and a command's fixed cost: `exl3tool identity F` and `exl3tool validate F`
of a tiny one-tensor safetensors file F, minus `python -c pass` (target: < 80 ms). Each runs as
`python -m exl3tool ...`, interleaved with the reference so load drifts hit both alike; prints
median and best wall ms, median CPU ms, the ratio and the overhead beside the target, whether
torch was imported, and the slowest entries of `python -X importtime` of the help, identity and
validate runs. Prints a Markdown block for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from as_installed import HELP, bytecode_state, use_bytecode

ROOT = Path(__file__).resolve().parents[1]


HELP_TARGET_MS = 150  # wall time of `exl3tool --help` and `exl3tool validate --help`
FIXED_TARGET_MS = 80  # a command's wall time on a one-tensor file, minus `python -c pass`


def _one_tensor_file(folder: Path) -> Path:
    """A valid safetensors file holding one F32 tensor of two elements."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    header += b" " * (-len(header) % 8)
    path = folder / "one.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))
    return path


def _cpu_ms() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (usage.ru_utime + usage.ru_stime) * 1000


def _run(argv: list[str]) -> tuple[float, float]:
    """(wall ms, CPU ms) of one run; an exit code other than 0 or 1 stops the bench."""
    cpu, t0 = _cpu_ms(), time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True)
    wall, cpu = (time.perf_counter() - t0) * 1000, _cpu_ms() - cpu
    if done.returncode not in (0, 1):
        sys.exit(f"{' '.join(argv)}: exit {done.returncode}\n{done.stderr.decode()[-2000:]}")
    return wall, cpu


@dataclass(frozen=True)
class Timing:
    median: float  # wall ms
    best: float  # wall ms
    cpu: float  # median CPU ms (user + system): what load on other cores changes least


def _timings(cases: dict[str, list[str]], runs: int) -> dict[str, Timing]:
    """Each case's timing; rounds interleave the cases so load drifts hit all alike (one
    warm-up round first, for the page cache)."""
    samples: dict[str, list[tuple[float, float]]] = {label: [] for label in cases}
    for round_ in range(runs + 1):
        for label, argv in cases.items():
            sample = _run(argv)
            if round_:
                samples[label].append(sample)
    return {
        label: Timing(
            statistics.median(w for w, _ in v),
            min(w for w, _ in v),
            statistics.median(c for _, c in v),
        )
        for label, v in samples.items()
    }


def _has_validate() -> bool:
    out = subprocess.run(
        [sys.executable, "-m", "exl3tool", "--help"], cwd=ROOT, capture_output=True, text=True
    )
    return " validate " in out.stdout or "│ validate" in out.stdout


def _importtime(args: list[str], top: int) -> tuple[list[tuple[int, int, str]], bool]:
    """(self_us, cumulative_us, module) of the slowest imports; and torch seen?"""
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


def _verdict(ok: bool) -> str:
    return "met" if ok else "**not met**"


def _importtime_table(args: list[str], top: int) -> list[str]:
    rows, torch = _importtime(args, top)
    shown = " ".join("F" if a.endswith(".safetensors") else a for a in args)
    return [
        "",
        f"torch imported by `exl3tool {shown}`: {'YES' if torch else 'no'}",
        "",
        f"Slowest imports of `python -X importtime -m exl3tool {shown}` (cumulative):",
        "",
        "| cumulative ms | self ms | module |",
        "| ---: | ---: | --- |",
        *(f"| {c / 1000:.1f} | {s / 1000:.1f} | `{n.strip()}` |" for s, c, n in rows),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument(
        "--bytecode",
        action="store_true",
        help=HELP,
    )
    args = ap.parse_args()

    help_cmd = ["validate", "--help"] if _has_validate() else ["rules", "--help"]
    py = [sys.executable]
    exl3 = [*py, "-m", "exl3tool"]
    with tempfile.TemporaryDirectory() as tmp:
        f = str(_one_tensor_file(Path(tmp)))
        if args.bytecode:  # the children inherit it
            use_bytecode(Path(tmp))
        cached = bytecode_state()
        cases = {
            "python -c pass": [*py, "-c", "pass"],
            "exl3tool --help": [*exl3, "--help"],
            "exl3tool " + " ".join(help_cmd): [*exl3, *help_cmd],
            "exl3tool rules": [*exl3, "rules"],
            "exl3tool identity F": [*exl3, "identity", f],
            "exl3tool validate F": [*exl3, "validate", f],
        }
        ms = _timings(cases, args.runs)
        base = ms["python -c pass"]
        lines = [
            f"python {platform.python_version()} on {platform.machine()}, runs={args.runs}, "
            f"bytecode cache {cached}, "
            f"F = a one-tensor safetensors file ({Path(f).stat().st_size} bytes); "
            "overhead = median minus the reference's median (best: minimum minus minimum)",
            "",
            "| command | median ms | best ms | CPU ms | ratio | overhead ms | best overhead | "
            "target |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for label, t in ms.items():
            over, best_over = t.median - base.median, t.best - base.best
            if label == "python -c pass":
                target = "reference"
            elif label.endswith("--help"):
                target = f"< {HELP_TARGET_MS} ms wall: {_verdict(t.median < HELP_TARGET_MS)}"
            elif label.endswith(" F"):
                target = f"fixed cost < {FIXED_TARGET_MS} ms: {_verdict(over < FIXED_TARGET_MS)}"
            else:
                target = ""
            lines.append(
                f"| `{label}` | {t.median:.0f} | {t.best:.0f} | {t.cpu:.0f} | "
                f"{t.median / base.median:.1f} | {over:.0f} | {best_over:.0f} | {target} |"
            )
        lines += _importtime_table(help_cmd, args.top)
        lines += _importtime_table(["identity", f], args.top)
        lines += _importtime_table(["validate", f], args.top)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
