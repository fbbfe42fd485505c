"""`exl3tool validate PATH...`: every defect a loader would hit at boot, as one report."""

from __future__ import annotations

from typing import Annotated, Literal

import typer

from exl3tool.cli.common import (
    ARTIFACT_HELP,
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
def validate(
    paths: Annotated[
        list[str],
        typer.Argument(
            help="Checkpoint directories (EXL3, R7, rank-sliced, MSRT base), cartridges or "
            f".safetensors files; each {ARTIFACT_HELP}.",
            metavar="PATH...",
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
        str | None,
        typer.Option(
            "--base", help=f"Base checkpoint a cartridge is checked against ({ARTIFACT_HELP})."
        ),
    ] = None,
    threads: Annotated[
        int | None, typer.Option("--threads", help="Hashing workers (default: all cores).")
    ] = None,
    runtime: Annotated[
        Literal["auto", "public", "cartridge"],
        typer.Option(
            "--runtime",
            help="Serving-runtime revision to predict: public (the strictest public one), "
            "cartridge (uniform rank-sliced K 2..6), or auto (cartridge for an MSRT base, "
            "else public); docs/runtime-conformance.md.",
        ),
    ] = "auto",
    fmt: FormatOpt = "text",
    output: OutputOpt = None,
    force: ForceOpt = False,
    select: SelectOpt = None,
    ignore: IgnoreOpt = None,
    severity: SeverityOpt = None,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Only errors; no summary table or progress bar.")
    ] = False,
) -> None:
    """Validate EXL3/R7 checkpoints, MSRT bases and cartridges without a GPU.

    Exit 0: no errors; 1: errors (or warnings with --strict); 2: usage error; 3: a PATH
    cannot be read; 130/143: interrupted."""
    from exl3tool.cli.plain import validate_body

    raise typer.Exit(
        validate_body(
            paths, tp, hash_, strict, base, threads, runtime, fmt, output, force, quiet,
            rule_selection(select, ignore, severity),
        )
    )  # fmt: skip
