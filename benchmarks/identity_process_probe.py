"""Would identity hash faster with forked processes than with threads of one process?

    python benchmarks/identity_process_probe.py DIR [--workers N] [--rounds 3] [--algo blake3]
        [--unit-mb 32]

A probe for issue 17, not a feature. It parses every shard header of DIR with json.loads (no
checks), cuts the tensors into units of about --unit-mb MB in file order (as the engine's
mapped batches), then hashes every tensor of every unit from one read-only mapping per file,
dropping a unit's pages (MADV_DONTNEED) once it is hashed, in two ways, alternating which goes
first:
- `threads`: N threads of this process take units from one shared iterator (the engine's pool);
- `procs`: N forked children take units i, i + N, ... and send their digests back through a
  pipe (no GIL between them, and a child's page drops flush only its own TLB).
Both must give the same digests (checked). Prints the median and least hashing time of each,
in seconds and GB/s, and their ratio. DIR: e.g. `bench_identity.py --keep DIR` (warm cache).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import mmap
import os
import statistics
import struct
import threading
import time
from pathlib import Path
from typing import Any

import blake3

Unit = list[tuple[int, int, int]]  # (file index, start, end) of each tensor, in file order


def plan(files: list[Path], unit_bytes: int) -> tuple[list[mmap.mmap], list[Unit], int]:
    maps: list[mmap.mmap] = []
    units: list[Unit] = []
    total = 0
    for i, f in enumerate(files):
        with open(f, "rb") as fh:
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        maps.append(mm)
        n = struct.unpack("<Q", mm[:8])[0]
        base = 8 + n
        cur: Unit = []
        size = 0
        spans = sorted(
            (v["data_offsets"][0] + base, v["data_offsets"][1] + base)
            for k, v in json.loads(mm[8:base]).items()
            if k != "__metadata__"
        )
        for a, b in spans:
            cur.append((i, a, b))
            size += b - a
            total += b - a
            if size >= unit_bytes:
                units.append(cur)
                cur, size = [], 0
        if cur:
            units.append(cur)
    return maps, units, total


def hash_unit(new: Any, maps: list[mmap.mmap], views: list[memoryview], unit: Unit) -> list[bytes]:
    out = [new(views[i][a:b]).digest() for i, a, b in unit]
    i, lo, hi = unit[0][0], unit[0][1], unit[-1][2]
    page = mmap.PAGESIZE
    lo -= lo % page
    hi = min(hi + (-hi % page), len(maps[i]) + (-len(maps[i]) % page))
    maps[i].madvise(mmap.MADV_DONTNEED, lo, hi - lo)
    return out


def with_threads(new: Any, maps: list[mmap.mmap], units: list[Unit], n: int) -> list[bytes]:
    views = [memoryview(m) for m in maps]
    out: list[list[bytes]] = [[] for _ in units]
    it = iter(enumerate(units))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                job = next(it, None)
            if job is None:
                return
            out[job[0]] = hash_unit(new, maps, views, job[1])

    pool = [threading.Thread(target=work) for _ in range(n)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    for v in views:
        v.release()
    return [d for ds in out for d in ds]


def with_procs(new: Any, maps: list[mmap.mmap], units: list[Unit], n: int) -> list[bytes]:
    children = []
    for w in range(n):
        r, wr = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its units, then its digests on the pipe, then _exit
            os.close(r)
            try:
                views = [memoryview(m) for m in maps]
                blob = b"".join(d for u in units[w::n] for d in hash_unit(new, maps, views, u))
                with os.fdopen(wr, "wb") as fh:
                    fh.write(blob)
            finally:
                os._exit(0)
        os.close(wr)
        children.append((pid, r))
    parts = []
    for pid, r in children:
        with os.fdopen(r, "rb") as fh:
            parts.append(fh.read())
        os.waitpid(pid, 0)
    size = 32
    per = [[p[k : k + size] for k in range(0, len(p), size)] for p in parts]
    out: list[list[bytes]] = [[] for _ in units]
    for w in range(n):
        pos = 0
        for j in range(w, len(units), n):
            out[j] = per[w][pos : pos + len(units[j])]
            pos += len(units[j])
    return [d for ds in out for d in ds]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--algo", choices=("blake3", "sha256"), default="blake3")
    ap.add_argument("--unit-mb", type=int, default=32)
    args = ap.parse_args()
    new = blake3.blake3 if args.algo == "blake3" else hashlib.sha256
    files = sorted(args.dir.glob("*.safetensors"))
    maps, units, total = plan(files, args.unit_mb << 20)
    ntensors = sum(map(len, units))
    times: dict[str, list[float]] = {"threads": [], "procs": []}
    ref = None
    for r in range(args.rounds):
        order = ("threads", "procs") if r % 2 == 0 else ("procs", "threads")
        for mode in order:
            fn = with_threads if mode == "threads" else with_procs
            t = time.perf_counter()
            digests = fn(new, maps, units, args.workers)
            times[mode].append(time.perf_counter() - t)
            if ref is None:
                ref = digests
            elif digests != ref:
                raise SystemExit(f"{mode}: digests differ from the first run's")
    print(
        f"{total / 1e9:.2f} GB, {ntensors} tensors, {len(units)} units of ~{args.unit_mb} MB, "
        f"{args.workers} workers, {args.algo}, {args.rounds} rounds"
    )
    for mode, ts in times.items():
        med, best = statistics.median(ts), min(ts)
        print(f"{mode:8s} median {med:.3f} s ({total / med / 1e9:.2f} GB/s), least {best:.3f} s")
    ratio = statistics.median(times["threads"]) / statistics.median(times["procs"])
    print(f"threads / procs (median time): {ratio:.2f}")


if __name__ == "__main__":
    main()
