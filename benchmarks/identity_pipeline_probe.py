"""Would identity be faster if hashing started while later shard headers are still parsed?

    python benchmarks/identity_pipeline_probe.py DIR [--rounds 8] [--threads 2] [--algo sha256]
        [--switch-interval SECONDS]

A probe for issue 17, not a feature. In one process, alternating which goes first, it times:
- `as is`: `load_checkpoint`, then `compute_identity` (the plan, then the pool), as the CLI
  runs them with `--no-compat`;
- `pipelined`: the same loader, but each shard is handed to a background thread as soon as its
  header is parsed; that thread hashes the shard's tensors with the engine (`hash_segments`,
  the same leases and stability checks) while the main thread parses the next headers and
  builds the plan; the plan's digests are then looked up and folded as usual.
Both must give the same root (checked). Prints the median and minimum of each and their ratio.
DIR: e.g. the checkpoint `bench_identity.py --keep DIR` builds (use a warm page cache).
"""

from __future__ import annotations

import argparse
import queue
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import exl3tool.formats.checkpoint as checkpoint
from exl3tool.identity import engine, fast
from exl3tool.identity.logical import build_plan
from exl3tool.io.gcpause import paused_gc
from exl3tool.rules.registry import Findings


def as_is(path: Path, algo: str, threads: int) -> str:
    ckpt = checkpoint.load_checkpoint(path, Findings(), need_config=False)
    return fast.compute_identity(ckpt, algo=algo, threads=threads, compat=False).root


def pipelined(path: Path, algo: str, threads: int) -> str:
    shards: queue.Queue[Any] = queue.Queue()
    digests: dict[tuple[Path, int, int], str] = {}

    def hash_shards() -> None:
        while (st := shards.get()) is not None:
            segs = [engine.tensor_segment(st, t) for t in st.tensors.values()]
            jobs = [(seg, (seg,)) for seg in segs]
            digests.update(engine.hash_segments(jobs, algo, threads, None, {st.path: st.stamp}))

    worker = threading.Thread(target=hash_shards, name="probe-hash")
    worker.start()
    read_header = checkpoint.read_header

    def handing_over(*args: Any, **kwargs: Any) -> Any:
        st = read_header(*args, **kwargs)
        if st is not None:
            shards.put(st)
        return st

    checkpoint.read_header = handing_over
    try:
        ckpt = checkpoint.load_checkpoint(path, Findings(), need_config=False)
    finally:
        checkpoint.read_header = read_header
        shards.put(None)
    plan = build_plan(ckpt)
    worker.join()
    with paused_gc():
        got = {n: digests[segs[0]] for n, segs in fast.identity_jobs(plan)}
        return fast.identity_from_digests(plan, got, algo).root


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--algo", default="blake3")
    ap.add_argument("--switch-interval", type=float, help="sys.setswitchinterval (GIL hand-over)")
    args = ap.parse_args()
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    runs: dict[str, list[float]] = {"as is": [], "pipelined": []}
    roots = set()
    for r in range(args.rounds + 1):  # round 0 warms the page cache and the imports
        order = [as_is, pipelined] if r % 2 == 0 else [pipelined, as_is]
        for fn in order:
            t = time.perf_counter()
            roots.add(fn(args.dir, args.algo, args.threads))
            if r:
                runs["as is" if fn is as_is else "pipelined"].append(time.perf_counter() - t)
    if len(roots) != 1:
        print(f"roots differ: {roots}", file=sys.stderr)
        return 1
    med = {k: statistics.median(v) for k, v in runs.items()}
    for k, v in runs.items():
        print(f"{k:>9}: median {med[k]:.3f} s, min {min(v):.3f} s ({len(v)} runs)")
    print(f"pipelined / as is (medians): {med['pipelined'] / med['as is']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
