"""The report every command that checks something returns (schemas/exl3tool-report-1)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from exl3tool import __version__
from exl3tool.rules.registry import Finding, Findings, Severity

SCHEMA = "exl3tool-report/1"


@dataclass
class ArtifactRef:
    path: str
    kind: str
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. identity root, checks run, time


@dataclass
class Report:
    artifacts: list[ArtifactRef] = field(default_factory=list)
    findings: Findings = field(default_factory=Findings)
    notes: list[str] = field(default_factory=list)  # human notes (what was inferred/skipped)

    def add_findings(self, items: Findings | list[Finding]) -> None:
        self.findings.extend(items)

    def summary(self) -> dict[str, int]:
        return {
            "errors": self.findings.count(Severity.ERROR),
            "warnings": self.findings.count(Severity.WARNING),
            "infos": self.findings.count(Severity.INFO),
        }

    def exit_code(self, strict: bool = False) -> int:
        s = self.summary()
        return 1 if s["errors"] or (strict and s["warnings"]) else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "tool_version": __version__,
            "artifacts": [
                {"path": a.path, "kind": a.kind, **({"details": a.extra} if a.extra else {})}
                for a in self.artifacts
            ],
            "findings": [f.to_json() for f in self.findings],
            "summary": self.summary(),
            **({"notes": self.notes} if self.notes else {}),
        }
