"""`exl3tool check` end to end on the bundled examples, and on broken copies, in every format."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest

from .conftest import REPO, run_cli, sarif_errors

REPORT_SCHEMA = json.loads((REPO / "exl3tool/schemas/exl3tool-report-1.schema.json").read_text())
NAMES = ("r7-tiny", "msrt-base-tiny", "cartridge-k3k4")
# The examples' release without verify-swap (the workflow test runs the full one).
CONFIG = """
tp = [2]
[[artifacts]]
name = "r7"
path = "r7-tiny"
tp = []
[[artifacts]]
name = "base"
path = "msrt-base-tiny"
[[artifacts]]
name = "k3k4"
path = "cartridge-k3k4"
base = "base"
"""


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("release")
    for name in NAMES:
        shutil.copytree(REPO / "examples" / name, root / name)
    (root / "exl3tool.toml").write_text(CONFIG)
    return root


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same release with a deleted R7 shard and a flipped byte in a cartridge shard."""
    root = tmp_path_factory.mktemp("broken")
    for name in NAMES:
        shutil.copytree(REPO / "examples" / name, root / name)
    (root / "r7-tiny" / "r7-experts-layer-002.safetensors").unlink()
    shard = sorted((root / "cartridge-k3k4").glob("*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01
    shard.write_bytes(bytes(data))
    (root / "exl3tool.toml").write_text(CONFIG)
    return root


def test_examples_pass_json(release: Path) -> None:
    run = run_cli(["check", "--format", "json"], cwd=release)  # ./exl3tool.toml discovered
    assert run.code == 0, run.stdout
    doc = json.loads(run.stdout)  # stdout holds the JSON and nothing else
    jsonschema.validate(doc, REPORT_SCHEMA)
    assert doc["summary"]["errors"] == 0
    by_name = {a["details"]["name"]: a for a in doc["artifacts"]}
    assert [by_name[n]["kind"] for n in ("r7", "base", "k3k4")] == ["r7", "msrt-base", "cartridge"]
    checks = [c["name"] for c in by_name["k3k4"]["details"]["checks"]]
    assert checks == ["validate --hash", "identity root", "validate --tp 2",
                      "slice-verify --tp 2", "stage --tp 2"]  # fmt: skip
    assert all(len(a["details"]["identity_root"]) == 64 for a in doc["artifacts"])
    assert "note: config: exl3tool.toml" in run.stderr


def test_examples_pass_junit_sarif_and_text(release: Path) -> None:
    junit = run_cli(["check", "--format", "junit"], cwd=release)
    assert junit.code == 0
    suite = ET.fromstring(junit.stdout).find("testsuite")
    assert suite is not None and suite.get("failures") == "0"
    sarif = run_cli(["check", "--format", "sarif"], cwd=release)
    assert sarif.code == 0 and sarif_errors(json.loads(sarif.stdout)) == []
    text = run_cli(["check", "--output", "report.txt"], cwd=release, env={"NO_COLOR": "1"})
    body = (release / "report.txt").read_text()
    assert text.code == 0 and text.stdout == ""
    assert "OK: 0 errors" in body and "exl3tool check: summary" in body
    assert "k3k4: validate --hash ok · identity root ok · validate --tp 2 ok" in body


def test_broken_release_fails_in_every_format(broken: Path) -> None:
    doc = json.loads(run_cli(["check", "--format", "json"], cwd=broken).stdout)
    codes = {f["code"] for f in doc["findings"] if f["severity"] == "error"}
    assert "CK003" in codes  # the deleted R7 shard
    assert any(c.startswith("CA") for c in codes), codes  # the cartridge's shard sha256
    runs = {fmt: run_cli(["check", "--format", fmt], cwd=broken) for fmt in ("sarif", "junit")}
    assert {r.code for r in runs.values()} == {1}
    log = json.loads(runs["sarif"].stdout)
    assert sarif_errors(log) == []
    assert codes <= {r["ruleId"] for r in log["runs"][0]["results"] if r["level"] == "error"}
    suite = ET.fromstring(runs["junit"].stdout).find("testsuite")
    assert suite is not None and int(suite.get("failures", "0")) >= 2
    failures = " ".join(f.text or "" for f in suite.iter("failure"))
    assert all(code in failures for code in codes)
    text = run_cli(["check"], cwd=broken, env={"NO_COLOR": "1"})
    assert text.code == 1 and "FAILED" in text.stdout and "CK003" in text.stdout
    assert "\x1b[" not in text.stdout  # NO_COLOR


def test_strict_fails_on_warnings_only_with_strict(release: Path) -> None:
    # A cartridge without its base: a GT006 warning, no error.
    args = ["check", "cartridge-k3k4", "--format", "json"]
    plain, strict = run_cli(args, cwd=release), run_cli([*args, "--strict"], cwd=release)
    assert "GT006" in {f["code"] for f in json.loads(plain.stdout)["findings"]}
    assert (plain.code, strict.code) == (0, 1)
