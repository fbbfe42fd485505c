"""`exl3tool validate PATH...`: every defect a loader would hit at boot, as one report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from exl3tool.checks.options import ValidateOptions
from exl3tool.cli.common import FormatOpt, OutputOpt, check_format, handle_errors
from exl3tool.rules.errors import UsageError


@handle_errors
def validate(
    paths: Annotated[
        list[Path],
        typer.Argument(
            help="Checkpoint directories (EXL3, R7, rank-sliced, MSRT base), cartridges or .safetensors files."
        ),
    ],
    tp: Annotated[
        int | None, typer.Option("--tp", help="Runtime TP size to check slicing alignment against.")
    ] = None,
    hash_: Annotated[
        bool,
        typer.Option(
            "--hash/--no-hash", help="Recompute every declared digest (reads every byte)."
        ),
    ] = False,
    strict: Annotated[bool, typer.Option("--strict", help="Warnings fail too (exit 1).")] = False,
    base: Annotated[
        Path | None, typer.Option("--base", help="Base checkpoint a cartridge is checked against.")
    ] = None,
    threads: Annotated[
        int | None, typer.Option("--threads", help="Hashing threads (default: all cores).")
    ] = None,
    fmt: FormatOpt = "text",
    output: OutputOpt = None,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Only errors; no summary table or progress bar.")
    ] = False,
) -> None:
    """Validate EXL3/R7 checkpoints, MSRT bases and cartridges without a GPU.

    Exit 0: no errors; 1: errors (or warnings with --strict); 2: usage error; 3: a PATH
    cannot be read."""
    check_format(fmt)
    if tp is not None and tp < 1:
        raise UsageError(f"--tp must be >= 1, got {tp}")
    if threads is not None and threads < 1:
        raise UsageError(f"--threads must be >= 1, got {threads}")
    from exl3tool.actions.validate import check_readable, validate_path
    from exl3tool.io.progress import set_quiet
    from exl3tool.report.model import Report
    from exl3tool.report.render import emit

    set_quiet(quiet)
    options = ValidateOptions(tp=tp, hash=hash_, base=base, threads=threads)
    for path in paths:  # exit 3 before any work when one PATH cannot be read
        check_readable(path)
    report = Report()
    for path in paths:
        ref, findings = validate_path(path, options)
        report.artifacts.append(ref)
        report.add_findings(findings)
    emit(report, fmt, output, quiet=quiet)
    raise typer.Exit(report.exit_code(strict))
