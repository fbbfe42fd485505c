"""Where a slice's output writes spend their time (issue 17's slice at TP 4 on 16 cores).

    python benchmarks/slice_write_timeline.py SRC --tp 4 [--out DIR] [--rounds 2]
                                              [--meanwhile-after]

Runs `exl3tool slice SRC --tp N -o DIR` in this process with every `os.pwrite` and `os.fsync`
timed (nothing of exl3tool changed but the timers; the first round's imports are inside its
time, as a command's are), then prints, per round: when its steps (load, plan, the source
identity's plan, the pass, the manifest) ran, the pass's wall time, the bytes written, the writes' count and size, their latency (median, p90,
max) and throughput per write, the mean number of writes in flight over the pass and over the
time any write was in flight, the share of the pass with 0, 1, 2, ... writes in flight, and
the fsyncs' total time. `direct_write_probe.py` gives the same disk's rate for the same
writes without the pass around them. `--meanwhile-after` moves the work the slicer does in
its main thread during the pass (side files, the manifest draft) after it: the pass without
that thread competing for the GIL. The output is removed after each round.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

_lock = threading.Lock()
writes: list[tuple[float, float, int]] = []  # (start, end, bytes)
fsyncs: list[tuple[float, float]] = []
_pwrite, _fsync = os.pwrite, os.fsync


def _timed_pwrite(fd: int, data: object, offset: int) -> int:
    began = time.perf_counter()
    n = _pwrite(fd, data, offset)  # type: ignore[arg-type]
    ended = time.perf_counter()
    with _lock:
        writes.append((began, ended, n))
    return n


def _timed_fsync(fd: int) -> None:
    began = time.perf_counter()
    _fsync(fd)
    with _lock:
        fsyncs.append((began, time.perf_counter()))


def _in_flight(spans: list[tuple[float, float, int]], t0: float, t1: float) -> dict[int, float]:
    """Seconds of [t0, t1] with k writes in flight, per k."""
    events = sorted([(s, 1) for s, _, _ in spans] + [(e, -1) for _, e, _ in spans])
    level, at, share = 0, t0, {}
    for t, d in events:
        share[level] = share.get(level, 0.0) + max(0.0, t - at)
        level, at = level + d, t
    share[level] = share.get(level, 0.0) + max(0.0, t1 - at)
    return share


steps: dict[str, tuple[float, float]] = {}  # step -> (start, end)


def _timed_step(module: Any, name: str) -> None:
    """Record when `module.name` ran (once per round: its first call)."""
    fn = getattr(module, name)
    if getattr(fn, "_timed", False):
        return

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            steps.setdefault(name, (began, time.perf_counter()))

    wrapper._timed = True  # type: ignore[attr-defined]
    setattr(module, name, wrapper)


def _meanwhile_after(writer: Any) -> None:
    """Run the pass's `meanwhile` (the side files and the manifest draft) after the pass, not
    during it: the pass without its main thread competing for the GIL (an experiment)."""
    fn = writer.write_streams

    def wrapper(*args: Any, meanwhile: Any = None, **kwargs: Any) -> Any:
        result = fn(*args, meanwhile=None, **kwargs)
        if meanwhile is not None:
            began = time.perf_counter()
            meanwhile()
            steps["meanwhile after the pass"] = (began, time.perf_counter())
        return result

    wrapper._after = True  # type: ignore[attr-defined]
    writer.write_streams = wrapper


def one_round(src: Path, out: Path, tp: int, after: bool) -> None:
    writes.clear()
    fsyncs.clear()
    steps.clear()
    began = time.perf_counter()  # the first round's imports are timed, as a command's are
    import exl3tool.tp.run as run
    import exl3tool.tp.writer as writer
    from exl3tool.cli.main import app

    for module, name in (
        (run, "load_checkpoint"),
        (run, "plan_slices"),
        (writer, "_SourceIdentity"),
        (writer, "write_streams"),
        (writer, "build_manifest"),
    ):
        _timed_step(module, name)
    if after and not getattr(writer.write_streams, "_after", False):
        _meanwhile_after(writer)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            app(["slice", str(src), "--tp", str(tp), "-o", str(out)], prog_name="exl3tool")
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    wall = time.perf_counter() - began
    shutil.rmtree(out)
    os.sync()
    print(
        "steps: "
        + ", ".join(
            f"{name} {(a - began) * 1e3:.0f}-{(b - began) * 1e3:.0f} ms"
            for name, (a, b) in steps.items()
        )
    )
    if not writes:
        print(f"wall {wall:.3f} s, no pwrite")
        return
    sizes = [n for _, _, n in writes]
    lat = sorted(e - s for s, e, _ in writes)
    first = min(s for s, _, _ in writes)
    last = max(e for _, e, _ in writes)
    share = _in_flight(writes, began, began + wall)
    busy = sum(v for k, v in share.items() if k > 0)
    mean_all = sum(k * v for k, v in share.items()) / wall
    mean_busy = sum(k * v for k, v in share.items()) / busy if busy else 0.0
    total = sum(sizes)
    print(
        f"wall {wall:.3f} s; writes from {first - began:.3f} to {last - began:.3f} s; "
        f"{total / 1e9:.3f} GB in {len(sizes)} pwrites (median {statistics.median(sizes) / 1024:.0f} KiB)"
    )
    print(
        f"  latency median {statistics.median(lat) * 1e3:.1f} ms, p90 "
        f"{lat[int(0.9 * (len(lat) - 1))] * 1e3:.1f} ms, max {lat[-1] * 1e3:.1f} ms; "
        f"{total / sum(lat) / 1e9:.2f} GB/s per write in flight"
    )
    print(
        f"  in flight: mean {mean_all:.2f} over the pass, {mean_busy:.2f} while any; "
        + ", ".join(f"{k}: {v / wall:.0%}" for k, v in sorted(share.items()))
    )
    print(
        f"  disk rate over the writes' span {total / (last - first) / 1e9:.2f} GB/s; "
        f"fsyncs {len(fsyncs)}, {sum(e - s for s, e in fsyncs):.3f} s in all"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("--tp", type=int, default=4)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--meanwhile-after",
        action="store_true",
        help="run the side files and manifest draft after the pass, not during it",
    )
    args = ap.parse_args()
    out = args.out or args.src.parent / f"{args.src.name}-write-timeline"
    os.pwrite, os.fsync = _timed_pwrite, _timed_fsync  # type: ignore[assignment]
    for r in range(args.rounds):
        print(f"round {r + 1}, TP {args.tp}:")
        one_round(args.src, out, args.tp, args.meanwhile_after)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
