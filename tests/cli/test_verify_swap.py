"""`exl3tool verify-swap` end to end: TP=2 over gloo (spawned ranks), text and JSON, usage errors."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from typer.testing import CliRunner

from exl3tool.cli.main import app
from exl3tool.synth.msrt import build_adapter, build_base

SCHEMA = (
    Path(__file__).resolve().parents[2] / "exl3tool" / "schemas" / "exl3tool-verify-1.schema.json"
)


def run(*args: object) -> tuple[int, str, str]:
    r = CliRunner().invoke(app, [str(a) for a in args])
    return r.exit_code, r.stdout, r.stderr


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("vs")
    base = build_base(root / "base", layers=(3,), experts=3, hidden=128, intermediate=256, k=3)
    a = build_adapter(root / "a", base, chain=(("k4", 4), ("k5", 5)), experts=[[0, 2], [2]])
    return base, a


def test_tp2_gloo_json_passes_every_check(pair) -> None:
    base, a = pair
    code, out, err = run(
        "verify-swap", base, a, "--tp", "2", "--tokens", "4", "--format", "json", "--threads", "1"
    )
    assert code == 0, (out, err)
    doc = json.loads(out)
    jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text())).validate(doc)
    assert doc["tp"] == 2 and doc["layers"] == [3]
    names = {c["name"]: c for c in doc["checks"]}
    for n in ("hot-load-equals-cold", "tp-weights-concatenate", "tp-matches-tp1"):
        assert names[n]["passed"] is True, names[n]
    assert "2 rank(s)" in names["hot-load-equals-cold"]["detail"]
    assert names["tp-matches-tp1"]["rel_l2"] <= 1e-3


def test_text_table(pair) -> None:
    base, a = pair
    code, out, _ = run("verify-swap", base, a, "--layers", "3", "--threads", "1")
    assert code == 0
    assert "hot-load-equals-cold" in out and "PASS" in out and "quality ladder" in out


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["--device", "tpu"], 2),
        (["--format", "sarif"], 2),
        (["--layers", "7"], 2),
        (["--tp", "0"], 2),
    ],
)
def test_usage_errors(pair, args, code) -> None:
    base, a = pair
    assert run("verify-swap", base, a, *args)[0] == code


def test_missing_input_exits_3(pair, tmp_path) -> None:
    base, _ = pair
    assert run("verify-swap", base, tmp_path / "nope")[0] == 3
