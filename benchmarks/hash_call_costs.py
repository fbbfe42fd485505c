"""What one core pays to hash a shard's tensors one call each, against one call for all of them.

    python benchmarks/hash_call_costs.py SHARD [--rounds 5]

Issue 17's identity profile: is the gap to b3sum in the hashing or around it? On one thread,
best of `--rounds`, over the payload of SHARD (a safetensors file; warm page cache):
- one `blake3(view)` per tensor from a mapping whose pages are already mapped;
- one call over the whole payload span (the same bytes);
- one call per tensor, then the pages dropped (`MADV_DONTNEED`), so every round faults them in
  again, as the engine's bounded-RSS reads of a leased file do;
- the same, each 32 MB batch populated first (`MADV_POPULATE_READ`, where the kernel has it);
- `b3sum --num-threads 1 SHARD` (whole file, its own reads), when b3sum is installed.
"""

from __future__ import annotations

import argparse
import json
import mmap
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import blake3

BATCH = 32 << 20
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux 5.14+


def spans_of(path: Path) -> list[tuple[int, int]]:
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
    header.pop("__metadata__", None)
    return sorted(
        (8 + n + t["data_offsets"][0], 8 + n + t["data_offsets"][1]) for t in header.values()
    )


def batches(spans: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    out: list[list[tuple[int, int]]] = [[]]
    for s, e in spans:
        if out[-1] and e - out[-1][0][0] > BATCH:
            out.append([])
        out[-1].append((s, e))
    return out


def best(fn: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shard", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    spans = spans_of(args.shard)
    total = sum(e - s for s, e in spans)
    with open(args.shard, "rb") as fh:
        m = mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ)
    view = memoryview(m)
    lo, hi = spans[0][0], spans[-1][1]

    def per_tensor() -> None:
        for s, e in spans:
            blake3.blake3(view[s:e]).hexdigest()

    def dropped() -> None:
        per_tensor()
        m.madvise(mmap.MADV_DONTNEED)

    def populated() -> None:
        for run in batches(spans):
            start = run[0][0] & ~(mmap.PAGESIZE - 1)
            m.madvise(MADV_POPULATE_READ, start, run[-1][1] - start)
            for s, e in run:
                blake3.blake3(view[s:e]).hexdigest()
        m.madvise(mmap.MADV_DONTNEED)

    rows: list[tuple[str, float]] = []
    per_tensor()  # map every page once
    rows.append(("per tensor, pages mapped", best(per_tensor, args.rounds)))
    rows.append(
        ("one call, whole span", best(lambda: blake3.blake3(view[lo:hi]).digest(), args.rounds))
    )
    m.madvise(mmap.MADV_DONTNEED)
    rows.append(("per tensor, pages dropped each round", best(dropped, args.rounds)))
    try:
        rows.append(("the same, 32 MB batches populated first", best(populated, args.rounds)))
    except OSError as exc:
        print(f"MADV_POPULATE_READ: {exc}", file=sys.stderr)
    if shutil.which("b3sum"):
        cmd = ["b3sum", "--num-threads", "1", str(args.shard)]
        run = lambda: subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)  # noqa: E731
        rows.append(("b3sum --num-threads 1 (whole file)", best(run, args.rounds)))
    view.release()
    m.close()
    print(f"{args.shard}: {len(spans)} tensors, {total / 1e6:.0f} MB of payload, one thread")
    print("| method | best s | GB/s | µs per tensor |\n|---|---|---|---|")
    for label, t in rows:
        print(f"| {label} | {t:.3f} | {total / t / 1e9:.2f} | {t / len(spans) * 1e6:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
