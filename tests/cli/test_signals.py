"""Ctrl-C and SIGTERM at any moment: one quiet line, exit 130 / 143, no traceback from the
command or its rank processes, no rank left running, no temporary directory left behind.

The signals are sent at observable points (the handlers installed, the ranks started), not
after guessed delays, so the outcome does not depend on the machine's speed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASE, CART = ROOT / "examples/msrt-base-tiny", ROOT / "examples/cartridge-k3k4"


def _children(pid: int) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                stat = (p / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(p.name))
    return out


def _handlers_installed(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            mask = int(line.split()[1], 16)
            return bool(mask & (1 << (signal.SIGINT - 1)) and mask & (1 << (signal.SIGTERM - 1)))
    return False


def _wait_for(cond, proc: subprocess.Popen, limit: float = 120.0) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + limit
    while not cond():
        assert proc.poll() is None, "the command ended before the signal was sent"
        assert time.monotonic() < end, "timed out waiting for the command"
        time.sleep(0.002)


def _start(tmp_path: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "TMPDIR": str(tmp_path), "EXL3TOOL_NO_PROGRESS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "exl3tool", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )


def _swap(tmp_path: Path) -> subprocess.Popen:
    pytest.importorskip("torch")
    return _start(tmp_path, "verify-swap", str(BASE), str(CART), "--tp", "2", "--threads", "1")


def _finish(proc: subprocess.Popen, code: int, line: str, tmp_path: Path) -> None:
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert err.strip() == line  # one line: no KeyboardInterrupt traceback from any process
    assert _children(proc.pid) == []
    assert not any(tmp_path.glob("exl3tool-*")), list(tmp_path.iterdir())


def test_ctrl_c_during_start_up(tmp_path: Path) -> None:
    proc = _swap(tmp_path)
    _wait_for(lambda: _handlers_installed(proc.pid), proc)
    os.killpg(proc.pid, signal.SIGINT)  # while typer and torch are still being imported
    _finish(proc, 130, "exl3tool: interrupted", tmp_path)


def test_ctrl_c_as_the_ranks_start(tmp_path: Path) -> None:
    proc = _swap(tmp_path)
    _wait_for(lambda: len(_children(proc.pid)) >= 2, proc)
    os.killpg(proc.pid, signal.SIGINT)  # the whole group: the parent and both ranks
    _finish(proc, 130, "exl3tool: interrupted", tmp_path)


def test_sigterm_to_the_parent_stops_the_ranks(tmp_path: Path) -> None:
    proc = _swap(tmp_path)
    _wait_for(lambda: len(_children(proc.pid)) >= 2, proc)
    os.kill(proc.pid, signal.SIGTERM)  # the parent only: it must stop its ranks itself
    _finish(proc, 143, "exl3tool: terminated", tmp_path)


def test_sigterm_while_slicing_publishes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "slices"
    proc = _start(tmp_path, "slice", str(BASE), "--tp", "2", "-o", str(out), "--verify")
    _wait_for(lambda: _handlers_installed(proc.pid), proc)
    os.kill(proc.pid, signal.SIGTERM)
    _finish(proc, 143, "exl3tool: terminated", tmp_path)
    assert not out.exists() and not any(p.name.startswith(".slices") for p in tmp_path.iterdir())
