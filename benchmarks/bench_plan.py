"""Time `exl3tool plan --tp 4` on a GLM-5.2-shaped R7 checkpoint (issue 14, Performance).

The checkpoint is the one `bench_validate.py` builds (75 MoE layers + the carried MTP layer,
256 experts, one shard per layer, sparse payloads, headers only are read). The reference,
measured in the same run, is a plain `json.loads` of every safetensors header.

    python benchmarks/bench_plan.py [--keep DIR] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gc
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_validate import GLM52, json_headers, timed

from exl3tool.actions import plan
from exl3tool.formats.checkpoint import load_checkpoint
from exl3tool.rules.registry import Findings
from exl3tool.synth.r7 import build_r7


def in_process(root: Path, tp: int, quantization: str | None = None) -> plan.BootPlan:
    was = gc.isenabled()
    gc.disable()  # as validate: ~10^6 small objects in no cycle
    try:
        return plan.run(plan.PlanOptions(str(root), tp, 96 * 2**30, quantization))
    finally:
        if was:
            gc.enable()


def cli(root: Path, tp: int) -> None:
    cmd = [sys.executable, "-m", "exl3tool", "plan", str(root), "--tp", str(tp),
           "--gpu-memory", "96GiB", "--format", "json"]  # fmt: skip
    done = subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL)
    if done.returncode not in (0, 1):  # 1: findings (the synthetic tail's tp is 1)
        raise SystemExit(f"exl3tool plan failed with exit {done.returncode}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", type=Path, help="build into (and keep) this directory")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tp", type=int, default=4)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-plan-")) if args.keep is None else None
    root = args.keep if args.keep is not None else tmp / "glm52-r7"  # type: ignore[operator]
    try:
        if not (root / "MANIFEST.json").is_file():
            t = time.perf_counter()
            build_r7(root, GLM52)
            print(f"built {root} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        shards = len(list(root.glob("*.safetensors")))
        t_json, n = timed(lambda: json_headers(root), args.repeat)
        t_load, _ = timed(lambda: load_checkpoint(root, Findings()), args.repeat)
        t_plan, result = timed(lambda: in_process(root, args.tp), args.repeat)
        t_bf16, fallback = timed(lambda: in_process(root, args.tp, "modelopt"), args.repeat)
        t_cli, _ = timed(lambda: cli(root, args.tp), args.repeat)
        print(f"checkpoint: {shards} shards, {n} tensors; TP {args.tp}")
        print(f"json.loads of all headers      {t_json:7.3f} s")
        print(f"load_checkpoint (headers only) {t_load:7.3f} s  ({t_load / t_json:.1f}x)")
        print(f"plan in process                {t_plan:7.3f} s  ({t_plan / t_json:.1f}x)")
        print(f"plan --quantization modelopt   {t_bf16:7.3f} s  ({t_bf16 / t_json:.1f}x)")
        print(f"exl3tool plan (CLI, new proc)  {t_cli:7.3f} s  ({t_cli / t_json:.1f}x)")
        for label, p in (("EXL3 claimed", result), ("BF16 fallback", fallback)):
            totals = ", ".join(f"{t / 2**30:.1f}" for t in p.totals())  # type: ignore[union-attr]
            codes = sorted(p.findings.codes())  # type: ignore[union-attr]
            print(f"{label:<14} GiB per rank: {totals}; findings {codes}")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
