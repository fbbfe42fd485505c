"""What a slice does before its first write (issue 17's slice): the serial set-up, per step.

    python benchmarks/slice_setup_probe.py SRC [--tp 4] [--rounds 5]

Times, in this process (imports done, warm page cache), the steps `exl3tool slice` runs before
its streams start: loading the checkpoint, the slicing plan, the source identity's plan (which
tensors the pass hashes for the identity root) and the streams' parts; prints the median of
`--rounds` rounds per step, in ms, and the slices and tensors they cover. Nothing is written.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("--tp", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    from exl3tool.formats.checkpoint import load_checkpoint
    from exl3tool.formats.detect import detect
    from exl3tool.io.gcpause import paused_gc
    from exl3tool.rules.registry import Findings
    from exl3tool.tp.plan import plan_slices
    from exl3tool.tp.writer import DEFAULT_MAX_SHARD, _SourceIdentity, per_rank_streams

    kind = detect(args.src)
    steps: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        with paused_gc():  # as slice_artifact runs them
            t0 = time.perf_counter()
            ckpt = load_checkpoint(args.src, Findings(), need_config=False)
            t1 = time.perf_counter()
            plan = plan_slices(ckpt, kind, args.tp, "tensor", layout="per-rank")
            t2 = time.perf_counter()
            _SourceIdentity(ckpt)
            t3 = time.perf_counter()
            streams = per_rank_streams(plan, DEFAULT_MAX_SHARD)
            t4 = time.perf_counter()
        for label, took in (
            ("load_checkpoint", t1 - t0),
            ("plan_slices", t2 - t1),
            ("source identity plan", t3 - t2),
            ("per_rank_streams", t4 - t3),
            ("all", t4 - t0),
        ):
            steps.setdefault(label, []).append(took)
    slices = sum(len(r.slices) for r in plan.ranks)
    print(
        f"{len(ckpt.tensors)} tensors, TP {args.tp}: {slices} slices in {sum(map(len, streams))} parts"
    )
    for label, times in steps.items():
        print(f"{label:22s} {statistics.median(times) * 1e3:8.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
