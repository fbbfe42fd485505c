"""Benchmark `exl3tool identity` against b3sum, sha256sum and a one-thread hashlib loop.

    python benchmarks/bench_identity.py [--gb 4] [--dir /tmp] [--threads N] [--repeat 3]
                                        [--mix qwen3|glm] [--keep DIR] [--bytecode]

Builds ~4 GB of realistic EXL3 expert shards (trellis I16, suh/svh F16, mcg I32; 1 GB shards
with an index), warms the page cache, then times each method on the same files (best of
--repeat) in one run. Throughput = file bytes / wall time of the whole command (process start
included). Peak RSS of each child comes from wait4(). Targets (issues 7 and 17):
  blake3 identity >= 0.9 x b3sum (0.8 x for the 200 KB tensors of the qwen3 mix);
  sha256 identity >= 0.9 x (threads x one-thread hashlib); peak memory < 300 MB (the largest
  process's RSS or, with forked workers, the sampled Pss of them all: benchmarks/tree_memory.py).
It also prints whether the shards could be held under a read lease (blake3 then hashes from
mappings; else, and with EXL3TOOL_NO_LEASE=1, from pread) and the engine's cost per tensor
beyond hashing its bytes, in microseconds (one thread, in-process).
b3sum: `apt-get install -y b3sum` (Debian/Ubuntu) or `cargo install b3sum`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import mmap
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from as_installed import HELP, bytecode_state, use_bytecode
from tree_memory import PeakPss

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# The shards are built in a child process (`--build-only`): a parent that held numpy and the
# random pool would pass its peak RSS on to every child it starts (ru_maxrss survives fork+exec).

# (hidden, expert intermediate, K per projection, experts added per step) of each tensor mix:
# Qwen3-30B-A3B-like experts at 4 bits (~200 KB trellis), or GLM-5.2's 6144 x 2048 experts at
# K 3, 4 and 5 (4.7-7.9 MB trellis) next to their small suh/svh/mcg vectors.
MIXES = {"qwen3": (2048, 768, (4,), 128), "glm": (6144, 2048, (3, 4, 5), 16)}
MIX = MIXES["qwen3"]
SHARD_BYTES = 1 << 30


def _expert_specs(layer: int, experts: int) -> list:
    from exl3tool.io.st_writer import TensorSpec

    hidden, inter, ks, _ = MIX
    out = []
    for e in range(experts):
        for j, proj in enumerate(("gate_proj", "up_proj", "down_proj")):
            fin, fout = (inter, hidden) if proj == "down_proj" else (hidden, inter)
            p = f"model.layers.{layer}.mlp.experts.{e}.{proj}"
            k = ks[(e * 3 + j) % len(ks)]
            out += [
                (TensorSpec(f"{p}.trellis", "I16", (fin // 16, fout // 16, 16 * k)), 0),
                (TensorSpec(f"{p}.suh", "F16", (fin,)), 0),
                (TensorSpec(f"{p}.svh", "F16", (fout,)), 0),
                (TensorSpec(f"{p}.mcg", "I32", ()), 1),
            ]
    out.append((TensorSpec(f"model.layers.{layer}.mlp.gate.weight", "BF16", (experts, hidden)), 0))
    return out


def build(root: Path, gb: float) -> int:
    """Write shards of ~1 GB until ~gb GB; returns the total file bytes."""
    import numpy as np

    from exl3tool.formats.exl3 import MCG_MARKER
    from exl3tool.io.st_writer import SafetensorsStreamWriter, TensorSpec

    pool = np.random.default_rng(0).integers(0, 256, 64 << 20, dtype=np.uint8).tobytes()
    mcg = np.array(MCG_MARKER, np.int32).tobytes()
    target, total, layer, shard = int(gb * 1e9), 0, 0, 0
    weight_map: dict[str, str] = {}
    pos = 0
    while total < target:
        specs: list = []
        while sum(s.nbytes for s, _ in specs) < min(SHARD_BYTES, target - total):
            specs += _expert_specs(layer, MIX[3])
            layer += 1
        shard += 1
        name = f"model-{shard:05d}.safetensors"
        with open(root / name, "wb") as fh:
            w = SafetensorsStreamWriter(fh, [s for s, _ in specs])
            for s, is_mcg in specs:
                n = s.nbytes
                while n:
                    take = min(n, len(pool) - pos)
                    w.write(mcg if is_mcg else memoryview(pool)[pos : pos + take])
                    if is_mcg:
                        break
                    n -= take
                    pos = (pos + take) % (len(pool) - 7)
            w.close()
        weight_map.update(dict.fromkeys((s.name for s, _ in specs), name))
        total += os.path.getsize(root / name)
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with open(root / "tiny.safetensors", "wb") as fh:
        SafetensorsStreamWriter(fh, [TensorSpec("t", "U8", (8,))]).write(bytes(8))
    (root / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "exl3"}}))
    return total


def tree_peak(cmd: list[str], env: dict[str, str] | None = None) -> int:
    """Peak bytes of one run of a child: its largest process's ru_maxrss, or the sum of Pss
    over it and its descendants sampled every 10 ms (benchmarks/tree_memory.py), if larger."""
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    sampler = PeakPss(p.pid, 0.01).start()
    _, _, usage = os.wait4(p.pid, 0)
    return max(sampler.stop(), usage.ru_maxrss * 1024)


def timed(
    cmd: list[str], repeat: int, env: dict[str, str] | None = None
) -> tuple[float, int, float]:
    """Best wall time, the largest peak RSS (bytes) and the least CPU time (user + system
    seconds: what the load of other processes changes least) of `repeat` runs of a child."""
    best, rss, cpu = float("inf"), 0, float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        _, status, usage = os.wait4(p.pid, 0)
        dt = time.perf_counter() - t
        p.returncode = os.waitstatus_to_exitcode(status)
        err = p.stderr.read().decode() if p.stderr else ""
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}): {err}")
        best, rss = min(best, dt), max(rss, usage.ru_maxrss * 1024)
        cpu = min(cpu, usage.ru_utime + usage.ru_stime)
    return best, rss, cpu


# The least any Python program has to do for per-tensor digests: start, parse each header
# with plain json.loads (no checks, no plan, no layer digests, no output), hash every tensor
# span with `threads` threads (blake3 or sha256) in units of 32 MB whose pages it then drops, so
# that it meets the same peak-RSS target (< 300 MB) as identity. Its ratio to b3sum bounds what
# a Python CLI can reach here.
FLOOR = """
import hashlib, json, mmap, struct, sys, threading
import blake3
algo, threads, files = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
new = blake3.blake3 if algo == "blake3" else hashlib.sha256
units, cur, size, page = [], [], 0, mmap.PAGESIZE
for f in files:
    with open(f, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    n = struct.unpack("<Q", mm[:8])[0]
    base, view = 8 + n, memoryview(mm)
    for k, v in json.loads(mm[8 : 8 + n]).items():
        if k != "__metadata__":
            cur.append((mm, view, base + v["data_offsets"][0], base + v["data_offsets"][1]))
            size += cur[-1][3] - cur[-1][2]
            if size >= 32 << 20:
                units.append(cur)
                cur, size = [], 0
    units.append(cur)
    cur, size = [], 0
it, lock, out = iter(units), threading.Lock(), []
def work():
    while True:
        with lock:
            unit = next(it, None)
        if unit is None:
            return
        for mm, view, a, b in unit:
            out.append(new(view[a:b]).hexdigest())
        if unit:  # drop the unit's pages from this process: peak RSS stays under 300 MB
            lo, hi = unit[0][2] - unit[0][2] % page, unit[-1][3] + (-unit[-1][3] % page)
            mm.madvise(mmap.MADV_DONTNEED, lo, min(hi, len(mm) + (-len(mm) % page)) - lo)
pool = [threading.Thread(target=work) for _ in range(threads)]
for t in pool:
    t.start()
for t in pool:
    t.join()
"""


# The same floor with forked workers instead of threads (no GIL between them, as identity's
# own workers): each of `workers` children parses every header with json.loads and hashes
# every `workers`-th tensor from its own mappings, dropping the pages of each 32 MB it hashed,
# and sends its digests (32 bytes each) back through a pipe; the parent only starts them and
# puts the digests in order. Nothing here is serial but the start, the forks and the pipes.
FLOOR_FORKED = """
import hashlib, json, mmap, os, struct, sys
import blake3
algo, workers, files = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
new = blake3.blake3 if algo == "blake3" else hashlib.sha256
page = mmap.PAGESIZE
def spans():
    for f in files:
        with open(f, "rb") as fh:
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        n = struct.unpack("<Q", mm[:8])[0]
        base = 8 + n
        for k, v in json.loads(mm[8 : 8 + n]).items():
            if k != "__metadata__":
                yield mm, base + v["data_offsets"][0], base + v["data_offsets"][1]
def child(w, fd):
    out, done, views, since = [], 0, {}, {}  # since: mapping -> [first, end) hashed, not dropped
    for i, (mm, a, b) in enumerate(spans()):
        if i % workers != w:
            continue
        view = views.get(id(mm)) or views.setdefault(id(mm), memoryview(mm))
        out.append(new(view[a:b]).digest())
        since.setdefault(id(mm), [mm, a, b])[2] = b
        done += b - a
        if done >= 32 << 20:
            for m, lo, hi in since.values():
                m.madvise(mmap.MADV_DONTNEED, lo - lo % page, hi - (lo - lo % page))
            since.clear()
            done = 0
    data = b"".join(out)
    while data:
        data = data[os.write(fd, data):]
    os._exit(0)
pipes = []
for w in range(workers):
    r, wr = os.pipe()
    if os.fork() == 0:
        os.close(r)
        child(w, wr)
    os.close(wr)
    pipes.append(r)
got = []
for r in pipes:
    chunks = []
    while chunk := os.read(r, 1 << 20):
        chunks.append(chunk)
    got.append(b"".join(chunks))
for _ in pipes:
    os.wait()
size = 32 if algo == "blake3" else hashlib.sha256().digest_size
per = [[d[i : i + size] for i in range(0, len(d), size)] for d in got]
digests = [per[i % workers][i // workers] for i in range(sum(map(len, per)))]
"""


# Per-tensor cost of the engine: one thread hashes every tensor of the shards (hash_tensors),
# then the whole shards (hash_files: one job per file, read the same way); the difference over
# the tensor count is what each tensor costs beyond its bytes (the header bytes hashed by
# hash_files, < 0.1 % here, are left in).
OVERHEAD = """
import os, sys, time
from pathlib import Path
from exl3tool.identity.engine import hash_files, hash_tensors
from exl3tool.io.lease import LeasedMap, LeaseRefused
from exl3tool.io.safetensors import read_header
from exl3tool.rules.registry import Findings
files, repeat = [Path(f) for f in sys.argv[2:]], int(sys.argv[1])
try:
    LeasedMap(files[0]).close()
    how = "read lease taken: blake3 hashes from mappings (hashing ahead: mappings or pread, as measured)"
except LeaseRefused as exc:
    how = f"read lease refused ({exc}): blake3 reads with pread"
if os.environ.get("EXL3TOOL_NO_LEASE"):
    how = "EXL3TOOL_NO_LEASE=1: pread"
sts = [read_header(f, Findings()) for f in files]
items = [(n, st, t) for st in sts for n, t in st.tensors.items()]
def tensors():
    hash_tensors(items, "blake3", threads=1)
def whole():
    hash_files(files, "blake3", threads=1)
best = {}
for _ in range(repeat):
    for name, fn in (("tensors", tensors), ("whole", whole)):
        t = time.perf_counter()
        fn()
        best[name] = min(best.get(name, 1e9), time.perf_counter() - t)
print(how)
print(len(items), best["tensors"], best["whole"])
"""


def overhead(files: list[str], repeat: int, no_lease: bool) -> tuple[str, float, int]:
    """(how the shards are read, engine microseconds per tensor beyond hashing its bytes,
    tensors)."""
    env = dict(os.environ)
    env.pop("EXL3TOOL_NO_LEASE", None)
    if no_lease:
        env["EXL3TOOL_NO_LEASE"] = "1"
    out = subprocess.run(
        [sys.executable, "-c", OVERHEAD, str(repeat), *files],
        check=True, capture_output=True, text=True, env=env,
    ).stdout.splitlines()  # fmt: skip
    n, t_tensors, t_whole = out[-1].split()
    return out[-2], (float(t_tensors) - float(t_whole)) / int(n) * 1e6, int(n)


def hashlib_one_thread(files: list[Path], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        for f in files:
            with open(f, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                h, mv = hashlib.sha256(), memoryview(mm)
                for i in range(0, len(mm), 8 << 20):
                    h.update(mv[i : i + (8 << 20)])
                mv.release()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gb", type=float, default=4.0)
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--mix", choices=sorted(MIXES), default="qwen3", help="tensor-size mix")
    ap.add_argument("--build-only", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument(
        "--keep", type=Path, default=None, help="build into (or reuse) this folder; keep it"
    )
    ap.add_argument("--bytecode", action="store_true", help=HELP)
    ap.add_argument(
        "--no-sha256sum", action="store_true", help="skip sha256sum (one core: minutes at 36 GB)"
    )
    args = ap.parse_args()
    global MIX
    MIX = MIXES[args.mix]
    if args.build_only is not None:
        print(build(args.build_only, args.gb))
        return
    b3sum = shutil.which("b3sum")
    if b3sum is None:
        raise SystemExit("b3sum not found: apt-get install -y b3sum (or cargo install b3sum)")
    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-identity-", dir=args.dir))
    marker, spec = work / ".bench-identity", f"{args.mix} {args.gb}\n"
    try:
        t0 = time.perf_counter()
        if args.keep is not None and marker.exists() and marker.read_text() == spec:
            files = sorted(work.glob("model-*.safetensors"))
            total = sum(f.stat().st_size for f in files)
            print(f"reusing {total / 1e9:.2f} GB in {len(files)} shards of {work}")
        else:
            work.mkdir(parents=True, exist_ok=True)
            for old in work.glob("model-*.safetensors"):
                old.unlink()
            out = subprocess.run(
                [sys.executable, __file__, "--build-only", str(work), "--gb", str(args.gb),
                 "--mix", args.mix],
                check=True, capture_output=True, text=True,
            )  # fmt: skip
            total = int(out.stdout.split()[-1])
            files = sorted(work.glob("model-*.safetensors"))
            marker.write_text(spec)
            took = time.perf_counter() - t0
            print(f"built {total / 1e9:.2f} GB in {len(files)} shards in {took:.0f} s")
        n = args.threads
        exl = [sys.executable, "-m", "exl3tool", "identity", str(work), "--threads", str(n)]
        env_files = [str(f) for f in files]
        subprocess.run([b3sum, *env_files], stdout=subprocess.DEVNULL, check=True)  # warm cache
        os.environ["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
        os.environ["EXL3TOOL_NO_PROGRESS"] = "1"
        if args.bytecode:  # the children inherit it; a warm-up run fills the cache
            use_bytecode(work / ".pycache")
            subprocess.run([*exl[:4], str(work / "tiny.safetensors")], capture_output=True)
        pread_env = {**os.environ, "EXL3TOOL_NO_LEASE": "1"}
        thread_env = {**os.environ, "EXL3TOOL_NO_FORK": "1"}
        late_env = {**os.environ, "EXL3TOOL_NO_EARLY": "1"}
        here_env = {**os.environ, "EXL3TOOL_NO_AHEAD": "1"}
        # the fixed cost of a run (interpreter, imports, headers of a 1-tensor file)
        dt0, _, cpu0 = timed([*exl[:4], str(work / "tiny.safetensors"), "--no-compat"], args.repeat)
        methods: list[tuple[str, list[str], dict[str, str] | None]] = [
            (f"b3sum --num-threads {n}", [b3sum, "--num-threads", str(n), *env_files], None),
            ("identity --algo blake3 --no-compat", [*exl, "--algo", "blake3", "--no-compat"],
             None),
            ("identity --algo blake3 --no-compat, EXL3TOOL_NO_LEASE=1 (pread)",
             [*exl, "--algo", "blake3", "--no-compat"], pread_env),
            ("Python floor: json.loads + threaded per-tensor blake3, no checks, RSS bounded",
             [sys.executable, "-c", FLOOR, "blake3", str(n), *env_files], None),
            ("identity --algo blake3 (+ sha256 compat block)", [*exl, "--algo", "blake3"], None),
            ("sha256sum", ["sha256sum", *env_files] if not args.no_sha256sum else ["true"], None),
            ("identity --algo sha256 (compat reused)", [*exl, "--algo", "sha256"], None),
            ("Python floor: json.loads + threaded per-tensor sha256, no checks, RSS bounded",
             [sys.executable, "-c", FLOOR, "sha256", str(n), *env_files], None),
            ("identity --algo blake3 --no-compat, EXL3TOOL_NO_FORK=1 (threads)",
             [*exl, "--algo", "blake3", "--no-compat"], thread_env),
            ("identity --algo blake3 --no-compat, EXL3TOOL_NO_EARLY=1 (hashing after the headers)",
             [*exl, "--algo", "blake3", "--no-compat"], late_env),
            ("identity --algo sha256, EXL3TOOL_NO_EARLY=1", [*exl, "--algo", "sha256"], late_env),
            ("identity --algo blake3 --no-compat, EXL3TOOL_NO_AHEAD=1 (headers parsed here)",
             [*exl, "--algo", "blake3", "--no-compat"], here_env),
            (f"Python floor, forked: {n} workers, each json.loads every header and hashes "
             "every n-th tensor", [sys.executable, "-c", FLOOR_FORKED, "blake3", str(n),
                                   *env_files], None),
            (f"Python floor, forked, sha256: {n} workers, each json.loads every header and "
             "hashes every n-th tensor", [sys.executable, "-c", FLOOR_FORKED, "sha256", str(n),
                                          *env_files], None),
        ]  # fmt: skip
        # round-robin, best of --repeat rounds: a load that comes and goes hits every method
        best = [(float("inf"), 0, float("inf"))] * len(methods)
        for _ in range(args.repeat):
            for i, (_, cmd, env) in enumerate(methods):
                dt, rss, cpu = timed(cmd, 1, env)
                best[i] = (min(best[i][0], dt), max(best[i][1], rss), min(best[i][2], cpu))
        # one more, untimed run of each identity method for its memory: the largest process
        # (ru_maxrss) or, where it forks workers, the sampled Pss of all of them if larger
        for i, (m, cmd, env) in enumerate(methods):
            if "identity" in m:
                best[i] = (best[i][0], max(best[i][1], tree_peak(cmd, env)), best[i][2])
        rows = [(m[0], total / b[0] / 1e9, b[1]) for m, b in zip(methods, best, strict=True)]
        cpus = [b[2] for b in best]
        b3, ib3, ipr, floor, _, s_sum, is2, floor2, ithr, ilate, is2late, ihere, forked, forked2 = (
            r[1] for r in rows
        )
        one = total / hashlib_one_thread(files, args.repeat) / 1e9
        rows.append(("hashlib.sha256, one thread, 8 MiB mmap updates", one, 0))
        # one shard, two rounds: the cost per tensor, not another full pass per mode
        how, per, ntensors = overhead(env_files[:1], min(args.repeat, 2), no_lease=False)
        _, per_pread, _ = overhead(env_files[:1], min(args.repeat, 2), no_lease=True)
        lines = [
            f"{total / 1e9:.2f} GB, {len(files)} shards, warm page cache, {n} threads, "
            f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, best of "
            f"{args.repeat}, bytecode cache {bytecode_state()}",
            "",
            "| method | GB/s | peak memory MB | CPU s |",
            "|---|---|---|---|",
            *(
                f"| {m} | {g:.2f} | {r / 1e6:.0f} | {c:.2f} |"
                for (m, g, r), c in zip(rows, cpus, strict=False)
            ),
            f"| {rows[-1][0]} | {rows[-1][1]:.2f} | - | - |",
            "",
            f"* {how}",
            f"* blake3 identity / b3sum = {ib3 / b3:.2f} (target >= 0.9; 0.8 for the qwen3 "
            f"mix); read with pread (no lease) = {ipr / b3:.2f}; with threads, not forked "
            f"workers (EXL3TOOL_NO_FORK=1) = {ithr / b3:.2f}; hashing only after the headers "
            f"(EXL3TOOL_NO_EARLY=1) = {ilate / b3:.2f}, sha256 "
            f"{is2late / (n * one):.2f}; every header parsed by this process, none ahead "
            f"(EXL3TOOL_NO_AHEAD=1) = {ihere / b3:.2f}",
            f"* engine cost per tensor beyond its bytes (one thread, the {ntensors} tensors of "
            f"the first shard): {per:.1f} us, with pread {per_pread:.1f} us",
            f"* Python floor / b3sum = {floor / b3:.2f} (the most a Python CLI can reach here; "
            f"identity / floor = {ib3 / floor:.2f})",
            f"* forked Python floor / b3sum = {forked / b3:.2f} (no GIL: the most a Python "
            f"CLI that forks its hashing can reach here; identity / it = {ib3 / forked:.2f})",
            f"* CPU seconds (least of the rounds): b3sum {cpus[0]:.2f}, blake3 identity "
            f"{cpus[1]:.2f} (b3sum / identity = {cpus[0] / cpus[1]:.2f}), Python floor "
            f"{cpus[3]:.2f}; one identity run of the 1-tensor file {cpu0:.3f}",
            f"* load average at the end: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}",
            f"* fixed cost of one identity run (start, imports, headers): {dt0:.2f} s; without it "
            f"blake3 identity / b3sum = {total / (total / ib3 / 1e9 - dt0) / 1e9 / b3:.2f}, "
            f"sha256 identity / ({n} x one-thread hashlib) = "
            f"{total / (total / is2 / 1e9 - dt0) / 1e9 / (n * one):.2f}",
            f"* sha256 identity / ({n} x one-thread hashlib) = {is2 / (n * one):.2f} "
            "(target >= 0.9)",
            f"* sha256 Python floor / ({n} x one-thread hashlib) = {floor2 / (n * one):.2f}; "
            f"sha256 identity / floor = {is2 / floor2:.2f}; forked sha256 Python floor / "
            f"({n} x one-thread hashlib) = {forked2 / (n * one):.2f} (identity / it = "
            f"{is2 / forked2:.2f})",
            f"* sha256 identity / sha256sum = "
            f"{'skipped' if args.no_sha256sum else f'{is2 / s_sum:.2f}'}",
            "* peak memory of identity runs (the largest process's peak RSS or, if larger, the "
            "sampled sum of Pss over it and its forked workers): "
            f"{max(r for m, _, r in rows if 'identity' in m) / 1e6:.0f} MB (target < 300)",
        ]
        text = "\n".join(lines)
        print(text)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
