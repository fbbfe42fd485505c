"""The slicer's buffer constants against a durable copy, paired per round (issue 17's sweep).

    python benchmarks/slice_sweep.py DIR --tp 4 --rounds 3 [--bytecode] base STAGES=8 CHUNK=16777216,STAGE=16777216

Builds (or reuses) `bench_slice.py`'s source under DIR/src (`--gb`), then per round and per
config: `cp` + `sync` of the source shards, then `exl3tool slice` in a child whose
`exl3tool.tp.stream` constants are set first (`base`: as shipped; `SWITCH_US=N`: the thread
switch interval, `sys.setswitchinterval`, in microseconds; `TREE=PATH`: the exl3tool of
another checkout, e.g. `git worktree add /tmp/old HEAD~1`). Prints per config the median
ratio (cp + sync seconds / slice seconds), the rounds, and the largest peak RSS. `--bytecode`:
the slices run from compiled modules, as an installed package does (an untimed slice of each
config fills the cache first).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_slice
from as_installed import HELP, bytecode_state, use_bytecode

BOOT = """import sys
sys.path[:] = [p for p in sys.path if p not in ("", ".")]  # PYTHONPATH's tree, not the cwd
import exl3tool.tp.stream as stream
for kv in filter(None, sys.argv.pop(1).split(",")):
    name, value = kv.split("=")
    if name == "SWITCH_US":  # the interpreter's thread switch interval, in microseconds
        sys.setswitchinterval(int(value) / 1e6)
        continue
    if not hasattr(stream, name):
        raise SystemExit(f"exl3tool.tp.stream has no {name}")
    setattr(stream, name, int(value))
from exl3tool.cli import entry
sys.argv[0] = "exl3tool"
entry()
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("configs", nargs="+", help="base, or NAME=INT[,NAME=INT...]")
    ap.add_argument("--gb", type=float, default=4.0)
    ap.add_argument("--tp", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bytecode", action="store_true", help=HELP)
    args = ap.parse_args()
    src = args.dir / "src"
    if not (src / "config.json").is_file():
        args.dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, bench_slice.__file__, "--build-only", str(src), "--gb", str(args.gb)]
        subprocess.run(cmd, check=True, env=bench_slice._env())
    shards = sorted(src.glob("*.safetensors"))
    size = sum(p.stat().st_size for p in shards)
    subprocess.run(["cat", *map(str, shards)], stdout=subprocess.DEVNULL, check=True)  # warm
    rows: dict[str, list[tuple[float, int]]] = {c: [] for c in args.configs}
    out = args.dir / "out"

    def slice_with(cfg: str) -> tuple[float, int]:
        bench_slice.clean(out)
        knobs = [kv for kv in cfg.split(",") if cfg != "base" and not kv.startswith("TREE=")]
        trees = [kv[5:] for kv in cfg.split(",") if kv.startswith("TREE=")]
        env = bench_slice._env()
        if trees:  # another checkout's exl3tool first on the import path
            env["PYTHONPATH"] = os.pathsep.join([trees[-1], env["PYTHONPATH"]])
        cmd = [sys.executable, "-c", BOOT, ",".join(knobs), "slice", str(src)]
        t_sl, rss, _ = bench_slice.run([*cmd, "--tp", str(args.tp), "-o", str(out)], env)
        bench_slice.clean(out)
        return t_sl, rss

    if args.bytecode:  # the children inherit it; an untimed slice per config fills the cache
        use_bytecode(args.dir / ".pycache")
        for cfg in args.configs:
            slice_with(cfg)
    for _ in range(args.rounds):
        for cfg in args.configs:
            cp = args.dir / "cp"
            bench_slice.clean(cp)
            cp.mkdir()
            t_cp, _, _ = bench_slice.run(["cp", *map(str, shards), str(cp)])
            t_sync, _, _ = bench_slice.run(["sync", *map(str, sorted(cp.iterdir()))])
            bench_slice.clean(cp)
            t_sl, rss = slice_with(cfg)
            rows[cfg].append(((t_cp + t_sync) / t_sl, rss))
    print(
        f"source {size / 1e9:.2f} GB in {len(shards)} shards, TP {args.tp}, {args.rounds} "
        f"rounds, bytecode cache {bytecode_state()}"
    )
    for cfg, got in rows.items():
        ratios = [r for r, _ in got]
        print(f"{cfg:40s} ratio {statistics.median(ratios):.2f} to cp + sync "
              f"(rounds {', '.join(f'{r:.2f}' for r in ratios)}), "
              f"peak RSS {max(m for _, m in got) / 2**20:.0f} MiB")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
