"""What forking the hashing workers costs (io/forkpool), by the parent's resident size.

    python benchmarks/fork_cost.py [--rss-mb 30,100,400] [--workers 4,16] [--repeat 5]

For each resident size (the parent first touches that many MB of its own heap, as identity's
parent holds its headers and plans) and worker count, times `ForkPool(...)` until every worker
is forked (the units are trivial), and prints the least of --repeat runs, in total and per fork.
A fork copies the parent's page tables: the cost grows with what the parent holds.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exl3tool.io.forkpool import ForkPool


class _Quiet:
    def advance(self, n: int) -> None:
        pass


def fork_ms(workers: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        pool = ForkPool(workers, list(range(workers)), lambda _: int, lambda _: None, _Quiet())
        best = min(best, time.perf_counter() - t)
        pool.wait()
        pool.close()
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rss-mb", default="30,100,400")
    ap.add_argument("--workers", default="4,16")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    held: list[bytearray] = []
    print("| parent heap MB | workers | fork all ms | per fork ms |")
    print("|---:|---:|---:|---:|")
    for mb in sorted(int(x) for x in args.rss_mb.split(",")):
        while len(held) < mb:
            block = bytearray(1 << 20)
            block[::4096] = b"\1" * len(block[::4096])  # resident, page by page
            held.append(block)
        for n in (int(x) for x in args.workers.split(",")):
            ms = fork_ms(n, args.repeat)
            print(f"| {mb} | {n} | {ms:.1f} | {ms / n:.2f} |")


if __name__ == "__main__":
    main()
