"""`python3 -m tests.fuzz.campaign --cases N --seed S --workers W`: a fuzz campaign (issue 15).

Prints a JSON summary (counts per class, the bad cases, cases per second) and exits 1 when any
case was uncaught, over the time limit, over the memory limit or killed by a signal.
`--replay I --keep DIR` writes case I's mutated artifact into DIR and runs it in-process.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script path: make `tests.fuzz` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.fuzz.runner import Limits, World, run
from tests.fuzz.targets import call_entry, make_case, materialize


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tests.fuzz.campaign", description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--start", type=int, default=0, help="first case index")
    p.add_argument("--batch", type=int, default=250, help="cases per forked worker")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per case")
    p.add_argument("--memory-mib", type=int, default=1024, help="peak RSS limit per case")
    p.add_argument("--out", type=Path, help="write the JSON summary here too (also while running)")
    p.add_argument("--deadline", type=float, help="seconds after which no new batch starts")
    p.add_argument("--replay", type=int, help="run one case in-process (with a traceback)")
    p.add_argument("--keep", type=Path, help="with --replay: directory for the artifact")
    return p


def replay(seed: int, index: int, keep: Path) -> int:
    world = World(keep / "world")
    case = make_case(seed, index, world.layouts)
    art = keep / "artifact"
    materialize(case.layout, art)
    print(f"case {index}: {case.kind} {case.entry}: {case.what}\nartifact: {art}")
    result = call_entry(case, art, world.pristine, keep / "out")
    for f in result or ():
        print(f"  {f.rule.code} {f.location.file}: {f.message}"[:300])
    return 0


def _progress(out: Path | None):
    mark = [0]

    def report(summary) -> None:
        if summary.cases - mark[0] < 20_000:
            return
        mark[0] = summary.cases
        sys.stderr.write(f"{summary.cases} cases, {summary.n_bad} bad\n")
        if out is not None:  # a campaign cut short still leaves its numbers
            out.write_text(json.dumps(summary.to_json(), indent=2) + "\n")

    return report


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.replay is not None:
        keep = args.keep or Path(f"fuzz-case-{args.seed}-{args.replay}")
        keep.mkdir(parents=True, exist_ok=False)
        return replay(args.seed, args.replay, keep)
    limits = Limits(timeout=args.timeout, memory=args.memory_mib << 20)
    summary = run(
        args.cases,
        args.seed,
        args.workers,
        start=args.start,
        batch=args.batch,
        limits=limits,
        progress=_progress(args.out),
        deadline=args.deadline,
    )
    text = json.dumps(summary.to_json(), indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 1 if summary.n_bad else 0


if __name__ == "__main__":
    sys.exit(main())
