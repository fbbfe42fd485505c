"""`make demo` runs examples/demo.sh: keep it working (it is the README's first command)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_demo_script_runs_every_step(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable, "NO_COLOR": "1", "DEMO_OUT": str(tmp_path)}
    r = subprocess.run(
        ["bash", str(ROOT / "examples" / "demo.sh")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    assert "R7005" in out and "exit status 1" in out  # the injected defect is caught
    assert "staged examples/cartridge-k3k4" in out
    assert out.rstrip().endswith("all checks passed")
