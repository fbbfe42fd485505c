"""How far N side-by-side sha256 hashers fall short of N x one (issue 17's sha256 reference).

    python benchmarks/sha256_scaling.py DIR [--procs 16] [--rounds 3] [--algo sha256|blake3]

The target compares `identity --algo sha256` with N x the speed of one hashlib thread alone.
This measures, on the same files (warm page cache), that one thread alone, then N forked
processes that each hash an equal share of the bytes with one hashlib hasher in 8 MiB updates
from a mapping (no GIL, no shared address space, no Python per tensor, no page drops): the
most N hashers get out of this machine's memory, clock and caches. Prints the ratio of the N
processes to N x one: what a perfect `identity` could reach against that reference.
"""

from __future__ import annotations

import argparse
import hashlib
import mmap
import os
import time
from pathlib import Path

STEP = 8 << 20


def _new(algo: str) -> object:
    if algo == "blake3":
        import blake3

        return blake3.blake3()
    return hashlib.sha256()


def _hash(files: list[tuple[Path, int]], lo: int, hi: int, algo: str) -> None:
    """Hash bytes [lo, hi) of the concatenation of `files`, one hasher per file touched."""
    at = 0
    for path, size in files:
        a, b = max(lo, at), min(hi, at + size)
        if a < b:
            with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                h, view = _new(algo), memoryview(mm)
                for i in range(a - at, b - at, STEP):
                    h.update(view[i : min(b - at, i + STEP)])  # type: ignore[attr-defined]
                view.release()
        at += size


def _forked(files: list[tuple[Path, int]], procs: int, algo: str) -> float:
    total = sum(s for _, s in files)
    t = time.perf_counter()
    pids = []
    for k in range(procs):
        pid = os.fork()
        if pid == 0:
            try:
                _hash(files, total * k // procs, total * (k + 1) // procs, algo)
            finally:
                os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--procs", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--algo", choices=("sha256", "blake3"), default="sha256")
    args = ap.parse_args()
    files = [(p, p.stat().st_size) for p in sorted(args.dir.glob("*.safetensors"))]
    total = sum(s for _, s in files)
    _hash(files, 0, total, "blake3")  # warm the page cache
    one = many = float("inf")
    for _ in range(args.rounds):
        t = time.perf_counter()
        _hash(files, 0, total, args.algo)
        one = min(one, time.perf_counter() - t)
        many = min(many, _forked(files, args.procs, args.algo))
    g1, gn = total / one / 1e9, total / many / 1e9
    print(f"{total / 1e9:.2f} GB, {args.algo}, best of {args.rounds}")
    print(f"one thread alone: {g1:.2f} GB/s; {args.procs} processes: {gn:.2f} GB/s")
    print(f"{args.procs} processes / ({args.procs} x one) = {gn / (args.procs * g1):.2f}")


if __name__ == "__main__":
    main()
