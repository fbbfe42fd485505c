"""Broken artifacts get no confident answer: `identity` gives no digests (and writes no -o
file), `inspect` exits non-zero, `check` does not call the identity root ok; a missing extra and
an impossible TP size are one line or one finding, never a traceback."""

from __future__ import annotations

import builtins
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from exl3tool.cli.main import app

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BASE, CART = EXAMPLES / "msrt-base-tiny", EXAMPLES / "cartridge-k3k4"
ENV = {"NO_COLOR": "1", "GITHUB_ACTIONS": None}


def run(*args: object):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(app, [str(a) for a in args], env=ENV)


def _empty(d: Path) -> None:
    d.mkdir()


def _random(d: Path) -> None:
    d.mkdir()
    rng = __import__("random").Random(7)
    (d / "model.safetensors").write_bytes(bytes(rng.randrange(256) for _ in range(5000)))
    (d / "config.json").write_bytes(bytes(rng.randrange(256) for _ in range(300)))


def _truncated(d: Path) -> None:
    shutil.copytree(BASE, d)
    shard = d / "model-layer-003.safetensors"
    shard.write_bytes(shard.read_bytes()[:2000])


def _trailing_comma(d: Path) -> None:
    shutil.copytree(BASE, d)
    text = (d / "config.json").read_text().rstrip()
    assert text.endswith("}")
    (d / "config.json").write_text(text[:-1].rstrip() + ",\n}\n")


BROKEN = {"empty": _empty, "random": _random, "truncated": _truncated, "comma": _trailing_comma}


@pytest.fixture(params=sorted(BROKEN))
def broken(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    d = tmp_path / request.param
    BROKEN[request.param](d)
    return d


def test_identity_gives_no_digest_for_a_broken_artifact(broken: Path, tmp_path: Path) -> None:
    out = tmp_path / "id.json"
    res = run("identity", broken, "-o", out)
    assert res.exit_code in (1, 3), res.output
    assert not out.exists()
    assert "root" not in res.stdout and res.stdout == ""
    assert " error " in res.stderr and "no identity" in res.stderr
    text = run("identity", broken)
    assert text.exit_code in (1, 3) and text.stdout == ""


def test_identity_check_refuses_a_broken_artifact(broken: Path, tmp_path: Path) -> None:
    record = tmp_path / "base.json"
    assert run("identity", BASE, "-o", record).exit_code == 0
    res = run("identity", "--check", record, broken, "-f", "json")
    assert res.exit_code in (1, 3)
    if res.exit_code == 1:
        assert json.loads(res.stdout)["summary"]["errors"] >= 1
    assert "identity OK" not in res.output


def test_inspect_exits_non_zero_when_it_cannot_describe(broken: Path) -> None:
    res = run("inspect", broken, "-f", "json")
    assert res.exit_code in (1, 3), res.output
    if res.exit_code == 1:
        doc = json.loads(res.stdout)
        assert doc["summary"]["errors"] >= 1 and "k_histogram" not in res.stdout


def test_check_gives_no_identity_root_for_a_broken_artifact(
    broken: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["check", str(broken)], env={**ENV, "COLUMNS": "200"})
    assert res.exit_code == 1
    assert "identity root ok" not in res.stdout
    j = CliRunner().invoke(app, ["check", str(broken), "-f", "json"], env=ENV)
    (art,) = json.loads(j.stdout)["artifacts"]
    assert art["details"]["identity_root"] is None


def test_a_sound_artifact_still_gets_its_identity_and_description(tmp_path: Path) -> None:
    res = run("identity", BASE, "-o", tmp_path / "id.json")
    assert res.exit_code == 0 and json.loads((tmp_path / "id.json").read_text())["root"]
    assert run("inspect", BASE).exit_code == 0
    check = CliRunner().invoke(app, ["check", str(BASE)], env={**ENV, "COLUMNS": "200"})
    assert "identity root ok" in check.stdout


def _without(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    real = builtins.__import__

    def blocked(name, *args, **kwargs):  # type: ignore[no-untyped-def]
        if name.split(".")[0] == module:
            raise ImportError(f"No module named {module!r}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", blocked)


@pytest.mark.parametrize(
    "args",
    [
        ["verify-swap", BASE, CART],
        ["decode", BASE, "--tensor", "model.layers.3.mlp.experts.0.up_proj", "-o", "OUT"],
    ],
)
def test_a_missing_torch_names_the_extra(args: list, tmp_path: Path, monkeypatch) -> None:
    _without(monkeypatch, "torch")
    res = run(*[tmp_path / "w.safetensors" if a == "OUT" else a for a in args])
    assert res.exit_code == 2, res.output
    assert res.stderr.strip().count("\n") == 0  # one line
    assert "pip install 'exl3tool[runtime]'" in res.stderr and "Traceback" not in res.output


def test_verify_swap_refuses_an_indivisible_tp_before_any_rank(monkeypatch) -> None:
    pytest.importorskip("torch")
    import exl3tool.runtime.verify as verify

    def never(*_a, **_k):  # type: ignore[no-untyped-def]
        raise AssertionError("a rank was started for an impossible TP size")

    monkeypatch.setattr(verify, "run_verify", never)
    res = run("verify-swap", BASE, CART, "--tp", "3", "-f", "json")
    assert res.exit_code == 1, res.output
    doc = json.loads(res.stdout)
    codes = {f["code"] for f in doc["findings"]}
    # what validate --tp 3 says of the base (TP001: 256 channels over 3 ranks) and the cartridge
    want = {
        f["code"]
        for args in ((BASE,), (CART, "--base", BASE))
        for f in json.loads(run("validate", *args, "--tp", "3", "-f", "json").stdout)["findings"]
    }
    assert codes == want and {"TP001", "CA076"} <= codes
    assert "SplitError" not in res.output and "Traceback" not in res.output


def test_a_split_error_survives_the_trip_from_a_rank() -> None:
    import pickle

    from exl3tool.rules import tp as tp_rules
    from exl3tool.tp.ranges import SplitError

    err = pickle.loads(pickle.dumps(SplitError(tp_rules.TP_CUTS_HADAMARD, "256 / 3")))
    assert isinstance(err, SplitError) and str(err) == "256 / 3"
    assert err.rule.code == tp_rules.TP_CUTS_HADAMARD.code
