"""Time `exl3tool validate --no-hash` on a GLM-5.2-shaped R7 checkpoint (issue 2, Performance).

75 MoE layers (3..77) + the carried MTP layer 78, 256 experts, hidden 6144, expert intermediate
2048, one shard per layer, realistic headers and manifests. Payloads are sparse holes (only the
mcg marker words are written), so the ~350 GB of apparent size costs no disk. The reference,
measured in the same run, is a plain `json.loads` of every safetensors header.

    python benchmarks/bench_validate.py [--keep DIR] [--repeat 3] [--profile] [--bytecode]
    python benchmarks/bench_validate.py --scaling [--tensors 10000,100000,1000000] [--keep DIR]

`--scaling` builds the same shape with as many experts per layer as give about each tensor
count (the cost per tensor, 10^4 to 10^6) and prints the CLI's and the floor's µs per tensor.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from as_installed import HELP, bytecode_state, use_bytecode

from exl3tool.actions.validate import validate_path
from exl3tool.checks.options import ValidateOptions
from exl3tool.synth.r7 import R7Spec, build_r7

# tensors per expert (75 layers x 3 projections x trellis, vector, marker, and the MTP layer's
# 12) and the rest of the GLM-5.2 shape: 176,812 tensors at 256 experts
PER_EXPERT = 75 * 3 * 3 + 12
FIXED = 176_812 - 256 * PER_EXPERT

GLM52 = R7Spec(
    num_hidden_layers=78,
    first_moe_layer=3,
    n_experts=256,
    hidden=6144,
    moe_intermediate=2048,
    dense_width=512,
    vocab=154880,
    payload="sparse",
    seed=0,
)


def json_headers(root: Path) -> int:
    """The reference: read and `json.loads` every safetensors header; returns the tensor count."""
    n = 0
    for p in sorted(root.glob("*.safetensors")):
        with open(p, "rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            n += len(json.loads(fh.read(length))) - 1
    return n


def timed(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def _cli(root: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "exl3tool",
        "validate",
        "--no-hash",
        "--format",
        "json",
        str(root),
    ]


def scaling(base: Path, counts: list[int], repeat: int) -> int:
    """µs per tensor of the CLI and of the floor at about each tensor count."""
    env = {**os.environ, "EXL3TOOL_NO_PROGRESS": "1"}
    print(f"cores: {len(os.sched_getaffinity(0))}, median of {repeat}")
    print("| tensors | experts | json.loads s | CLI s | floor µs/tensor | CLI µs/tensor | ratio "
          "| CLI µs per added tensor |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    last: tuple[int, float] | None = None
    for want in counts:
        experts = max(1, round((want - FIXED) / PER_EXPERT))
        root = base / f"r7-{experts}-experts"
        if not (root / "MANIFEST.json").is_file():
            t = time.perf_counter()
            build_r7(root, replace(GLM52, n_experts=experts))
            print(f"built {root} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        t_json, n = timed(lambda r=root: json_headers(r), repeat)
        t_cli, proc = timed(
            lambda r=root: subprocess.run(_cli(r), capture_output=True, env=env), repeat
        )
        if proc.returncode not in (0, 1):  # 1: findings (10^6: the index passes 64 MiB, JS006)
            print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
            return 1
        added = f"{(t_cli - last[1]) / (n - last[0]) * 1e6:.2f}" if last and n > last[0] else "-"
        print(f"| {n:,} | {experts} | {t_json:.3f} | {t_cli:.3f} | {t_json / n * 1e6:.2f} | "
              f"{t_cli / n * 1e6:.2f} | {t_cli / t_json:.1f}x | {added} |", flush=True)  # fmt: skip
        last = (n, t_cli)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", type=Path, help="build into (and keep) this directory")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="print a cProfile of one validate")
    ap.add_argument("--scaling", action="store_true", help="µs per tensor at --tensors counts")
    ap.add_argument("--tensors", default="10000,100000,1000000")
    ap.add_argument("--bytecode", action="store_true", help=HELP)
    args = ap.parse_args()
    if args.scaling:
        base = args.keep or Path(tempfile.mkdtemp(prefix="bench-validate-scaling-"))
        try:
            return scaling(base, [int(x) for x in args.tensors.split(",")], args.repeat)
        finally:
            if args.keep is None:
                shutil.rmtree(base, ignore_errors=True)
    tmp = cache = None
    if args.keep is None:
        tmp = Path(tempfile.mkdtemp(prefix="bench-validate-"))
        root = tmp / "glm52-r7"
    else:
        root = args.keep
    try:
        if not (root / "MANIFEST.json").is_file():
            t = time.perf_counter()
            build_r7(root, GLM52)
            print(f"built {root} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        apparent = sum(p.stat().st_size for p in root.iterdir())
        on_disk = sum(p.stat().st_blocks * 512 for p in root.iterdir())
        t_json, n = timed(lambda: json_headers(root), args.repeat)
        opts = ValidateOptions(hash=False)
        t_val, (ref, findings) = timed(lambda: validate_path(root, opts), args.repeat)
        cli = _cli(root)
        if args.bytecode:  # the children inherit it; a warm-up run fills the cache
            cache = Path(tempfile.mkdtemp(prefix="bench-validate-pycache-"))
            use_bytecode(cache)
        env = {**os.environ, "EXL3TOOL_NO_PROGRESS": "1"}
        subprocess.run(cli, capture_output=True, env=env)  # warm-up
        t_cli, proc = timed(lambda: subprocess.run(cli, capture_output=True, env=env), args.repeat)
        summary = json.loads(proc.stdout)["summary"]
        if args.profile:
            import cProfile
            import pstats

            cProfile.runctx("validate_path(root, opts)", globals(), locals(), "/tmp/bench.prof")
            pstats.Stats("/tmp/bench.prof").sort_stats("cumulative").print_stats(25)
        print(f"checkpoint: {n} tensors in {ref.extra['shards']} shards, "
              f"{apparent / 1e9:.0f} GB apparent, {on_disk / 1e6:.0f} MB on disk")  # fmt: skip
        print(f"cores: {len(os.sched_getaffinity(0))}, bytecode cache {bytecode_state()}")
        print(f"json.loads of all headers (reference): {t_json:.3f} s")
        print(f"validate_path --no-hash (in process):  {t_val:.3f} s  ratio {t_val / t_json:.1f}x")
        print(f"exl3tool validate --no-hash (CLI):     {t_cli:.3f} s  ratio {t_cli / t_json:.1f}x")
        met = t_cli < 1.5 and t_cli / t_json <= 7
        print(f"findings: {summary}, exit {proc.returncode}; target < 1.5 s and <= 7x "
              f"json.loads (issue 17): {'met' if met else 'MISSED'}")  # fmt: skip
        return 0 if proc.returncode == 0 else 1
    finally:
        for folder in (tmp, cache):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
