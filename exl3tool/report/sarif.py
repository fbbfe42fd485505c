"""SARIF 2.1.0 rendering of a `Report`, in the subset GitHub code scanning ingests.

Every registered rule becomes a `reportingDescriptor`; each finding becomes a `result` whose
physical location is the file relative to its artifact (`uriBaseId` ARTIFACTn, resolved in
`run.originalUriBaseIds`) and whose logical locations name the tensor and/or JSON pointer.
`partialFingerprints` hash what identifies the defect (rule, file, tensor, pointer), not the
message, so an alert survives reruns whose messages carry different numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from exl3tool import __version__
from exl3tool.report.model import ArtifactRef, Report
from exl3tool.rules.registry import Finding, Rule, Severity, all_rules, family_of

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
FINGERPRINT_KEY = "exl3toolFinding/v1"
_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}


@dataclass(frozen=True)
class Place:
    """Where a finding's file lives: artifact index (None when unknown) and path inside it."""

    artifact: int | None
    rel: str  # posix path relative to the artifact root; "" is the artifact itself


def _norm(path: str) -> str:
    return path.replace("\\", "/").rstrip("/") if path not in ("/", "") else path


def locate(report: Report, finding: Finding) -> Place:
    """Attribute a finding's file to one of the report's artifacts.

    Labels are either prefixed with the artifact path or relative to the artifact root
    (io.safetensors labels); with a single artifact the latter is unambiguous.
    """
    file = finding.location.file
    paths = [_norm(a.path) for a in report.artifacts]
    if file is None:
        return Place(0, "") if len(paths) == 1 else Place(None, "")
    f = _norm(file)
    best: tuple[int, int] | None = None  # (prefix length, index): the longest prefix wins
    for i, p in enumerate(paths):
        if f == p:
            return Place(i, "")
        if p and f.startswith(p + "/") and (best is None or len(p) > best[0]):
            best = (len(p), i)
    if best is not None:
        return Place(best[1], f[best[0] + 1 :])
    if len(paths) == 1 and not Path(f).is_absolute():
        return Place(0, f)
    return Place(None, f)


def full_path(report: Report, place: Place) -> str:
    """The file path as the user sees it (artifact path joined with the relative path)."""
    if place.artifact is None:
        return place.rel
    base = _norm(report.artifacts[place.artifact].path)
    return f"{base}/{place.rel}" if place.rel else base


def _uri(path: str) -> str:
    return quote(path, safe="/")


def _base_uri(a: ArtifactRef) -> dict[str, str]:
    p = Path(a.path)
    if p.is_absolute():
        return {"uri": p.as_uri().rstrip("/") + "/"}
    rel = _norm(a.path)
    return {"uri": "" if rel in ("", ".") else _uri(rel) + "/", "uriBaseId": "%SRCROOT%"}


def _descriptor(r: Rule) -> dict[str, Any]:
    return {
        "id": r.code,
        "name": r.name,
        "shortDescription": {"text": r.title},
        "fullDescription": {"text": r.why},
        "help": {"text": r.hint},
        "defaultConfiguration": {"level": _LEVEL[r.severity]},
        "properties": {"tags": [family_of(r.code), r.family_title]},
    }


def fingerprint(place: Place, finding: Finding) -> str:
    import hashlib  # OpenSSL's start-up (~3 ms), not paid by GitHub annotations (full_path)

    loc = finding.location
    key = "\x1f".join(
        (finding.code, str(place.artifact), place.rel, loc.tensor or "", loc.pointer or "")
    )
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _result(report: Report, f: Finding, index: dict[str, int]) -> dict[str, Any]:
    place = locate(report, f)
    artifact_location: dict[str, Any] = {"uri": _uri(place.rel)}
    if place.artifact is not None:
        artifact_location["uriBaseId"] = f"ARTIFACT{place.artifact}"
    location: dict[str, Any] = {"physicalLocation": {"artifactLocation": artifact_location}}
    logical = []
    if f.location.tensor:
        logical.append({"name": f.location.tensor, "kind": "member"})
    if f.location.pointer is not None and (f.location.pointer or not f.location.tensor):
        logical.append(
            {"name": f.location.pointer or "/", "fullyQualifiedName": f.location.pointer or "",
             "kind": "property"}
        )  # fmt: skip
    if logical:
        location["logicalLocations"] = logical
    return {
        "ruleId": f.code,
        "ruleIndex": index[f.code],
        "level": _LEVEL[f.level],
        "message": {"text": f.message},
        "locations": [location],
        "partialFingerprints": {FINGERPRINT_KEY: fingerprint(place, f)},
    }


def to_sarif(report: Report) -> dict[str, Any]:
    """The report as one SARIF 2.1.0 log with one run."""
    rules = {r.code: r for r in all_rules()}
    for f in report.findings:  # a rule declared outside RULE_MODULES still gets a descriptor
        rules.setdefault(f.code, f.rule)
    ordered = sorted(rules.values(), key=lambda r: r.code)
    index = {r.code: i for i, r in enumerate(ordered)}
    run: dict[str, Any] = {
        "tool": {
            "driver": {
                "name": "exl3tool",
                "version": __version__,
                "semanticVersion": __version__,
                "rules": [_descriptor(r) for r in ordered],
            }
        },
        "originalUriBaseIds": {
            f"ARTIFACT{i}": _base_uri(a) for i, a in enumerate(report.artifacts)
        },
        "results": [_result(report, f, index) for f in report.findings],
        "invocations": [{"executionSuccessful": True}],
        "columnKind": "unicodeCodePoints",
    }
    if report.artifacts:
        run["properties"] = {
            "artifacts": [{"path": a.path, "kind": a.kind} for a in report.artifacts]
        }
    if report.notes:
        run["invocations"][0]["toolExecutionNotifications"] = [
            {"message": {"text": n}, "level": "note"} for n in report.notes
        ]
    if not run["originalUriBaseIds"]:
        del run["originalUriBaseIds"]
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}
