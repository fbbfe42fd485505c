"""Reading large identity records back, and large hostile JSON in their place (issue 15, 17).

    python benchmarks/bench_records.py [--mb 200] [--repeat 1] [--dir DIR] [--tree DIR]

Writes four documents of about `--mb` MB each, then times `exl3tool diff DOC DOC` on each (as
a child process: wall seconds, peak RSS by wait4) against the reference measured in the same
run, `json.loads` of the same bytes in a child process:
- record: an identity record as `identity` writes it (indent 2), names like a MoE
  checkpoint's (`model.layers.L.mlp.experts.E.PROJ.FIELD`) and their types;
- short names: the layout of a record, but names of a few characters: the most entries, hence
  memory, that a document of this size can hold in the record's layout;
- string map: `{"tensors": {"<12 chars>": "<14 chars>", ...}}`, one value per 16 bytes;
- containers: `[{},{},...]`, a container per 3 bytes.
Prints each row's time and RSS, both as a ratio to json.loads, and RSS over the file size.
`--tree DIR`: run another source tree's exl3tool (e.g. `git archive REV exl3tool | tar -x -C
DIR`) for a before/after.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOADS = "import json, sys; json.loads(open(sys.argv[1], 'rb').read())"


def _head(n_layers: int) -> tuple[str, str]:
    """The record's text before and after its two per-tensor maps."""
    layers = {str(i): secrets.token_hex(32) for i in range(n_layers)}
    tail = json.dumps({"layers": layers, "root": secrets.token_hex(32)}, indent=2)
    head = '{\n  "schema": "exl3tool-identity/1",\n  "algorithm": "blake3",\n  "tensors": {'
    return head, "\n  },\n" + tail[2:]


def write_record(path: Path, size: int, short: bool) -> None:
    """An identity record of about `size` bytes; `short`: names of a few characters."""
    fields = ("trellis", "suh", "svh", "mcg")
    shapes = {"trellis": [128, 16, 256], "suh": [2048], "svh": [6144], "mcg": [1]}
    names, total, i = [], 0, 0
    while total < size:
        if short:
            name = format(i, "x")
        else:
            layer, rest = divmod(i, 256 * 3 * 4)
            expert, rest = divmod(rest, 12)
            proj = ("gate_proj", "up_proj", "down_proj")[rest // 4]
            name = f"model.layers.{layer}.mlp.experts.{expert}.{proj}.{fields[rest % 4]}"
        names.append(name)
        total += 2 * len(name) + (150 if short else 175)
        i += 1
    head, tail = _head(1 if short else 75)
    with open(path, "w") as fh:
        fh.write(head)
        fh.write(",".join(f'\n    "{n}": "{secrets.token_hex(32)}"' for n in names))
        fh.write('\n  },\n  "types": {')
        kinds = {}
        for f in fields:
            body = json.dumps({"dtype": "I16" if f == "trellis" else "F16", "shape": shapes[f]},
                              indent=2)  # fmt: skip
            kinds[f] = body.replace("\n", "\n    ")
        short_kind = kinds["mcg"]
        fh.write(",".join(f'\n    "{n}": {short_kind if short else kinds[n.rsplit(".", 1)[1]]}'
                          for n in names))  # fmt: skip
        fh.write(tail)


def write_strings(path: Path, size: int) -> None:
    n = size // 32
    with open(path, "w") as fh:
        fh.write('{"schema": "exl3tool-identity/1", "algorithm": "blake3", "tensors": {')
        fh.write(",".join(f'"{i:012d}":"{i:014d}"' for i in range(n)))
        fh.write('}, "layers": {}, "root": "' + "0" * 64 + '"}')


def write_containers(path: Path, size: int) -> None:
    with open(path, "w") as fh:
        fh.write("[" + ",".join(["{}"] * (size // 3)) + "]")


WRITERS = {
    "record": lambda p, n: write_record(p, n, short=False),
    "short": lambda p, n: write_record(p, n, short=True),
    "strings": write_strings,
    "containers": write_containers,
}
LABELS = {
    "record": "record",
    "short names (record layout)": "short",
    "string map": "strings",
    "containers": "containers",
}


def timed(cmd: list[str], repeat: int, cwd: Path) -> tuple[float, int, int]:
    """Best wall time, the largest peak RSS (bytes) and the last exit code of `repeat` runs;
    run in `cwd` (`python -m` puts its working directory first on sys.path)."""
    best, rss, code = float("inf"), 0, 0
    for _ in range(repeat):
        t = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd)
        _, status, usage = os.wait4(p.pid, 0)
        best = min(best, time.perf_counter() - t)
        rss = max(rss, usage.ru_maxrss * 1024)
        code = os.waitstatus_to_exitcode(status)
    return best, rss, code


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--tree", type=Path, default=ROOT)
    ap.add_argument("--write", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.write:  # in a child: the parent's peak RSS would pass on to every command
        kind, path, size = args.write
        WRITERS[kind](Path(path), int(size))
        return
    os.environ["PYTHONPATH"] = str(args.tree) + os.pathsep + os.environ.get("PYTHONPATH", "")
    py, size = sys.executable, args.mb * 1_000_000
    work = Path(tempfile.mkdtemp(prefix="bench-records-", dir=args.dir))
    print(f"tree: {args.tree}, documents of ~{args.mb} MB, best of {args.repeat}")
    print("| document | bytes | json.loads s / MB | diff s / MB / exit | × json.loads time "
          "| × json.loads RSS | RSS / file |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    try:
        for label, kind in LABELS.items():
            path = work / "doc.json"
            subprocess.run([py, __file__, "--write", kind, str(path), str(size)], check=True)
            n = path.stat().st_size
            ref_s, ref_rss, _ = timed([py, "-c", LOADS, str(path)], args.repeat, work)
            diff = [py, "-m", "exl3tool", "diff", str(path), str(path)]
            dt, rss, code = timed(diff, args.repeat, work)
            print(f"| {label} | {n:,} | {ref_s:.2f} / {ref_rss / 1e6:.0f} "
                  f"| {dt:.2f} / {rss / 1e6:.0f} / {code} | {dt / ref_s:.2f} "
                  f"| {rss / ref_rss:.2f} | {rss / n:.2f} |")  # fmt: skip
            path.unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
