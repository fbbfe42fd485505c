"""Hostile inputs never give a Python traceback (README: "Findings", exit codes 0/1/2/3).

A seeded mutation fuzzer over the bundled examples: each case copies one artifact, applies one
random mutation (truncated or extended shards, flipped header bytes, hostile JSON values, files
replaced by directories, FIFOs or symlinks, unsafe tensor names, rewritten dtypes and shapes)
and runs every command that reads it. Each run must end in time with exit 0, 1, 2 or 3 and
without "Traceback" in its output. CI runs a small seeded sample; a larger campaign runs by hand:

    python tests/test_hostile_inputs.py --cases 3000 --seed 1
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from exl3tool.cli.main import app

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
ARTIFACTS = {"r7": "r7-tiny", "base": "msrt-base-tiny", "cart": "cartridge-k3k4"}
R7_LINEAR = "model.layers.1.mlp.experts.0.down_proj"
TIMEOUT_S = 30
SLOW_S = 15.0  # a tiny artifact that takes this long is a bug too
CI_SEED, CI_CASES = 20240601, 56

# -- hostile JSON values ---------------------------------------------------------------------

_MARK = "\u0000HOSTILE\u0000"
# Raw JSON texts: some are not JSON at all (NaN, 1e999 overflow, 10^5-deep nesting).
HOSTILE_VALUES = (
    "null",
    "[]",
    "{}",
    "true",
    "false",
    "0",
    "-1",
    "1.5",
    "NaN",
    "-Infinity",
    "1e999",
    str(2**70),
    str(-(2**64)),
    '""',
    '"../../etc/passwd"',
    '"\\u001b[31mred"',
    '"\\ud800"',
    '"' + "x" * 5000 + '"',
    "[" * 100_000 + "]" * 100_000,
    "[" * 500 + "]" * 500,
    '{"a": 1, "a": 2}',
    "[1, 2, 3, 4, 5, 6, 7, 8]",
    '["F16"]',
)
WHOLE_FILE_TEXTS = (b"", b"null", b"[]", b"{}", b"NaN", b"1e999", b"\xff\xfe\x00garbage")


def _leaves(doc: object, path: tuple = ()) -> Iterator[tuple]:
    yield path
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _leaves(v, (*path, i))


def _replace_at(doc: object, path: tuple, value: object) -> object:
    if not path:
        return value
    parent = doc
    for key in path[:-1]:
        parent = parent[key]  # type: ignore[index]
    parent[path[-1]] = value  # type: ignore[index]
    return doc


def hostile_json(doc: object, rng: random.Random) -> tuple[str, str]:
    """`doc` with one node (or a duplicated key) replaced by a hostile raw JSON text."""
    paths = list(_leaves(doc))
    path = rng.choice(paths[1:] or paths)
    if rng.random() < 0.15 and isinstance(doc, dict) and doc:
        key = rng.choice(list(doc))  # a duplicate key holding a different value
        text = json.dumps(doc)
        dup = f"{json.dumps(key)}: {rng.choice(HOSTILE_VALUES)}, "
        return "{" + dup + text[1:], f"duplicate key {key!r}"
    raw = rng.choice(HOSTILE_VALUES)
    if rng.random() < 0.3 and path and isinstance(path[-1], str):  # rename a key instead
        parent = doc
        for key in path[:-1]:
            parent = parent[key]  # type: ignore[index]
        new = rng.choice(("", "../x", "\u001b[2J", path[-1] + "_", "__metadata__"))
        parent[new] = parent.pop(path[-1])  # type: ignore[union-attr]
        return json.dumps(doc), f"key {path!r} renamed to {new!r}"
    text = json.dumps(_replace_at(doc, path, _MARK)).replace(json.dumps(_MARK), raw)
    return text, f"{'/'.join(map(str, path))} = {raw[:20]}"


# -- safetensors headers ---------------------------------------------------------------------


def read_st(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def write_st(path: Path, header_text: str, payload: bytes) -> None:
    blob = header_text.encode("utf-8", "surrogatepass")
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + payload)


_SAME_WIDTH = {"F16": "BF16", "BF16": "I16", "I16": "F16", "F32": "I32", "I32": "F32", "U8": "I8"}
_DTYPE_BYTES = {"F16": 2, "BF16": 2, "I16": 2, "F32": 4, "I32": 4, "U8": 1, "I8": 1, "F64": 8}


def mutate_header(path: Path, rng: random.Random) -> str:
    """Rename a tensor, or change a dtype/shape consistently (bytes still match) or not."""
    header, payload = read_st(path)
    names = [k for k in header if k != "__metadata__"]
    if not names:
        return "empty header"
    name = rng.choice(names)
    entry = header[name]
    op = rng.choice(("rename", "dtype-same", "dtype-other", "reshape", "shape-bad", "leaf"))
    if op == "rename":
        new = rng.choice(("../", "a/../../b.", "\x1b[31m", "\x1b]0;pwn\x07")) + name
        header[new] = header.pop(name)
    elif op == "dtype-same" and entry["dtype"] in _SAME_WIDTH:
        entry["dtype"] = _SAME_WIDTH[entry["dtype"]]
    elif op == "dtype-other":
        entry["dtype"] = rng.choice(("F64", "U8", "F8_E4M3", "BOOL", "Q4", "f16", ""))
    elif op == "reshape":
        n = 1
        for d in entry["shape"]:
            n *= d
        entry["shape"] = rng.choice(([n], [1, n], [n, 1], [] if n == 1 else [n, 1, 1]))
    elif op == "shape-bad":
        entry["shape"] = rng.choice(([0], [2**62, 2**62], [-1], [1.5], [True], [], [10**30]))
    else:
        text, what = hostile_json(header, rng)
        write_st(path, text, payload)
        return f"header of {path.name}: {what}"
    write_st(path, json.dumps(header, ensure_ascii=rng.random() < 0.5), payload)
    return f"header of {path.name}: {op} {name!r}"


# -- mutations -------------------------------------------------------------------------------


def _files(root: Path, suffix: str = "") -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(suffix))


def m_truncate(root: Path, rng: random.Random) -> str:
    path = rng.choice(_files(root, ".safetensors"))
    size = path.stat().st_size
    (n,) = struct.unpack("<Q", path.read_bytes()[:8])
    cut = rng.choice((0, 1, 7, 8, 9, 8 + n - 1, 8 + n, 8 + n + 1, size - 1, rng.randrange(size)))
    with path.open("r+b") as fh:
        fh.truncate(max(0, min(cut, size)))
    return f"truncate {path.name} to {cut}"


def m_extend(root: Path, rng: random.Random) -> str:
    path = rng.choice(_files(root, ".safetensors"))
    extra = rng.choice((1, 7, 8, 4096)) * rng.choice((b"\x00", b"\xff"))
    with path.open("ab") as fh:
        fh.write(extra)
    return f"extend {path.name} by {len(extra)}"


def m_flip_length(root: Path, rng: random.Random) -> str:
    path = rng.choice(_files(root, ".safetensors"))
    raw = bytearray(path.read_bytes())
    i = rng.randrange(8)
    raw[i] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(raw))
    return f"flip header-length byte {i} of {path.name}"


def m_flip_header(root: Path, rng: random.Random) -> str:
    path = rng.choice(_files(root, ".safetensors"))
    raw = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    for _ in range(rng.choice((1, 1, 2, 8))):
        i = 8 + rng.randrange(n)
        raw[i] = rng.randrange(256) if rng.random() < 0.5 else raw[i] ^ (1 << rng.randrange(8))
    path.write_bytes(bytes(raw))
    return f"flip header bytes of {path.name}"


def m_flip_payload(root: Path, rng: random.Random) -> str:
    path = rng.choice(_files(root, ".safetensors"))
    raw = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    for _ in range(16):
        i = rng.randrange(8 + n, len(raw))
        raw[i] = rng.choice((0x00, 0xFF, 0x7C, 0x7E, rng.randrange(256)))  # 0x7C/0x7E: inf/NaN
    path.write_bytes(bytes(raw))
    return f"payload bytes of {path.name}"


def m_header_json(root: Path, rng: random.Random) -> str:
    return mutate_header(rng.choice(_files(root, ".safetensors")), rng)


def m_json_leaf(root: Path, rng: random.Random) -> str:
    path = rng.choice(_files(root, ".json"))
    text, what = hostile_json(json.loads(path.read_text()), rng)
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    return f"{path.name}: {what}"


def m_json_whole(root: Path, rng: random.Random) -> str:
    path = rng.choice(_files(root, ".json"))
    body = rng.choice((*WHOLE_FILE_TEXTS, rng.randbytes(rng.randrange(1, 64))))
    if rng.random() < 0.3:
        body = rng.choice(HOSTILE_VALUES).encode()
    path.write_bytes(body)
    return f"{path.name} := {body[:24]!r}"


def m_manifest(root: Path, rng: random.Random) -> str:
    sums = _files(root, ".sha256")
    if not sums:
        return m_json_leaf(root, rng)
    path = rng.choice(sums)
    lines = path.read_text().splitlines()
    i = rng.randrange(len(lines))
    lines[i] = rng.choice(
        (
            "",
            "zz  " + lines[i][66:],
            lines[i][:64] + "  ../../etc/passwd",
            lines[i][:64] + "  /etc/passwd",
            lines[i][:64] + "  missing.bin",
            lines[i] + "\x1b[31m",
            "0" * 64 + "  " + lines[i][66:],
            lines[i][:64] + " *" + lines[i][66:],
        )
    )
    path.write_text("\n".join(lines) + "\n")
    return f"{path.name} line {i}"


def _any_file(root: Path, rng: random.Random) -> Path:
    return rng.choice(_files(root))


def m_delete(root: Path, rng: random.Random) -> str:
    path = _any_file(root, rng)
    path.unlink()
    return f"delete {path.name}"


def m_to_dir(root: Path, rng: random.Random) -> str:
    path = _any_file(root, rng)
    path.unlink()
    path.mkdir()
    return f"{path.name} is a directory"


def m_fifo(root: Path, rng: random.Random) -> str:
    path = _any_file(root, rng)
    path.unlink()
    os.mkfifo(path)
    return f"{path.name} is a FIFO"


def m_symlink(root: Path, rng: random.Random) -> str:
    path = _any_file(root, rng)
    path.unlink()
    target = rng.choice(("/etc/passwd", path.name, "/dev/zero", "../" + path.name, "missing"))
    path.symlink_to(target)
    return f"{path.name} -> {target}"


def m_extra_file(root: Path, rng: random.Random) -> str:
    name = rng.choice(
        ("x.safetensors", "..safetensors", "\x1b[31m.json", "model-00009.safetensors")
    )
    src = rng.choice(_files(root))
    shutil.copyfile(src, root / name)
    return f"extra {name!r} (copy of {src.name})"


MUTATIONS: dict[str, Callable[[Path, random.Random], str]] = {
    "truncate": m_truncate,
    "extend": m_extend,
    "flip-length": m_flip_length,
    "flip-header": m_flip_header,
    "flip-payload": m_flip_payload,
    "header-json": m_header_json,
    "json-leaf": m_json_leaf,
    "json-whole": m_json_whole,
    "manifest": m_manifest,
    "delete": m_delete,
    "to-dir": m_to_dir,
    "fifo": m_fifo,
    "symlink": m_symlink,
    "extra-file": m_extra_file,
}
# JSON leaves and headers are where most of the logic lives: weight them up.
WEIGHTS = {"json-leaf": 5, "header-json": 4, "flip-header": 2}


# -- commands --------------------------------------------------------------------------------


@dataclass
class Env:
    """Pristine copies and records shared by every case."""

    r7: Path
    base: Path
    cart: Path
    r7_record: Path
    base_slices: Path


def commands(target: str, m: Path, env: Env, out: Path) -> list[list[str]]:
    """Every command that reads the mutated artifact `m` (a copy of `target`)."""
    s = str
    if target == "r7":
        return [
            ["validate", "--hash", s(m)],
            ["inspect", "--format", "json", s(m)],
            ["identity", s(m), "--sha256sum", s(out / "sums")],
            ["identity", s(m), "--check", s(env.r7_record)],
            ["diff", s(env.r7), s(m)],
            ["slice", s(m), "--tp", "1", "-o", s(out / "sl"), "--verify"],
            ["decode", s(m), "--tensor", R7_LINEAR, "-o", s(out / "d.safetensors")],
            ["check", s(m)],
        ]
    if target == "base":
        return [
            ["validate", "--hash", "--tp", "2", s(m)],
            ["validate", "--base", s(m), s(env.cart)],
            ["inspect", s(m)],
            ["identity", s(m), "--format", "json"],
            ["diff", s(m), s(env.base)],
            ["slice", s(m), "--tp", "2", "-o", s(out / "sl"), "--verify"],
            ["slice", "--verify-only", s(env.base_slices), s(m)],
            ["stage-cartridge", s(env.cart), "--base", s(m), "--tp", "2", "-o", s(out / "st")],
            ["verify-swap", s(m), s(env.cart)],
            ["check", s(m)],
        ]
    if target == "cart":
        return [
            ["validate", "--hash", "--tp", "2", "--base", s(env.base), s(m)],
            ["inspect", s(m)],
            ["identity", s(m)],
            ["slice", s(m), "--tp", "2", "-o", s(out / "sl")],
            ["stage-cartridge", s(m), "--base", s(env.base), "--tp", "2", "-o", s(out / "st")],
            ["verify-swap", s(env.base), s(m)],
            ["check", s(m)],
        ]
    if target == "slices":
        return [["slice", "--verify-only", s(m), s(env.base)]]
    if target == "record":
        return [["identity", s(env.r7), "--check", s(m / "r7.identity.json")]]
    raise AssertionError(target)


@contextlib.contextmanager
def deadline(seconds: int) -> Iterator[None]:
    def _alarm(signum: int, frame: object) -> None:
        raise TimeoutError(f"no exit after {seconds} s")

    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def run_cli(argv: list[str]) -> tuple[int, str]:
    """Run one command in process; an escaped exception is returned as exit code -1."""
    try:
        with deadline(TIMEOUT_S):
            res = CliRunner().invoke(app, argv, catch_exceptions=False)
    except BaseException as exc:  # the fuzzer reports, it does not crash
        import traceback

        return -1, "".join(traceback.format_exception(exc))
    return res.exit_code, res.stdout + res.stderr


def problem(rc: int, text: str) -> str | None:
    if rc not in (0, 1, 2, 3):
        return f"exit {rc}"
    if "Traceback" in text:
        return "traceback printed"
    return None


def make_env(tmp: Path) -> Env:
    pristine = tmp / "pristine"
    pristine.mkdir()
    paths = {k: shutil.copytree(EXAMPLES / v, pristine / v) for k, v in ARTIFACTS.items()}
    record = pristine / "r7.identity.json"
    slices = pristine / "base-slices"
    for argv in (
        ["identity", str(paths["r7"]), "--format", "json", "-o", str(record)],
        ["slice", str(paths["base"]), "--tp", "2", "-o", str(slices)],
    ):
        rc, text = run_cli(argv)
        assert rc == 0, text
    return Env(paths["r7"], paths["base"], paths["cart"], record, slices)


@dataclass
class Case:
    index: int
    target: str
    mutation: str

    def prepare(self, env: Env, work: Path, rng: random.Random) -> tuple[Path, str]:
        if self.target == "record":
            m = work / "rec"
            m.mkdir()
            shutil.copyfile(env.r7_record, m / "r7.identity.json")
        elif self.target == "slices":
            m = shutil.copytree(env.base_slices, work / "slices", symlinks=True)
        else:
            m = shutil.copytree(getattr(env, self.target), work / self.target, symlinks=True)
        return m, MUTATIONS[self.mutation](m, rng)


def sample_cases(seed: int, n: int) -> list[Case]:
    rng = random.Random(seed)
    names = list(MUTATIONS)
    weights = [WEIGHTS.get(k, 1) for k in names]
    targets = ("r7", "base", "cart", "r7", "base", "cart", "slices", "record")
    out = []
    for i in range(n):
        target = rng.choice(targets)
        # every mutation once, then weighted at random
        mutation = names[i] if i < len(names) else rng.choices(names, weights)[0]
        # A FIFO named on the command line is read like `cat` would (`--check <(cmd)` works).
        if target == "record" and mutation not in ("json-leaf", "json-whole", "to-dir"):
            mutation = "json-leaf"
        out.append(Case(i, target, mutation))
    return out


def run_case(case: Case, seed: int, env: Env, work: Path) -> list[str]:
    """Mutate, run every reader; return one line per broken contract."""
    rng = random.Random(f"{seed}/{case.index}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    m, what = case.prepare(env, work, rng)
    bad = []
    for argv in commands(case.target, m, env, work / "out"):
        shutil.rmtree(work / "out", ignore_errors=True)
        (work / "out").mkdir()
        t0 = time.monotonic()
        rc, text = run_cli(argv)
        why = problem(rc, text)
        if why is None and time.monotonic() - t0 > SLOW_S:
            why = f"slow: {time.monotonic() - t0:.1f} s"
        if why:
            tail = text.strip().splitlines()[-1:] if text.strip() else [""]
            bad.append(
                f"case {case.index} [{case.target}/{what}] {argv[0]}: {why}: {tail[0][:200]}"
            )
    return bad


# -- CI tests --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Env:
    return make_env(tmp_path_factory.mktemp("hostile"))


def test_seeded_mutations_never_traceback(env: Env, tmp_path: Path) -> None:
    bad: list[str] = []
    for case in sample_cases(CI_SEED, CI_CASES):
        bad += run_case(case, CI_SEED, env, tmp_path / "w")
    assert not bad, "\n".join(bad)


# -- reproducers of bugs the campaign found ---------------------------------------------------


def _grow_header_len(root: Path) -> None:
    """Header length + 4 (bit 2 of byte 0 flipped): the last tensor runs past EOF."""
    path = root / "model-layer-003-b000.safetensors"
    raw = bytearray(path.read_bytes())
    raw[:8] = struct.pack("<Q", struct.unpack("<Q", raw[:8])[0] ^ 4)
    path.write_bytes(bytes(raw))


def _dangling_relative_link(root: Path) -> None:
    path = root / "model-layer-003-b000.safetensors"
    path.unlink()
    path.symlink_to("../" + path.name)


def _router_3d(root: Path) -> None:
    """Layer 4's router [E, hidden] relabelled [E, 2, hidden / 2]: same bytes, wrong rank
    (the seed-77 campaign's one crash: verify-swap transposed it)."""
    path = root / "model-layer-004.safetensors"
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    entry = header["model.layers.4.mlp.gate.weight"]
    e, h = entry["shape"]
    entry["shape"] = [e, 2, h // 2]
    text = json.dumps(header, separators=(",", ":")).encode()
    path.write_bytes(raw[:8] + text.ljust(n) + raw[8 + n :])


def _replace(name: str, how: str) -> Callable[[Path], None]:
    def mutate(root: Path) -> None:
        path = root / name
        path.unlink()
        if how == "dir":
            path.mkdir()
        elif how == "fifo":
            os.mkfifo(path)
        elif how != "delete":
            path.write_text(how)

    return mutate


def _index_value(value: str, key_prefix: str = "") -> Callable[[Path], None]:
    def mutate(root: Path) -> None:
        path = root / "model.safetensors.index.json"
        doc = json.loads(path.read_text())
        wm = doc["weight_map"]
        key = sorted(wm)[0]
        wm[key_prefix + key] = wm.pop(key) if value == "" else value
        path.write_text(json.dumps(doc))

    return mutate


def _shard_fifo(root: Path) -> None:
    path = root / "model-layer-003.safetensors"
    path.unlink()
    os.mkfifo(path)


DEEP = "[" * 100_000 + "]" * 100_000
# (id, artifact, mutation, command, expected exit codes, text that must not appear)
REPRODUCERS = [
    ("payload-past-eof", "cart", _grow_header_len, "validate", {1}, None),
    ("dangling-relative-link", "cart", _dangling_relative_link, "slice", {1}, None),
    (
        "verify-swap-no-manifest",
        "cart",
        _replace("adapter_config.json", "delete"),
        "verify-swap",
        {3},
        None,
    ),
    (
        "verify-swap-manifest-dir",
        "cart",
        _replace("adapter_config.json", "dir"),
        "verify-swap",
        {3},
        None,
    ),
    (
        "verify-swap-manifest-fifo",
        "cart",
        _replace("adapter_config.json", "fifo"),
        "verify-swap",
        {3},
        None,
    ),
    (
        "verify-swap-bad-layers",
        "cart",
        _replace("adapter_config.json", '{"selected_layers": ["3"]}'),
        "verify-swap",
        {3},
        None,
    ),
    (
        "stage-manifest-fifo",
        "cart",
        _replace("adapter_config.json", "fifo"),
        "stage-cartridge",
        {1},
        None,
    ),
    (
        "stage-manifest-null",
        "cart",
        _replace("adapter_config.json", "null"),
        "stage-cartridge",
        {1},
        None,
    ),
    (
        "validate-manifest-null",
        "cart",
        _replace("adapter_config.json", "null"),
        "validate",
        {1},
        None,
    ),
    (
        "stage-manifest-deep",
        "cart",
        _replace("adapter_config.json", DEEP),
        "stage-cartridge",
        {1},
        None,
    ),
    ("index-name-too-long", "r7", _index_value("x" * 5000), "validate", {1}, None),
    ("index-lone-surrogate", "base", _index_value("\ud800"), "validate", {1}, "\ud800"),
    ("index-key-escape", "r7", _index_value("", "\u001b]0;pwn\u0007"), "validate", {1}, "\x1b"),
    ("hash-shard-fifo", "base", _shard_fifo, "validate", {1, 3}, None),
    ("router-3d-validate", "base", _router_3d, "validate", {1}, None),
    ("router-3d-verify-swap", "base", _router_3d, "verify-swap", {3}, None),
]


@pytest.mark.parametrize(
    ("artifact", "mutate", "command", "codes", "absent"),
    [r[1:] for r in REPRODUCERS],
    ids=[r[0] for r in REPRODUCERS],
)
def test_reproducer(
    env: Env,
    tmp_path: Path,
    artifact: str,
    mutate: Callable[[Path], None],
    command: str,
    codes: set[int],
    absent: str | None,
) -> None:
    m = shutil.copytree(getattr(env, artifact), tmp_path / artifact, symlinks=True)
    mutate(m)
    argv = next(a for a in commands(artifact, m, env, tmp_path / "out") if a[0] == command)
    t0 = time.monotonic()
    rc, text = run_cli(argv)
    assert problem(rc, text) is None, text
    assert rc in codes, text
    assert time.monotonic() - t0 < SLOW_S, "hung (a FIFO opened blocking?)"
    if absent is not None:  # printed escaped: a lone surrogate cannot be encoded, ESC drives ttys
        assert absent not in text, ascii(text)


def test_unreadable_shard_ends_in_a_real_process(env: Env, tmp_path: Path) -> None:
    """The same contract through `python -m exl3tool`: a FIFO shard, no traceback, no hang."""
    m = shutil.copytree(env.base, tmp_path / "base")
    _shard_fifo(m)
    for argv in (["validate", "--hash", str(m)], ["identity", str(m)]):
        res = subprocess.run(
            [sys.executable, "-m", "exl3tool", *argv],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        assert res.returncode in (1, 3), res.stderr
        assert "Traceback" not in res.stdout + res.stderr


def test_sample_covers_every_mutation() -> None:
    seen = {c.mutation for c in sample_cases(CI_SEED, CI_CASES)}
    assert seen == set(MUTATIONS), set(MUTATIONS) - seen


# -- main ------------------------------------------------------------------------------------


def campaign(seed: int, n: int) -> int:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        env = make_env(Path(tmp))
        bad: list[str] = []
        for case in sample_cases(seed, n):
            found = run_case(case, seed, env, Path(tmp) / "w")
            for line in found:
                print(line, flush=True)
            bad += found
        print(f"{n} cases, {len(bad)} broken runs")
        return 1 if bad else 0


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    sys.exit(campaign(a.seed, a.cases))
