"""`exl3tool slice`: dry run, write + verify, refusals, --force, --verify-only, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from exl3tool.actions.slice import parse_size
from exl3tool.cli.main import app
from exl3tool.synth.r7 import build_r7

runner = CliRunner()


@pytest.fixture(scope="module")
def r7(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_r7(tmp_path_factory.mktemp("cli-slice") / "r7", hidden=128, moe_intermediate=256)


def test_dry_run_prints_the_plan_and_writes_nothing(r7: Path, tmp_path: Path) -> None:
    res = runner.invoke(
        app, ["slice", str(r7), "--tp", "2", "--dry-run", "-o", str(tmp_path / "o")]
    )
    assert res.exit_code == 0, res.output
    assert "rank 1:" in res.output and not (tmp_path / "o").exists()
    res = runner.invoke(app, ["slice", str(r7), "--tp", "2", "--dry-run", "--format", "json"])
    doc = json.loads(res.output)
    assert doc["artifacts"][0]["details"]["plan"]["tp"] == 2


def test_write_verify_and_verify_only(r7: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    res = runner.invoke(
        app,
        ["slice", str(r7), "--tp", "2", "-o", str(out), "--verify", "--max-shard-size", "64KiB"],
    )
    assert res.exit_code == 0, res.output
    assert "verified" in res.output
    res = runner.invoke(app, ["slice", "--verify-only", str(out)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["slice", str(r7), "--tp", "2", "-o", str(out)])
    assert res.exit_code == 1 and "--force" in res.output
    part = out / "rank-0" / "model-rank-0-part-0.safetensors"
    data = bytearray(part.read_bytes())
    data[-2] ^= 1
    part.write_bytes(bytes(data))
    res = runner.invoke(app, ["slice", "--verify-only", str(out), "--format", "json"])
    assert res.exit_code == 1
    assert {f["code"] for f in json.loads(res.output)["findings"]} >= {"TP004", "TP006"}


def test_refused_split_exit_1_nothing_written(r7: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    res = runner.invoke(app, ["slice", str(r7), "--tp", "4", "-o", str(out), "--format", "json"])
    assert res.exit_code == 1
    assert {f["code"] for f in json.loads(res.output)["findings"]} == {"TP001"}
    assert not out.exists()


def test_usage_errors(r7: Path) -> None:
    assert runner.invoke(app, ["slice", str(r7), "--tp", "2"]).exit_code == 2
    assert (
        runner.invoke(app, ["slice", str(r7), "--tp", "2", "--mode", "x", "--dry-run"]).exit_code
        == 2
    )
    assert (
        runner.invoke(
            app, ["slice", str(r7), "--tp", "2", "--max-shard-size", "lots", "--dry-run"]
        ).exit_code
        == 2
    )
    assert (
        parse_size("5GiB") == 5 << 30
        and parse_size("500MB") == 500_000_000
        and parse_size("7") == 7
    )
