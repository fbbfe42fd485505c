"""Dispatch a report to the format the user asked for, on stdout or into --output."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
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


def check_output(output: Path | None, force: bool, inputs: Iterable[str | Path] = ()) -> None:
    """Refuse before any work is done (exit 1) an --output file that exists without --force,
    or that could destroy or change one of `inputs` (io/outputs)."""
    if output is None:
        return
    from exl3tool.io.outputs import check_output_place

    check_output_place(Path(output), force, inputs, directory=False)


def write_output(output: Path | None, text: str | Iterable[str], *, force: bool = False) -> None:
    """`text` (or its pieces, in order) to stdout, or atomically into `output` (never
    replacing it without --force)."""
    pieces = (text,) if isinstance(text, str) else text
    if output is None:
        for piece in pieces:
            sys.stdout.write(piece)
        return
    from exl3tool.io.atomic import atomic_file  # tempfile and shutil: only for -o

    with atomic_file(Path(output), force=force) as fh:
        for piece in pieces:
            fh.write(piece.encode())


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
        github.print_annotations(report, sys.stderr, errors_only=quiet)
    if output is not None:
        write_output(output, render_string(report, fmt), force=force)
        return
    if fmt == "text":
        from exl3tool.report.text import print_text

        print_text(report, quiet=quiet)
        return
    sys.stdout.write(render_string(report, fmt))
