"""Issue 15: SIGKILL at seeded random moments of `slice` and `stage-cartridge` runs that replace
an existing output with `--force`. After every kill: OUT is the complete old output (the same
bytes a finished run writes, since the inputs are the same), nothing partial is visible (only
hidden `.OUT.*` siblings), and the inputs are unchanged. A run after the kills publishes."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from exl3tool.synth.msrt import build_adapter, build_base

ROOT = Path(__file__).resolve().parents[2]
KILLS = 6  # per command: each costs one interpreter start-up


def tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(p.relative_to(root).as_posix().encode() + b"\0")
        if p.is_file():
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def _cmd(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "exl3tool", *args]


def _env() -> dict[str, str]:
    # a slow copy (seconds per shard chunk) keeps stage-cartridge busy between start and end
    return {**os.environ, "PYTHONPATH": str(ROOT), "EXL3TOOL_TEST_STAGE_SLEEP": "0.02"}


def _run(args: list[str]) -> float:
    t0 = time.monotonic()
    subprocess.run(_cmd(args), env=_env(), check=True, capture_output=True, timeout=120)
    return time.monotonic() - t0


def _kill_trials(args: list[str], out: Path, inputs: list[Path], seed: int) -> None:
    took = _run(args)  # the old output, and how long one run takes
    old = tree_digest(out)
    before = [tree_digest(p) for p in inputs]
    rng = random.Random(seed)
    for _ in range(KILLS):
        proc = subprocess.Popen(
            _cmd([*args, "--force"]), env=_env(),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(rng.uniform(0.0, took * 1.1))
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        assert out.is_dir() and tree_digest(out) == old
        visible = [p.name for p in out.parent.iterdir() if not p.name.startswith(".")]
        assert out.name in visible
        assert [tree_digest(p) for p in inputs] == before
    for p in out.parent.iterdir():  # the next run comes later than io.atomic.FRESH_S
        if p.name.startswith(f".{out.name}."):
            os.utime(p, (1e9, 1e9))
    _run([*args, "--force"])
    assert tree_digest(out) == old
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")] == []


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("kill")
    base = build_base(root / "base")
    return base, build_adapter(root / "cart", base)


def test_kill_slice_of_a_cartridge(pair: tuple[Path, Path], tmp_path: Path) -> None:
    _base, cart = pair
    out = tmp_path / "outs" / "sliced"
    out.parent.mkdir()
    _kill_trials(["slice", str(cart), "--tp", "2", "-o", str(out)], out, [cart], seed=15)


def test_kill_stage_cartridge(pair: tuple[Path, Path], tmp_path: Path) -> None:
    base, cart = pair
    out = tmp_path / "outs" / "staged"
    out.parent.mkdir()
    args = ["stage-cartridge", str(cart), "--base", str(base), "-o", str(out), "--tp", "2"]
    _kill_trials(args, out, [cart, base], seed=16)
