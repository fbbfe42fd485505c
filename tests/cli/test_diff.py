"""`exl3tool diff A B`: layers, tensors and K values that differ, by identity."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from exl3tool.cli.main import app
from exl3tool.synth.msrt import build_base


def run(*args: object) -> tuple[int, str, str]:
    r = CliRunner().invoke(app, [str(a) for a in args])
    return r.exit_code, r.stdout, r.stderr


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    d = tmp_path_factory.mktemp("d")
    a = build_base(d / "a", layers=(3, 4), experts=2, k=2)
    same = Path(shutil.copytree(a, d / "same"))
    (same / "model-layer-004.safetensors").rename(same / "renamed.safetensors")
    idx = json.loads((same / "model.safetensors.index.json").read_text())
    idx["weight_map"] = {
        n: ("renamed.safetensors" if f == "model-layer-004.safetensors" else f)
        for n, f in idx["weight_map"].items()
    }
    (same / "model.safetensors.index.json").write_text(json.dumps(idx))
    k3 = build_base(d / "k3", layers=(3, 4, 5), experts=2, k=3)
    return a, same, k3


def test_identical(bases: tuple[Path, Path, Path]) -> None:
    a, same, _ = bases
    code, out, _ = run("diff", a, same)
    assert code == 0 and out.startswith("identical")


def test_differ_layers_tensors_and_k(bases: tuple[Path, Path, Path]) -> None:
    a, _, k3 = bases
    code, out, _ = run("diff", a, k3, "--format", "json")
    assert code == 1
    d = json.loads(out)
    assert d["identical"] is False
    assert d["layers"]["changed"] == ["3", "4"] and d["layers"]["only_b"] == ["5"]
    assert d["k"]["model.layers.3.mlp.experts.0.gate_proj"] == {"a": 2, "b": 3}
    assert d["compatibility"]["a"]["k"] == 2 and d["compatibility"]["b"]["k"] == 3
    code, text, _ = run("diff", a, k3)
    assert code == 1 and "K changed" in text and "2 -> 3" in text


def test_record_against_artifact(bases: tuple[Path, Path, Path], tmp_path: Path) -> None:
    a, same, k3 = bases
    rec = tmp_path / "a.json"
    assert run("identity", a, "--algo", "sha256", "-f", "json", "-o", rec)[0] == 0
    assert run("diff", rec, same)[0] == 0
    assert run("diff", rec, k3)[0] == 1
    assert run("diff", rec, same, "--algo", "blake3")[0] == 2


def test_broken_artifacts_are_never_identical(tmp_path: Path) -> None:
    """Two unreadable artifacts hash to the same empty identity; diff must not call that equal."""
    for name in ("x", "y"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"\xff" * 64)
    code, out, err = run("diff", tmp_path / "x", tmp_path / "y")
    assert code == 1
    assert out.startswith("not conclusive") and "ST002" in err
