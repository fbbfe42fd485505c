"""verify-swap at scale, on the CPU: memory bounded by one layer, and a dead rank is one finding.

Both run the real CLI in a fresh process: peak RSS is that process's `ru_maxrss`, and a rank is
killed from outside with SIGKILL, as the OOM killer would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from exl3tool.synth.msrt import build_adapter, build_base

HIDDEN, INTER, EXPERTS = 512, 512, 8
LAYER_FP16 = EXPERTS * 3 * HIDDEN * INTER * 2  # one layer's decoded base weights: 12 MiB


def _artifacts(root: Path, n_layers: int) -> tuple[Path, Path]:
    layers = tuple(range(n_layers))
    base = build_base(
        root / "base", layers=layers, experts=EXPERTS, hidden=HIDDEN, intermediate=INTER, k=2
    )
    cart = build_adapter(root / "cart", base, chain=(("k3", 2),), experts=[[0, 1, 2, 3]], seed=0)
    return base, cart


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ, TMPDIR=str(tmp), EXL3TOOL_NO_PROGRESS="1", **extra)
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    return env


def _peak_rss(base: Path, cart: Path, tmp: Path) -> int:
    cmd = [sys.executable, "-m", "exl3tool", "verify-swap", str(base), str(cart)]
    # glibc's dynamic mmap threshold would keep freed tensors in the heap (RSS then measures
    # the allocator's cache, not live memory): pin it, so a freed tensor returns to the OS
    p = subprocess.Popen(
        [*cmd, "--threads", "1", "-f", "json"],
        env=_env(tmp, MALLOC_MMAP_THRESHOLD_="65536"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _pid, status, usage = os.wait4(p.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, p.stderr.read().decode()[-2000:]
    p.stderr.close()
    return usage.ru_maxrss * 1024


def test_peak_rss_does_not_grow_with_the_layer_count(tmp_path) -> None:
    peaks = {}
    for n in (2, 8):
        root = tmp_path / f"l{n}"
        base, cart = _artifacts(root, n)
        peaks[n] = _peak_rss(base, cart, root)
    # holding every layer would add 6 layers x (hot + cold + stages) >= 24 x LAYER_FP16
    # (288 MiB); a process's peak RSS varies by 20-50 MiB from run to run (allocator, imports)
    growth = peaks[8] - peaks[2]
    assert growth < 8 * LAYER_FP16, (peaks, LAYER_FP16)


def _rank_pids(parent: int) -> list[int]:
    """The spawned rank processes of `parent` (not multiprocessing's resource tracker)."""
    out = []
    try:
        kids = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    except OSError:
        return out
    for pid in kids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmd and b"resource_tracker" not in cmd:
            out.append(int(pid))
    return out


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs /proc (Linux)")
def test_a_killed_rank_is_one_finding_and_leaves_no_temp_files(tmp_path) -> None:
    root = Path(__file__).resolve().parents[2]
    work = tmp_path / "tmp"
    work.mkdir()
    cmd = [sys.executable, "-m", "exl3tool", "verify-swap"]
    cmd += [str(root / "examples/msrt-base-tiny"), str(root / "examples/cartridge-k3k4")]
    # slow staging (test hook of staging) so the ranks are alive when one is killed
    env = _env(work, EXL3TOOL_TEST_STAGE_SLEEP="2")
    p = subprocess.Popen(
        [*cmd, "--tp", "2", "--threads", "1"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    ranks: list[int] = []
    while len(ranks) < 2 and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.2)
        ranks = _rank_pids(p.pid)
    assert len(ranks) == 2, "the two ranks never started"
    os.kill(ranks[1], signal.SIGKILL)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 3, (out, err)
    assert "VS002" in err and "SIGKILL" in err
    assert "Traceback" not in err
    assert [x.name for x in work.iterdir()] == [], "temporary files were left behind"
