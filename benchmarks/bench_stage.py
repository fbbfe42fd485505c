"""Staging throughput: `stage_cartridge` (copy + sha256 + blake3 + every check) vs `cp` of the shards.

    python benchmarks/bench_stage.py [--gb 2] [--keep DIR]

Builds a synthetic base and a full 2-stage adapter of about --gb GB (K=6 stages), warms the page
cache, then times in the same run, alternating, best of --reps:
  * `cp` of the adapter's shards into a fresh directory (+ sync of the written files);
  * the copy phase of staging (`copy_verified`: one read per shard, sha256 + blake3, write);
  * the whole `stage_cartridge` (copy phase + base identity recomputed from its bytes + every
    validation + runtime tables + fsync + atomic rename), TP 1 (copied as is).
Prints GB/s and the ratios t_cp / t_stage (target >= 0.7).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from exl3tool.formats.cartridge import load_cartridge
from exl3tool.rules.registry import Findings
from exl3tool.staging.stage import copy_verified, stage_cartridge
from exl3tool.synth.msrt import build_adapter, build_base


def build(root: Path, gb: float) -> tuple[Path, Path, int]:
    hidden, inter, experts = 4096, 2048, 16
    per_layer = 3 * experts * 2 * (hidden // 16) * (inter // 16) * 96 * 2  # 2 stages, K=6
    layers = max(1, round(gb * 1e9 / per_layer))
    base = build_base(
        root / "base", layers=range(layers), experts=experts, hidden=hidden, intermediate=inter, k=2
    )
    adapter = build_adapter(root / "adapter", base, chain=(("s1", 6), ("s2", 6)))
    size = sum(p.stat().st_size for p in adapter.glob("*.safetensors"))
    return base, adapter, size


def warm(paths: list[Path]) -> None:
    for p in paths:
        with open(p, "rb") as fh:
            while fh.read(64 << 20):
                pass


def time_cp(adapter: Path, dest: Path) -> float:
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir()
    shards = sorted(str(p) for p in adapter.glob("*.safetensors"))
    t = time.perf_counter()
    subprocess.run(["cp", *shards, str(dest)], check=True)
    subprocess.run(["sync", "-f", str(dest)], check=False)
    return time.perf_counter() - t


def time_copy_phase(adapter: Path, dest: Path, threads: int | None) -> float:
    shutil.rmtree(dest, ignore_errors=True)
    cart = load_cartridge(adapter, Findings())
    t = time.perf_counter()
    f = Findings()
    copy_verified(cart, dest, f, threads=threads)
    for p in dest.glob("*.safetensors"):  # durability, as cp + sync
        fd = os.open(p, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    dt = time.perf_counter() - t
    assert not f.has_errors(), list(f)
    return dt


def time_stage(adapter: Path, base: Path, out: Path, threads: int | None) -> float:
    shutil.rmtree(out, ignore_errors=True)  # as for cp: deleting the old copy is not timed
    t = time.perf_counter()
    stage_cartridge(adapter, base, out=out, force=True, threads=threads)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--keep", type=Path, default=None, help="build into DIR and keep it")
    args = ap.parse_args()
    root = Path(args.keep or tempfile.mkdtemp(prefix="bench-stage-", dir="/var/tmp"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        t = time.perf_counter()
        base, adapter, size = build(root, args.gb)
        print(
            f"built {size / 1e9:.2f} GB adapter ({len(list(adapter.glob('*.safetensors')))} shards) in {time.perf_counter() - t:.1f} s"
        )
        warm([*adapter.glob("*.safetensors"), *base.glob("*.safetensors")])
        cp_t, copy_t, stage_t = [], [], []
        for _ in range(args.reps):
            cp_t.append(time_cp(adapter, root / "cp-out"))
            copy_t.append(time_copy_phase(adapter, root / "copy-out", args.threads))
            stage_t.append(time_stage(adapter, base, root / "staged", args.threads))
        cp, cpy, stg = min(cp_t), min(copy_t), min(stage_t)
        gbs = lambda s: size / s / 1e9  # noqa: E731
        print(f"cp                 {cp:6.2f} s  {gbs(cp):5.2f} GB/s")
        print(
            f"stage copy phase   {cpy:6.2f} s  {gbs(cpy):5.2f} GB/s  ratio t_cp/t = {cp / cpy:.2f}"
        )
        print(
            f"stage-cartridge    {stg:6.2f} s  {gbs(stg):5.2f} GB/s  ratio t_cp/t = {cp / stg:.2f}  (target >= 0.7)"
        )
        print(
            f"all runs: cp {[round(x, 2) for x in cp_t]} copy {[round(x, 2) for x in copy_t]} "
            f"stage {[round(x, 2) for x in stage_t]}"
        )
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
