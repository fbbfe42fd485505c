"""Benchmark `exl3tool slice` on a ~4 GB R7-shaped checkpoint at TP 2 and 4 against a durable copy
of the same files (`cp`, then `sync` of the copies), in the same run (warm page cache for both),
and the slicer's peak RSS.

    python benchmarks/bench_slice.py [--dir /var/tmp/bench-slice] [--gb 4] [--repeat 3] [--keep]
                                     [--bytecode]

Per TP size, `--repeat` rounds of: cp + sync (timed), then the slice (timed); every output is
removed and `sync`ed before the next command, so each starts with no dirty pages. The slice
includes everything its manifest needs (per-file blake3 and the source's blake3 identity root)
and its atomic publish fsyncs every output file, so its reference is the durable copy. Prints
the medians: seconds, CPU seconds, source GB/s, the ratio to the durable copy (issue 17 target
>= 0.95; the median of the per-round ratios t_cp+sync / t_slice, and the rounds), the ratio to
the plain cp, and the peak RSS of the slicing process (target < 500 MB). `--bytecode`: the slices
run from compiled modules, as an installed package does (where PYTHONDONTWRITEBYTECODE is set, a
checkout otherwise compiles every module at each start).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from as_installed import HELP, bytecode_state, use_bytecode

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# The source is built in a child process (`--build-only`): ru_maxrss survives fork+exec, so a
# parent holding the builder's arrays would pass its peak RSS on to every process it starts.


def build(root: Path, gb: float) -> Path:
    from exl3tool.synth.r7 import build_r7

    hidden, inter, experts = 2048, 1024, 64
    per_layer = experts * 3 * hidden * inter * 4 // 8  # K averages 4 over {3, 4, 5}
    layers = max(1, round(gb * 1e9 / per_layer))
    return build_r7(
        root, num_hidden_layers=layers + 1, first_moe_layer=1, n_experts=experts, hidden=hidden,
        moe_intermediate=inter, mtp=False, seed=1,
    )  # fmt: skip


def _env() -> dict[str, str]:
    """The environment of a child: this checkout first on the import path."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


def run(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, int, float]:
    """Wall seconds, peak RSS (bytes) and CPU seconds (user + sys) of a child process."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env=env or _env())
    _, status, usage = os.wait4(proc.pid, 0)
    dt = time.perf_counter() - t
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}")
    return dt, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime


def clean(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    subprocess.run(["sync"], check=True)  # the next command starts with no dirty pages


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/bench-slice"))
    ap.add_argument("--gb", type=float, default=4.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tp", type=int, nargs="*", default=[2, 4])
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--bytecode", action="store_true", help=HELP)
    ap.add_argument("--build-only", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.build_only is not None:
        build(args.build_only, args.gb)
        return
    src = args.dir / "src"
    if not (src / "config.json").is_file():
        shutil.rmtree(args.dir, ignore_errors=True)
        args.dir.mkdir(parents=True)
        subprocess.run(
            [sys.executable, __file__, "--build-only", str(src), "--gb", str(args.gb)],
            check=True, env=_env(),
        )  # fmt: skip
    shards = sorted(src.glob("*.safetensors"))
    size = sum(p.stat().st_size for p in shards)
    subprocess.run(["cat", *map(str, shards)], stdout=subprocess.DEVNULL, check=True)  # warm
    if args.bytecode:  # the children inherit it; an untimed slice fills the cache
        use_bytecode(args.dir / ".pycache")
        warm = args.dir / "warm-up"
        clean(warm)
        subprocess.run(
            [sys.executable, "-m", "exl3tool", "slice", str(src), "--tp", "2", "-o", str(warm)],
            check=True, env=_env(), stdout=subprocess.DEVNULL,
        )  # fmt: skip
        clean(warm)
    print(
        f"source: {size / 1e9:.2f} GB in {len(shards)} shards ({os.cpu_count()} cores), "
        f"bytecode cache {bytecode_state()}"
    )
    for tp in args.tp:
        cp_t, sync_t, sl_t, sl_cpu, cp_cpu, ratios, rss = [], [], [], [], [], [], 0
        for _ in range(args.repeat):
            cp_dir = args.dir / f"cp{tp}"
            clean(cp_dir)
            cp_dir.mkdir()
            t_cp, _, c_cp = run(["cp", *map(str, shards), str(cp_dir)])
            t_sync, _, _ = run(["sync", *map(str, sorted(cp_dir.iterdir()))])
            clean(cp_dir)
            out = args.dir / f"tp{tp}"
            clean(out)
            cmd = [sys.executable, "-m", "exl3tool", "slice", str(src), "--tp", str(tp)]
            t_sl, r, c_sl = run([*cmd, "-o", str(out)])
            clean(out)
            cp_t.append(t_cp)
            sync_t.append(t_cp + t_sync)
            sl_t.append(t_sl)
            sl_cpu.append(c_sl)
            cp_cpu.append(c_cp)
            ratios.append((t_cp + t_sync) / t_sl)
            rss = max(rss, r)
        med = statistics.median
        print(
            f"TP {tp} (median of {args.repeat}): cp {med(cp_t):.2f} s (cpu {med(cp_cpu):.1f} s); "
            f"cp + sync {med(sync_t):.2f} s; slice {med(sl_t):.2f} s "
            f"({size / med(sl_t) / 1e9:.2f} GB/s, cpu {med(sl_cpu):.1f} s); "
            f"ratio {med(ratios):.2f}x cp + sync (rounds: {', '.join(f'{x:.2f}' for x in ratios)}),"
            f" {med(cp_t) / med(sl_t):.2f}x cp; peak RSS {rss / 2**20:.0f} MiB"
        )
    if not args.keep:
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
