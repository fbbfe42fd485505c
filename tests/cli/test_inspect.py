"""`exl3tool inspect`: kind, layers, experts, K histogram, bits per weight, tiers, plot."""

from __future__ import annotations

import builtins
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from exl3tool.cli.main import app

runner = CliRunner()


@pytest.fixture(scope="module")
def r7(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from exl3tool.synth.r7 import build_r7

    k_map = {(1, e, p): 4 for e in range(4) for p in ("gate_proj", "up_proj", "down_proj")}
    return build_r7(
        tmp_path_factory.mktemp("inspect") / "r7", k_map=k_map, mtp=False, num_hidden_layers=3
    )


def test_json_facts(r7: Path) -> None:
    res = runner.invoke(app, ["inspect", "--format", "json", str(r7)])
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout)
    assert info["kind"] == "r7"
    assert info["layers"] == [1, 2]
    assert info["experts"] == 4
    assert sum(info["k_histogram"]["gate_proj"].values()) == 8
    assert info["tiers"]["1"] == 1  # layer 1 is uniform K = 4
    assert 3 <= info["routed_bpw"] <= 5
    assert info["bytes"] > 0 and info["file_bytes"] > info["bytes"]


def test_text(r7: Path) -> None:
    res = runner.invoke(app, ["inspect", str(r7)])
    assert res.exit_code == 0
    assert "K histogram" in res.output and "routed bits per weight" in res.output


def test_plot_writes_png(r7: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "k.png"
    res = runner.invoke(app, ["inspect", "--plot", str(out), str(r7)])
    assert res.exit_code == 0, res.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_is_a_usage_error(r7: Path, tmp_path: Path, monkeypatch) -> None:
    real = builtins.__import__

    def no_mpl(name, *args, **kwargs):
        if name.split(".")[0] == "matplotlib":
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_mpl)
    res = runner.invoke(app, ["inspect", "--plot", str(tmp_path / "k.png"), str(r7)])
    assert res.exit_code == 2
    assert "matplotlib" in res.output


def test_missing_path_exit_3(tmp_path: Path) -> None:
    assert runner.invoke(app, ["inspect", str(tmp_path / "nope")]).exit_code == 3


def test_bad_format_exit_2(r7: Path) -> None:
    assert runner.invoke(app, ["inspect", "--format", "sarif", str(r7)]).exit_code == 2
