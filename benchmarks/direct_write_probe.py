"""How fast this disk takes durable writes the way the slicer makes them (issue 17's slice).

    python benchmarks/direct_write_probe.py DIR [--gb 4] [--files 2,4] [--inflight 1,2,4]
        [--stage-mib 8] [--rounds 3]

Writes `--gb` GB split over F new files in DIR, each file fed by Q threads that pwrite whole
stages at their own offsets with O_DIRECT (Q writes in flight per file; Q = 1 is the slicer's
one writer thread per stream), then fsyncs every file. The data come from page-aligned
buffers filled once, so nothing but the write path is timed. In the same rounds: `cp` of a
source file of the same size followed by `sync` (the slice benchmark's reference), and
buffered writes of the same stages followed by fsync. Prints each variant's median seconds and
its ratio to cp + sync. Removes what it wrote.
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import subprocess
import threading
import time
from pathlib import Path


def aligned(size: int) -> mmap.mmap:
    """An anonymous mapping: page-aligned, as O_DIRECT needs, filled with varied bytes."""
    buf = mmap.mmap(-1, size)
    block = os.urandom(1 << 20)
    for at in range(0, size, len(block)):
        buf[at : at + min(len(block), size - at)] = block[: min(len(block), size - at)]
    return buf


def write_files(
    folder: Path, total: int, files: int, inflight: int, stage: int, direct: bool
) -> float:
    per_file = total // files // stage * stage
    bufs = [aligned(stage) for _ in range(files * inflight)]
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | (os.O_DIRECT if direct else 0)
    fds = [os.open(folder / f"out{f}.bin", flags, 0o644) for f in range(files)]

    def run(f: int, q: int) -> None:
        view = memoryview(bufs[f * inflight + q])
        for at in range(q * stage, per_file, inflight * stage):
            os.pwrite(fds[f], view, at)

    began = time.perf_counter()
    threads = [
        threading.Thread(target=run, args=(f, q)) for f in range(files) for q in range(inflight)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for fd in fds:
        os.fsync(fd)
    took = time.perf_counter() - began
    for f, fd in enumerate(fds):
        os.close(fd)
        os.unlink(folder / f"out{f}.bin")
    for b in bufs:
        b.close()
    os.sync()
    return took


def cp_sync(src: Path, folder: Path) -> float:
    dst = folder / "copy.bin"
    began = time.perf_counter()
    subprocess.run(["cp", str(src), str(dst)], check=True)
    subprocess.run(["sync", str(dst)], check=True)
    took = time.perf_counter() - began
    dst.unlink()
    os.sync()
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--gb", type=float, default=4)
    ap.add_argument("--files", default="2,4")
    ap.add_argument("--inflight", default="1,2,4")
    ap.add_argument("--stage-mib", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    folder = args.dir
    folder.mkdir(parents=True, exist_ok=True)
    total = int(args.gb * 1e9)
    stage = args.stage_mib << 20
    src = folder / "source.bin"
    with open(src, "wb") as fh:
        block = os.urandom(8 << 20)
        for _ in range(0, total, len(block)):
            fh.write(block)
    os.sync()
    cp_sync(src, folder)  # warm: the source in the page cache, as in the slice benchmark
    variants: list[tuple[str, object]] = [("cp + sync", None)]
    for files in (int(x) for x in args.files.split(",")):
        variants.append((f"{files} files buffered + fsync", (files, 1, False)))
        for q in (int(x) for x in args.inflight.split(",")):
            variants.append((f"{files} files O_DIRECT, {q} in flight", (files, q, True)))
    times: dict[str, list[float]] = {name: [] for name, _ in variants}
    for _ in range(args.rounds):  # paired: every variant once per round
        for name, spec in variants:
            if spec is None:
                times[name].append(cp_sync(src, folder))
            else:
                files, q, direct = spec  # type: ignore[misc]
                times[name].append(write_files(folder, total, files, q, stage, direct))
    src.unlink()
    ref = statistics.median(times["cp + sync"])
    print(f"{total / 1e9:.2f} GB, stage {args.stage_mib} MiB, {args.rounds} rounds, {folder}")
    for name, _ in variants:
        med = statistics.median(times[name])
        rounds = ", ".join(f"{t:.2f}" for t in times[name])
        print(f"{name:32s} {med:6.2f} s  {ref / med:5.2f}x of cp + sync  ({rounds})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
