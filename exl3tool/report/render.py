"""Dispatch a report to the format the user asked for, on stdout or into --output."""

from __future__ import annotations

import json
import sys
from pathlib import Path

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


def check_output(output: Path | None, force: bool) -> None:
    """Refuse an existing --output without --force before any work is done (exit 1)."""
    from exl3tool.rules.errors import OutputError

    if output is not None and not force and (Path(output).exists() or Path(output).is_symlink()):
        raise OutputError(f"{output} exists; pass --force to replace it")


def write_output(output: Path | None, text: str, *, force: bool = False) -> None:
    """`text` to stdout, or atomically into `output` (never replacing it without --force)."""
    if output is None:
        sys.stdout.write(text)
        return
    from exl3tool.io.atomic import write_bytes_atomic  # tempfile and shutil: only for -o

    write_bytes_atomic(Path(output), text.encode(), force=force)


def emit(
    report: Report,
    fmt: str,
    output: Path | None = None,
    *,
    quiet: bool = False,
    force: bool = False,
) -> None:
    """Write the report; text goes to the terminal with color unless --output is given."""
    from exl3tool.report import github

    if github.in_github_actions():  # annotations on stderr never mix with stdout formats
        github.print_annotations(report, sys.stderr)
    if output is not None:
        write_output(output, render_string(report, fmt), force=force)
        return
    if fmt == "text":
        from exl3tool.report.text import print_text

        print_text(report, quiet=quiet)
        return
    sys.stdout.write(render_string(report, fmt))
