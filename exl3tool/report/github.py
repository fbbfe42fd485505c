"""GitHub Actions workflow commands (`::error file=…,title=CODE::message`) for each finding.

Printed to stderr by `render.emit` when `GITHUB_ACTIONS=true`, so findings show as annotations
on the run and the pull request, next to whatever format goes to stdout.
"""

from __future__ import annotations

import os
from typing import TextIO

from exl3tool.report.model import Report
from exl3tool.rules.registry import Finding, Severity

_COMMAND = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def _escape_data(s: str) -> str:
    # actions/toolkit command.ts: escapeData
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(s: str) -> str:
    return _escape_data(s).replace(":", "%3A").replace(",", "%2C")


def annotation(report: Report, f: Finding) -> str:
    """One workflow command line for a finding."""
    from exl3tool.report.sarif import full_path, locate  # not imported outside GitHub Actions

    props = []
    path = full_path(report, locate(report, f))
    if path:
        props.append(f"file={_escape_property(path)}")
    props.append(f"title={_escape_property(f.code)}")
    where = " ".join(
        x
        for x in (
            f.location.tensor and f"[tensor {f.location.tensor}]",
            f.location.pointer and f"[at {f.location.pointer}]",
        )
        if x
    )
    msg = f"{f.rule.title}: {f.message} {where}".rstrip() + f"\nfix: {f.hint}"
    return f"::{_COMMAND[f.level]} {','.join(props)}::{_escape_data(msg)}"


def annotations(report: Report, *, errors_only: bool = False) -> list[str]:
    """The annotation of each finding (`errors_only`: of each error, as --quiet shows)."""
    shown = (f for f in report.findings if not errors_only or f.level is Severity.ERROR)
    return [annotation(report, f) for f in shown]


def in_github_actions() -> bool:
    return os.environ.get("GITHUB_ACTIONS") == "true"


def print_annotations(report: Report, stream: TextIO, *, errors_only: bool = False) -> None:
    for line in annotations(report, errors_only=errors_only):
        stream.write(line + "\n")
