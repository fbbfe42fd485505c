"""Where one `exl3tool identity` run spends its time, in process (issue 17's profile).

    python benchmarks/identity_timeline.py DIR [--threads N] [--algo blake3|sha256]

Runs `exl3tool identity DIR --no-compat` in this process with timers around the steps before
and after the hashing pool (opening the artifact, its headers, the plans, the lease, the
digest folding) and around each worker's units (and the shard headers parsed ahead: their forks and takes), then prints when each step started and how
long it took, in ms after this script's first line. Nothing of exl3tool is changed but the
timers; the digests are those of the CLI.
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

import argparse  # noqa: E402
import contextlib  # noqa: E402
import io  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from collections.abc import Callable  # noqa: E402
from types import ModuleType  # noqa: E402
from typing import Any  # noqa: E402

import exl3tool.actions.identity  # noqa: E402,F401
import exl3tool.formats.checkpoint as checkpoint  # noqa: E402
import exl3tool.identity.artifact as artifact  # noqa: E402
import exl3tool.identity.early as early  # noqa: E402
import exl3tool.identity.engine as engine  # noqa: E402
import exl3tool.identity.fast as fast  # noqa: E402
import exl3tool.identity.logical as logical  # noqa: E402
import exl3tool.io.headers_ahead as headers_ahead  # noqa: E402
import exl3tool.io.safetensors as safetensors  # noqa: E402

steps: dict[str, list[float]] = {}  # label -> [calls, total s, first start s]
units: dict[int, list[float]] = {}  # thread -> [units, busy s, last end s]


def timed(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            row = steps.setdefault(label, [0, 0.0, start - T0])
            row[0] += 1
            row[1] += time.perf_counter() - start

    return wrapper


def wrap(module: ModuleType, name: str) -> None:
    """Time `module.name` wherever exl3tool imported it by name."""
    fn = getattr(module, name)
    new = timed(f"{module.__name__.rsplit('.', 1)[-1]}.{name}", fn)
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("exl3tool") and getattr(mod, name, None) is fn:
            setattr(mod, name, new)


def unit_timer(fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(self, *args, **kwargs)
        finally:
            end = time.perf_counter()
            row = units.setdefault(threading.get_ident(), [0, 0.0, 0.0])
            row[0] += 1
            row[1] += end - start
            row[2] = end - T0

    return wrapper


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--algo", default="blake3")
    args = ap.parse_args()
    for module, name in [
        (artifact, "open_artifact"), (checkpoint, "load_checkpoint"),
        (checkpoint, "_read_json"), (safetensors, "read_header"), (logical, "build_plan"),
        (fast, "planned_bytes"), (engine, "hash_segments"), (engine, "_plan"),
        (engine, "_open_all"), (engine, "run_threads"), (fast, "identity_from_digests"),
        (early, "start"), (engine, "_take_known"), (engine, "_lease_all"),
        (engine, "_run_forked"),
    ]:  # fmt: skip
        wrap(module, name)
    # the wait for the workers hashing ahead (the first lookup waits for all of them)
    early.EarlyDigests._finish = timed("early.wait_for_workers", early.EarlyDigests._finish)
    # headers parsed ahead by forked workers: the forks, and each take (a wait and a rebuild)
    headers_ahead.start = timed("headers_ahead.start", headers_ahead.start)
    headers_ahead.HeadersAhead.take = timed("headers_ahead.take", headers_ahead.HeadersAhead.take)
    engine._Worker.batch = unit_timer(engine._Worker.batch)
    engine._Worker.job = unit_timer(engine._Worker.job)
    imported = time.perf_counter() - T0
    argv = ["exl3tool", "identity", args.path, "--algo", args.algo, "--no-compat"]
    if args.threads:
        argv += ["--threads", str(args.threads)]
    sys.argv = argv
    from exl3tool.cli import entry

    code: object = 0
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            entry()
    except SystemExit as exc:
        code = exc.code
    done = time.perf_counter() - T0
    print(f"{imported * 1000:8.1f} ms  imports done")
    for label, (calls, total, first) in sorted(steps.items(), key=lambda kv: kv[1][2]):
        print(f"{first * 1000:8.1f} ms  {label:32s} {calls:5d} calls, {total * 1000:7.1f} ms")
    if units:
        busy = sum(r[1] for r in units.values())
        count = sum(r[0] for r in units.values())
        print(f"  pool: {len(units)} threads, {count} units, busy {busy * 1000:.0f} ms, "
              f"last unit ended at {max(r[2] for r in units.values()) * 1000:.1f} ms")  # fmt: skip
    print(f"{done * 1000:8.1f} ms  exit {code}")
    return 0 if code in (0, None) else 1


if __name__ == "__main__":
    sys.exit(main())
