"""Time `exl3tool validate --no-hash` on a GLM-5.2-shaped R7 checkpoint (issue 2, Performance).

75 MoE layers (3..77) + the carried MTP layer 78, 256 experts, hidden 6144, expert intermediate
2048, one shard per layer, realistic headers and manifests. Payloads are sparse holes (only the
mcg marker words are written), so the ~350 GB of apparent size costs no disk. The reference,
measured in the same run, is a plain `json.loads` of every safetensors header.

    python benchmarks/bench_validate.py [--keep DIR] [--repeat 3] [--profile]
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
from pathlib import Path

from exl3tool.actions.validate import validate_path
from exl3tool.checks.options import ValidateOptions
from exl3tool.synth.r7 import R7Spec, build_r7

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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", type=Path, help="build into (and keep) this directory")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="print a cProfile of one validate")
    args = ap.parse_args()
    tmp = None
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
        cli = [
            sys.executable,
            "-m",
            "exl3tool",
            "validate",
            "--no-hash",
            "--format",
            "json",
            str(root),
        ]
        env = {**os.environ, "EXL3TOOL_NO_PROGRESS": "1"}
        t_cli, proc = timed(lambda: subprocess.run(cli, capture_output=True, env=env), args.repeat)
        summary = json.loads(proc.stdout)["summary"]
        if args.profile:
            import cProfile
            import pstats

            cProfile.runctx("validate_path(root, opts)", globals(), locals(), "/tmp/bench.prof")
            pstats.Stats("/tmp/bench.prof").sort_stats("cumulative").print_stats(25)
        print(f"checkpoint: {n} tensors in {ref.extra['shards']} shards, "
              f"{apparent / 1e9:.0f} GB apparent, {on_disk / 1e6:.0f} MB on disk")  # fmt: skip
        print(f"cores: {len(os.sched_getaffinity(0))}")
        print(f"json.loads of all headers (reference): {t_json:.3f} s")
        print(f"validate_path --no-hash (in process):  {t_val:.3f} s  ratio {t_val / t_json:.1f}x")
        print(f"exl3tool validate --no-hash (CLI):     {t_cli:.3f} s  ratio {t_cli / t_json:.1f}x")
        met = t_cli < 1.5 and t_cli / t_json <= 7
        print(f"findings: {summary}, exit {proc.returncode}; target < 1.5 s and <= 7x "
              f"json.loads (issue 17): {'met' if met else 'MISSED'}")  # fmt: skip
        return 0 if proc.returncode == 0 else 1
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
