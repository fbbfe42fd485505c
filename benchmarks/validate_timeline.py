"""Where one R7 `validate --no-hash` spends its time, in process (issue 17's profile).

    python benchmarks/validate_timeline.py DIR [--rounds 2]

Runs `validate_path(DIR, hash=False)` in this process with timers around the loader and each
step of the R7 checks, and the read-ahead worker's own time (it runs forked: it prints when it
ends, on stderr), then prints when each step started and how long it took, in ms after the
call began. `from_child` is the parent's wait for the worker plus the unpickling of its result.
Nothing of exl3tool is changed but the timers. DIR: e.g. the checkpoint `bench_validate.py
--keep DIR` builds.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import sys
import time
from pathlib import Path
from typing import Any

STEPS = (
    ("exl3tool.actions.validate", "load_checkpoint"),
    ("exl3tool.actions.validate", "check_checkpoint"),
    ("exl3tool.checks.r7", "check_quant_configs"),
    ("exl3tool.checks.r7", "expert_table"),
    ("exl3tool.checks.r7", "check_experts"),
    ("exl3tool.checks.r7", "check_out_of_range"),
    ("exl3tool.checks.r7", "check_tail"),
    ("exl3tool.checks.r7", "check_routers"),
    ("exl3tool.checks.r7", "check_linears"),
    ("exl3tool.checks.r7", "flush_payload_checks"),
    ("exl3tool.checks.r7", "check_layer_manifests"),
    ("exl3tool.checks.r7", "check_checkpoint_manifest"),
    ("exl3tool.checks.conformance", "check_conformance"),
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    start = [0.0]
    marks: list[tuple[str, float, float]] = []

    def timed(name: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                marks.append((name, t - start[0], time.perf_counter() - t))

        return wrapper

    for mod_name, attr in STEPS:
        mod = importlib.import_module(mod_name)
        setattr(mod, attr, timed(attr, getattr(mod, attr)))
    from exl3tool.checks import r7
    from exl3tool.io import forked

    forked.Forked.from_child = timed("from_child", forked.Forked.from_child)
    prefetch = r7.prefetch_r7

    def prefetch_timed(root: Path) -> Any:  # runs in the forked worker
        t = time.perf_counter()
        try:
            return prefetch(root)
        finally:
            end = time.perf_counter()
            print(f"  worker: prefetch_r7 {1e3 * (end - t):.1f} ms, ended at "
                  f"{1e3 * (end - start[0]):.1f} ms", file=sys.stderr, flush=True)  # fmt: skip

    r7.prefetch_r7 = prefetch_timed
    from exl3tool.actions.validate import validate_path
    from exl3tool.checks.options import ValidateOptions

    for _ in range(args.rounds):
        marks.clear()
        start[0] = time.perf_counter()
        validate_path(args.dir, ValidateOptions(hash=False))
        total = time.perf_counter() - start[0]
        time.sleep(0.05)  # the worker's line first
        for name, at, took in sorted(marks, key=lambda m: m[1]):
            print(f"  {1e3 * at:8.1f} ms  {name:<28} {1e3 * took:8.1f} ms")
        print(f"  total {1e3 * total:.1f} ms", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
