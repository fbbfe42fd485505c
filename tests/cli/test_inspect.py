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


CART = Path(__file__).resolve().parents[2] / "examples" / "cartridge-k3k4"


def test_a_cartridge_is_described(tmp_path: Path) -> None:
    res = runner.invoke(app, ["inspect", "--format", "json", str(CART)])
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout)
    manifest = json.loads((CART / "adapter_config.json").read_text())
    assert info["kind"] == "cartridge" and info["schema"] == "fq-cartridge-adapter/3"
    assert info["shards"] == len(manifest["shards"]) and info["layers"] == [3, 4]
    assert info["base"]["k"] == manifest["base"]["k"]
    assert info["base"]["compatibility_sha256"] == manifest["base"]["compatibility_sha256"]
    assert [(s["label"], s["parent"], s["experts"]) for s in info["chain"]] == [
        (c["label"], c["parent"], len(c["experts"])) for c in manifest["chain"]
    ]
    assert info["bytes"] > 0 and info["file_bytes"] > info["bytes"]
    text = runner.invoke(app, ["inspect", str(CART)])
    assert text.exit_code == 0 and "stage k3" in text.stdout and "world size 1" in text.stdout


def test_a_cartridge_s_strings_reach_the_terminal_escaped(tmp_path: Path) -> None:
    import shutil

    cart = tmp_path / "c"
    shutil.copytree(CART, cart)
    manifest = json.loads((cart / "adapter_config.json").read_text())
    manifest["chain"][0]["label"] = "k3\x1b[31mRED\x07" + "x" * 500
    (cart / "adapter_config.json").write_text(json.dumps(manifest))
    res = runner.invoke(app, ["inspect", str(cart)])
    assert res.exit_code == 0, res.output
    assert "\x1b" not in res.stdout and "\x07" not in res.stdout
    assert "\\x1b[31mRED\\x07" in res.stdout.replace("\n", "").replace("│", "")
    assert "x" * 300 not in res.stdout.replace("\n", "")  # a long value is cut


@pytest.mark.parametrize("chain", [5, True, {"k3": 1}, None])
def test_a_cartridge_whose_chain_is_not_a_list_is_described_without_it(
    tmp_path: Path, chain: object
) -> None:
    import shutil

    cart = tmp_path / "c"
    shutil.copytree(CART, cart)
    manifest = json.loads((cart / "adapter_config.json").read_text())
    manifest["chain"] = chain
    manifest["base"]["compatibility_sha256"] = None
    (cart / "adapter_config.json").write_text(json.dumps(manifest))
    res = runner.invoke(app, ["inspect", str(cart)])
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    assert "identity None" in res.stdout and "None…" not in res.stdout
    res = runner.invoke(app, ["inspect", "--format", "json", str(cart)])
    assert json.loads(res.stdout)["chain"] == []


def test_a_broken_cartridge_gets_findings_and_no_plot(tmp_path: Path) -> None:
    import shutil

    cart = tmp_path / "c"
    shutil.copytree(CART, cart)
    res = runner.invoke(app, ["inspect", str(cart), "--plot", str(tmp_path / "k.png")])
    assert res.exit_code == 2 and not (tmp_path / "k.png").exists()
    assert "a cartridge has none" in res.output
    (cart / "adapter_config.json").write_text('{"schema": ')
    res = runner.invoke(app, ["inspect", "--format", "json", str(cart)])
    assert res.exit_code == 1, res.output
    assert json.loads(res.stdout)["summary"]["errors"] >= 1
