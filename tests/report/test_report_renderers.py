"""SARIF, JUnit, GitHub annotations and JSON renderings of a report, checked against schemas."""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest

from exl3tool.report import github, render
from exl3tool.report.junit import to_junit
from exl3tool.report.model import ArtifactRef, Report
from exl3tool.report.sarif import FINGERPRINT_KEY, locate, to_sarif
from exl3tool.rules import io as rules
from exl3tool.rules.registry import Findings, all_rules
from exl3tool.rules.registry import family_of as rule_family

ROOT = Path(__file__).resolve().parents[2]
SARIF_SCHEMA = json.loads((ROOT / "exl3tool/schemas/sarif-2.1.0-subset.schema.json").read_text())
REPORT_SCHEMA = json.loads((ROOT / "exl3tool/schemas/exl3tool-report-1.schema.json").read_text())


def _report(artifacts: tuple[str, ...] = ("models/m",)) -> Report:
    fs = Findings()
    fs.add(rules.ST_SIZE, "I16[2] needs 4 bytes", file="model.safetensors", tensor="w.trellis",
           pointer="/w.trellis/data_offsets")  # fmt: skip
    fs.add(rules.ST_EXTRA_FIELD, "unknown fields ['x']", file="model.safetensors", tensor="a,b:c")
    fs.add(rules.ST_ALIGN, "data starts at byte 13", file=f"{artifacts[0]}/sub/x.safetensors")
    fs.add(rules.JS_DUPLICATE, "duplicate key 'a'", file="config.json", pointer="/a~1b")
    fs.add(rules.PA_MISSING, "a referenced file is absent")
    fs.add(rules.ST_NAME, "tensor name 'a\\x1bb' is unsafe\x1b%\nnext", file="m.safetensors")
    return Report([ArtifactRef(a, "exl3") for a in artifacts], fs, notes=["inferred kind"])


def test_sarif_validates_against_the_sarif_schema() -> None:
    for arts in (("models/m",), ("/abs/one", "two"), (".",)):
        log = to_sarif(_report(arts))
        jsonschema.Draft202012Validator(SARIF_SCHEMA).validate(log)
        json.dumps(log)  # serialisable


@pytest.mark.parametrize(
    "mutate",
    [
        lambda log: log.pop("version"),
        lambda log: log["runs"][0]["results"][0].pop("message"),
        lambda log: log["runs"][0]["results"][0].__setitem__("level", "fatal"),
        lambda log: log["runs"][0]["tool"]["driver"].__setitem__("rule", []),
    ],
    ids=["no-version", "no-message", "bad-level", "unknown-property"],
)
def test_the_sarif_schema_rejects_broken_logs(mutate) -> None:  # type: ignore[no-untyped-def]
    log = to_sarif(_report())
    mutate(log)
    assert list(jsonschema.Draft202012Validator(SARIF_SCHEMA).iter_errors(log))


def test_sarif_content() -> None:
    log = to_sarif(_report())
    run = log["runs"][0]
    assert log["version"] == "2.1.0"
    driver = run["tool"]["driver"]
    ids = [r["id"] for r in driver["rules"]]
    assert ids == sorted(ids)
    assert {r.code for r in all_rules()} <= set(ids)
    res = run["results"]
    assert len(res) == 6
    first = res[0]
    assert first["ruleId"] == "ST013"
    assert driver["rules"][first["ruleIndex"]]["id"] == "ST013"
    assert first["level"] == "error"
    loc = first["locations"][0]
    assert loc["physicalLocation"]["artifactLocation"] == {
        "uri": "model.safetensors",
        "uriBaseId": "ARTIFACT0",
    }
    assert {ll["name"] for ll in loc["logicalLocations"]} == {
        "w.trellis",
        "/w.trellis/data_offsets",
    }
    assert run["originalUriBaseIds"]["ARTIFACT0"] == {"uri": "models/m/", "uriBaseId": "%SRCROOT%"}
    # a label already prefixed with the artifact path is made relative to it
    assert res[2]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == (
        "sub/x.safetensors"
    )
    assert res[2]["level"] == "note"
    assert res[1]["level"] == "warning"
    fps = [r["partialFingerprints"][FINGERPRINT_KEY] for r in res]
    assert len(set(fps)) == len(fps)
    # fingerprints ignore the message (stable across reruns with other numbers)
    other = _report()
    other.findings._items[0] = other.findings._items[0].__class__(
        rules.ST_SIZE, "different numbers", other.findings._items[0].location
    )
    assert (
        to_sarif(other)["runs"][0]["results"][0]["partialFingerprints"]
        == (res[0]["partialFingerprints"])
    )


def test_sarif_multiple_artifacts_longest_prefix() -> None:
    rep = Report([ArtifactRef("a", "exl3"), ArtifactRef("a/b", "cartridge")])
    rep.findings.add(rules.ST_EMPTY, "x", file="a/b/c.safetensors")
    rep.findings.add(rules.ST_EMPTY, "x", file="a/c.safetensors")
    rep.findings.add(rules.ST_EMPTY, "x", file="elsewhere.json")
    places = [locate(rep, f) for f in rep.findings]
    assert [(p.artifact, p.rel) for p in places] == [
        (1, "c.safetensors"),
        (0, "c.safetensors"),
        (None, "elsewhere.json"),
    ]
    jsonschema.Draft202012Validator(SARIF_SCHEMA).validate(to_sarif(rep))
    assert to_sarif(rep)["runs"][0]["originalUriBaseIds"]["ARTIFACT1"]["uri"] == "a/b/"


def test_json_output_matches_report_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(REPORT_SCHEMA)
    validator = jsonschema.Draft202012Validator(REPORT_SCHEMA)
    doc = json.loads(render.render_string(_report(), "json"))
    validator.validate(doc)
    rep = _report()
    rep.artifacts[0].extra["identity_root"] = "abc"
    validator.validate(rep.to_json())
    validator.validate(Report().to_json())
    bad = dict(doc, summary={"errors": -1, "warnings": 0, "infos": 0})
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(bad)
    bad = json.loads(json.dumps(doc))
    bad["findings"][0]["severity"] = "fatal"
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(bad)


def test_junit_structure() -> None:
    xml = to_junit(_report())
    root = ET.fromstring(xml.encode())
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    cases = suite.findall("testcase")
    families = {rule_family(r.code) for r in all_rules()}
    assert {c.get("name") for c in cases} == families
    assert int(suite.get("tests")) == len(cases)
    by = {c.get("name"): c for c in cases}
    fail = by["ST"].find("failure")
    assert fail is not None and "ST013" in fail.text and "ST017" in fail.text
    assert "ST009" not in fail.text and "ST009" in by["ST"].find("system-out").text
    assert by["JS"].find("failure") is not None
    assert int(suite.get("failures")) == sum(1 for c in cases if c.find("failure") is not None)
    # strict: warnings fail too
    rep = Report([ArtifactRef("m", "exl3")])
    rep.findings.add(rules.ST_EXTRA_FIELD, "w", file="m/x")
    assert ET.fromstring(to_junit(rep)).find(".//failure") is None
    assert ET.fromstring(to_junit(rep, strict=True)).find(".//failure") is not None


def test_rule_family() -> None:
    assert rule_family("ST001") == "ST"
    assert rule_family("R7030") == "R7"
    assert rule_family("CK010") == "CK"


def test_github_annotations() -> None:
    lines = github.annotations(_report())
    assert lines[0].startswith("::error file=models/m/model.safetensors,title=ST013::")
    assert lines[1].startswith("::warning file=models/m/model.safetensors,title=ST009::")
    assert "a%2Cb%3Ac" not in lines[1].split("::", 2)[1]  # tensor goes to the message, not props
    assert lines[2].startswith("::notice file=models/m/sub/x.safetensors,title=ST020::")
    assert all("\n" not in line and "\r" not in line for line in lines)
    assert "%25%0Anext" in lines[5]


def test_emit_prints_annotations_only_in_github_actions(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    render.emit(_report(), "json")
    out, err = capsys.readouterr()
    json.loads(out)  # stdout stays pure JSON
    assert err.count("::error ") == 4 and "title=ST013" in err
    monkeypatch.setenv("GITHUB_ACTIONS", "false")
    render.emit(_report(), "json")
    out, err = capsys.readouterr()
    assert err == ""


def test_print_annotations_stream() -> None:
    buf = io.StringIO()
    github.print_annotations(_report(), buf)
    assert buf.getvalue().count("\n") == 6


def test_quiet_annotates_errors_only(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--quiet shows only errors and the verdict: in GitHub Actions, its annotations too."""
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    render.emit(_report(), "json", quiet=True)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 4 and all(line.startswith("::error ") for line in err)
