"""`exl3tool stage-cartridge` end to end, including a process killed mid-copy."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from exl3tool.cli.main import app
from exl3tool.synth.msrt import build_adapter, build_base

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def art(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cli")
    base = build_base(root / "base", hidden=128, intermediate=256)
    return {"base": base, "full": build_adapter(root / "full", base)}


def test_stage_tp2_then_validate(art, tmp_path):
    out = tmp_path / "staged"
    r = CliRunner().invoke(
        app,
        [
            "stage-cartridge",
            str(art["full"]),
            "--base",
            str(art["base"]),
            "--tp",
            "2",
            "-o",
            str(out),
            "--format",
            "json",
        ],
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["staging"]["layout"] == "rank-sharded" and doc["staging"]["tp_size"] == 2
    r = CliRunner().invoke(
        app,
        [
            "validate",
            str(out),
            "--base",
            str(art["base"]),
            "--tp",
            "2",
            "--hash",
            "--format",
            "json",
        ],
    )
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(
        app, ["stage-cartridge", str(art["full"]), "--base", str(art["base"]), "-o", str(out)]
    )
    assert r.exit_code == 1 and "--force" in r.output


def test_refused_adapter_reports_findings(art, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(art["full"], src)
    m = json.loads((src / "adapter_config.json").read_text())
    m["codebook"] = "3inst"
    (src / "adapter_config.json").write_text(json.dumps(m))
    r = CliRunner().invoke(
        app,
        [
            "stage-cartridge",
            str(src),
            "--base",
            str(art["base"]),
            "-o",
            str(tmp_path / "o"),
            "-f",
            "json",
        ],
    )
    assert r.exit_code == 1
    assert "CA012" in {f["code"] for f in json.loads(r.stdout)["findings"]}
    assert not (tmp_path / "o").exists()


def test_usage_errors(art, tmp_path):
    r = CliRunner().invoke(
        app,
        [
            "stage-cartridge",
            str(art["full"]),
            "--base",
            str(art["base"]),
            "-o",
            str(tmp_path / "o"),
            "--tp",
            "0",
        ],
    )
    assert r.exit_code == 2


def test_killed_mid_copy_leaves_no_out(art, tmp_path):
    """SIGKILL while copying: OUT never appears; only a hidden temp sibling may remain, and the
    next run removes it."""
    out = tmp_path / "out"
    env = {**os.environ, "EXL3TOOL_TEST_STAGE_SLEEP": "30", "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable,
        "-m",
        "exl3tool",
        "stage-cartridge",
        str(art["full"]),
        "--base",
        str(art["base"]),
        "-o",
        str(out),
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            tmps = [p for p in tmp_path.iterdir() if p.name.startswith(".out.tmp-")]
            if tmps and any(f.stat().st_size for f in tmps[0].rglob("*.safetensors")):
                break
            time.sleep(0.05)
        else:
            pytest.fail("the copy never started")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not out.exists()
    assert all(p.name.startswith(".out.") for p in tmp_path.iterdir())
    for p in tmp_path.iterdir():  # the next run comes later than io.atomic.FRESH_S
        os.utime(p, (1e9, 1e9))
    r = CliRunner().invoke(
        app, ["stage-cartridge", str(art["full"]), "--base", str(art["base"]), "-o", str(out)]
    )
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
