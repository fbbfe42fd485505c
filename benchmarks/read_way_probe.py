"""One thread, one file: blake3 per tensor-sized piece from a mapping, from a mapping populated
ahead (MADV_POPULATE_READ), and from pread into a 512 KiB buffer (issue 17's read choice).

    python benchmarks/read_way_probe.py FILE [--piece 786432] [--rounds 3]

Each way hashes the file in 32 MiB windows of `--piece`-byte pieces (a mapping's window is
dropped after it, as the engine does); prints the wall and CPU seconds of each way per round.
"""

from __future__ import annotations

import argparse
import mmap
import os
import time
from pathlib import Path

import blake3

WINDOW = 32 << 20
BUF = 512 << 10
POPULATE_READ = 22  # madvise(2), Linux 5.14+


def _hash(fd: int, mm: mmap.mmap, size: int, piece: int, way: str) -> tuple[float, float]:
    t, c = time.perf_counter(), time.process_time()
    view, buf = memoryview(mm), bytearray(BUF)
    out = memoryview(buf)
    for lo in range(0, size - WINDOW + 1, WINDOW):
        if way == "pread":
            for a in range(lo, lo + WINDOW - piece + 1, piece):
                h = blake3.blake3()
                for b in range(a, a + piece, BUF):
                    n = min(BUF, a + piece - b)
                    os.preadv(fd, [out[:n]], b)
                    h.update(out[:n])
                h.hexdigest()
            continue
        if way == "populated":
            mm.madvise(POPULATE_READ, lo, WINDOW)
        for a in range(lo, lo + WINDOW - piece + 1, piece):
            blake3.blake3(view[a : a + piece]).hexdigest()
        mm.madvise(mmap.MADV_DONTNEED, lo, WINDOW)
    view.release()
    return time.perf_counter() - t, time.process_time() - c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("--piece", type=int, default=786432)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    fd = os.open(args.file, os.O_RDONLY)
    size = os.fstat(fd).st_size
    mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    try:
        for r in range(args.rounds):
            for way in ("mapped", "populated", "pread"):
                wall, cpu = _hash(fd, mm, size, args.piece, way)
                print(f"round {r + 1}: {way:9s} wall {wall:.3f} s, CPU {cpu:.3f} s")
    finally:
        mm.close()
        os.close(fd)


if __name__ == "__main__":
    main()
