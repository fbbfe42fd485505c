"""`validate` and `identity` on ONE safetensors file of N tensors (issue 15 item 7, issue 17).

    python benchmarks/bench_one_header.py [--tensors 10000,100000,1000000] [--repeat 1]

Builds `model.safetensors` with N small F16 vectors (`model.layers.L.experts.E.wJ`, 16 bytes
each, random bytes; 10^6 of them stay under the 100 MB header limit) in a child process, then
times as child processes, in the same run: a bare `json.loads` of the header (the floor),
`exl3tool validate --no-hash`, `exl3tool identity --algo blake3` and `--algo sha256` (text
output), `exl3tool identity --format json` (the whole record on stdout), and reading that
record back: `identity --check RECORD` and `diff RECORD RECORD`. Prints wall seconds, CPU
seconds, µs per tensor, the ratio to the floor's wall time and peak RSS (wait4) per row. Targets at 10^6:
validate < 5 s, identity < 10 s, both < 1 GB. The file has no trellis, so validate exits 1
with one finding (EX017); what is timed is the header and the per-tensor checks.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FLOOR = """
import json, struct, sys
with open(sys.argv[1], "rb") as fh:
    n = struct.unpack("<Q", fh.read(8))[0]
    json.loads(fh.read(n))
"""


def build(path: Path, n: int) -> None:
    """One shard of `n` F16[8] tensors in header order (payload: random bytes)."""
    from exl3tool.io.st_writer import SafetensorsStreamWriter, TensorSpec

    names = []
    for i in range(n):
        layer, rest = divmod(i, 256 * 6)
        names.append(f"model.layers.{layer}.experts.{rest // 6}.w{rest % 6}")
    specs = [TensorSpec(name, "F16", (8,)) for name in names]
    with open(path, "wb") as fh:
        w = SafetensorsStreamWriter(fh, specs)
        w.write(os.urandom(16 * n))
        w.close()


def timed(cmd: list[str], repeat: int) -> tuple[float, float, int]:
    """Best wall time, its CPU seconds and the largest peak RSS (bytes) of `repeat` runs; exit
    0 or 1 accepted."""
    best, cpu, rss = float("inf"), 0.0, 0
    for _ in range(repeat):
        t = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(p.pid, 0)
        dt = time.perf_counter() - t
        code = os.waitstatus_to_exitcode(status)
        if code not in (0, 1):
            err = p.stderr.read().decode() if p.stderr else ""
            raise SystemExit(f"{' '.join(cmd)} failed ({code}): {err[-2000:]}")
        if dt < best:
            best, cpu = dt, usage.ru_utime + usage.ru_stime
        rss = max(rss, usage.ru_maxrss * 1024)
    return best, cpu, rss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", default="10000,100000,1000000")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--build-only", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.build_only:  # in a child: the parent's peak RSS would pass on to every command
        build(Path(args.build_only[0]), int(args.build_only[1]))
        return
    os.environ["EXL3TOOL_NO_PROGRESS"] = "1"
    os.environ["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    py = sys.executable
    cores = len(os.sched_getaffinity(0))
    print(f"cores: {cores}, best of {args.repeat}")
    print("| tensors | command | wall s | CPU s | µs/tensor (wall) | × floor | peak RSS MB |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    work = Path(tempfile.mkdtemp(prefix="bench-one-header-", dir=args.dir))
    try:
        for n in (int(x) for x in args.tensors.split(",")):
            f, rec = work / "model.safetensors", work / "record.json"
            subprocess.run([py, __file__, "--build-only", str(f), str(n)], check=True)
            exl = [py, "-m", "exl3tool"]
            # the record the last two rows read back (written, not timed)
            subprocess.run([*exl, "identity", "-o", str(rec), "--force", str(f)], check=True)
            rows = {
                "json.loads of the header (floor)": [py, "-c", FLOOR, str(f)],
                "validate --no-hash": [*exl, "validate", "--no-hash", str(f)],
                "identity --algo blake3": [*exl, "identity", "--algo", "blake3", str(f)],
                "identity --algo sha256": [*exl, "identity", "--algo", "sha256", str(f)],
                "identity --format json (the record)": [*exl, "identity", "--format", "json", str(f)],
                "identity --check RECORD": [*exl, "identity", "--check", str(rec), str(f)],
                "diff RECORD RECORD": [*exl, "diff", str(rec), str(rec)],
            }  # fmt: skip
            floor = None
            for label, cmd in rows.items():
                dt, cpu, rss = timed(cmd, args.repeat)
                floor = floor or dt
                per = dt / n * 1e6
                print(f"| {n:,} | {label} | {dt:.2f} | {cpu:.2f} | {per:.1f} | {dt / floor:.2f} "
                      f"| {rss / 1e6:.0f} |")  # fmt: skip
            f.unlink()
            rec.unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
