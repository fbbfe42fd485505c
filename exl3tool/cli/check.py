"""`exl3tool check`: the pre-publish gate, every declared check in one report."""

from __future__ import annotations

import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated

import typer

from exl3tool.cli.common import (
    ForceOpt,
    FormatOpt,
    IgnoreOpt,
    OutputOpt,
    SelectOpt,
    SeverityOpt,
    handle_errors,
    rule_selection,
)


@handle_errors
def check(
    paths: Annotated[
        list[str] | None,
        typer.Argument(
            help="Artifact directories (or a config.json / adapter_config.json inside one), or "
            "org/name\\[@revision] from the local Hugging Face cache. Without --config, the checks "
            "are inferred from each artifact's kind.",
            show_default=False,
            metavar="[PATH]...",
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="exl3tool.toml or a pyproject.toml with \\[tool.exl3tool]. Default: ./exl3tool.toml "
            "(or ./pyproject.toml) when no PATH is given.",
        ),
    ] = None,
    fmt: FormatOpt = "text",
    output: OutputOpt = None,
    force: ForceOpt = False,
    strict: Annotated[bool, typer.Option("--strict", help="Warnings fail too (exit 1).")] = False,
    select: SelectOpt = None,
    ignore: IgnoreOpt = None,
    severity: SeverityOpt = None,
    quiet: Annotated[
        bool,
        typer.Option("--quiet", "-q", help="Only errors and the verdict; no notes, no progress."),
    ] = False,
) -> None:
    """Run a release's pre-publish checks in one process and one report.

    validate --hash, identity match, TP slicing, staging and verify-swap, as exl3tool.toml
    declares or as inferred from each artifact's kind. Exit 0 clean, 1 findings, 2 usage
    error, 3 unreadable PATH, 130/143 interrupted."""
    from exl3tool.actions import check as action
    from exl3tool.report.render import check_output, emit, render_string, write_output

    check_output(output, force, (*(paths or ()), *((config,) if config else ())))
    opts = action.Options(
        tuple(paths or ()), config, quiet, rule_selection(select, ignore, severity)
    )
    status = _Status() if not quiet and action.progress_enabled() else nullcontext(None)
    with status as bar:
        result = action.run(opts, on_step=bar.update if bar else None)
    report = result.report
    if fmt == "text":
        from exl3tool.report import check_summary

        if output is not None:
            text = render_string(report, "text") + "\n" + check_summary.to_text(report)
            write_output(output, text, force=force)
        else:
            emit(report, "text", None, quiet=quiet)
            if not quiet:
                check_summary.print_table(report)
    else:
        if not quiet:  # human notes go to stderr: stdout carries only the machine format
            for note in report.notes:
                sys.stderr.write(f"note: {note}\n")
        emit(report, fmt, output, quiet=quiet, force=force)
    raise typer.Exit(report.exit_code(strict or result.strict))


class _Status:
    """A one-line status on stderr naming the running step (only on a TTY)."""

    def __init__(self) -> None:
        from rich.console import Console

        self._status = Console(stderr=True).status("exl3tool check")

    def __enter__(self) -> _Status:
        self._status.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._status.__exit__(*exc)

    def update(self, text: str) -> None:
        from rich.markup import escape

        self._status.update(f"exl3tool check: {escape(text)}")
