"""Dispatch a report to the format the user asked for, on stdout or into --output."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from exl3tool.io.atomic import write_bytes_atomic
from exl3tool.report.model import Report
from exl3tool.rules.errors import UsageError

FORMATS = ("text", "json", "sarif", "junit")


def render_string(report: Report, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(report.to_json(), indent=2) + "\n"
    if fmt == "sarif":
        from exl3tool.report.sarif import to_sarif

        return json.dumps(to_sarif(report), indent=2) + "\n"
    if fmt == "junit":
        from exl3tool.report.junit import to_junit

        return to_junit(report)
    if fmt == "text":
        from exl3tool.report.text import to_text

        return to_text(report, color=False)
    raise UsageError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")


def emit(report: Report, fmt: str, output: Path | None = None, *, quiet: bool = False) -> None:
    """Write the report; text goes to the terminal with color unless --output is given."""
    from exl3tool.report import github

    if github.in_github_actions():  # annotations on stderr never mix with stdout formats
        github.print_annotations(report, sys.stderr)
    if output is not None:
        write_bytes_atomic(Path(output), render_string(report, fmt).encode(), force=True)
        return
    if fmt == "text":
        from exl3tool.report.text import print_text

        print_text(report, quiet=quiet)
        return
    sys.stdout.write(render_string(report, fmt))
