"""`exl3tool validate`: formats, exit codes 0/1/2/3, one report over several paths."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

from exl3tool.cli.main import app

runner = CliRunner()


@pytest.fixture(scope="module")
def r7(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from exl3tool.synth.r7 import build_r7

    return build_r7(tmp_path_factory.mktemp("cli") / "r7")


@pytest.fixture()
def broken(r7: Path, tmp_path: Path) -> Path:
    root = shutil.copytree(r7, tmp_path / "broken")
    for name in ("config.json", "quantization_config.json"):
        doc = json.loads((root / name).read_text())
        block = (doc.get("quantization_config") or doc)["r7_routed_experts"]
        block["k_values"] = [True, 4]  # a bool posing as an int
        (root / name).write_text(json.dumps(doc))
    return root


def invoke(*args: str):
    return runner.invoke(app, ["validate", *args])


def test_valid_text_exit_0(r7: Path) -> None:
    res = invoke(str(r7))
    assert res.exit_code == 0, res.output
    assert "OK: 0 errors" in res.output
    assert "Traceback" not in res.output


def test_json_report_follows_schema(r7: Path, broken: Path) -> None:
    res = invoke("--format", "json", str(r7), str(broken))
    assert res.exit_code == 1
    doc = json.loads(res.stdout)
    assert doc["schema"] == "exl3tool-report/1"
    assert [a["kind"] for a in doc["artifacts"]] == ["r7", "r7"]
    bad = [f for f in doc["findings"] if f["code"] == "R7005"]
    assert bad and bad[0]["location"]["pointer"] == "/r7_routed_experts/k_values/0"
    assert bad[0]["location"]["file"].startswith(str(broken))
    assert doc["summary"]["errors"] >= 1
    import jsonschema

    schema = json.loads(
        (Path(__file__).parents[2] / "exl3tool/schemas/exl3tool-report-1.schema.json").read_text()
    )
    jsonschema.validate(doc, schema)


def test_sarif_and_junit(broken: Path) -> None:
    sarif = invoke("--format", "sarif", str(broken))
    assert sarif.exit_code == 1
    assert json.loads(sarif.stdout)["version"] == "2.1.0"
    junit = invoke("--format", "junit", str(broken))
    assert junit.exit_code == 1
    ET.fromstring(junit.stdout)


def test_output_file(broken: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    res = invoke("--format", "json", "--output", str(out), str(broken))
    assert res.exit_code == 1
    assert json.loads(out.read_text())["summary"]["errors"] >= 1


def test_strict_fails_on_warnings(r7: Path, tmp_path: Path) -> None:
    root = shutil.copytree(r7, tmp_path / "warn")
    (root / "MANIFEST.json").unlink()  # R7050 is a warning
    assert invoke(str(root)).exit_code == 0
    assert invoke("--strict", str(root)).exit_code == 1


def test_hash_and_tp(r7: Path) -> None:
    assert invoke("--hash", "--threads", "2", str(r7)).exit_code == 0
    res = invoke("--tp", "3", "--format", "json", str(r7))
    assert res.exit_code == 1
    assert "R7070" in {f["code"] for f in json.loads(res.stdout)["findings"]}


@pytest.mark.parametrize(
    "args", [["--format", "yaml"], ["--tp", "0"], ["--threads", "0"], ["--bogus"], []]
)
def test_usage_errors_exit_2(r7: Path, args: list[str]) -> None:
    res = invoke(*args, *([str(r7)] if args else []))
    assert res.exit_code == 2


def test_unreadable_path_exit_3(r7: Path, tmp_path: Path) -> None:
    res = invoke(str(r7), str(tmp_path / "missing"))
    assert res.exit_code == 3
    assert "no such file" in res.output
    assert "Traceback" not in res.output


def test_unknown_directory_is_a_finding(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    res = invoke("--format", "json", str(tmp_path))
    assert res.exit_code == 1
    assert [f["code"] for f in json.loads(res.stdout)["findings"]] == ["CK012"]


def test_quiet_shows_only_errors(broken: Path) -> None:
    res = invoke("--quiet", str(broken))
    assert res.exit_code == 1
    assert "R7005" in res.output and "R7012" not in res.output


def test_example_validates(tmp_path: Path) -> None:
    example = Path(__file__).parents[2] / "examples" / "r7-tiny"
    res = invoke("--hash", str(example))
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("name", ["config.json", "quantization_config.json", "MANIFEST.sha256"])
def test_a_config_or_manifest_file_stands_for_its_checkpoint(r7: Path, name: str) -> None:
    """pre-commit passes changed file names: they validate the artifact they belong to."""
    r = invoke(str(r7 / name), "--format", "json")
    assert r.exit_code == 0, r.stdout
    (art,) = json.loads(r.stdout)["artifacts"]
    assert art["kind"] == "r7" and art["path"] == str(r7)
