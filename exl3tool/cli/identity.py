"""`exl3tool identity`: logical tensor/layer/root digests, `--check` against a record, and a
`sha256sum -c` manifest of the files."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from exl3tool.cli.common import ARTIFACT_HELP, ForceOpt, handle_errors

AlgoOpt = Annotated[
    Literal["blake3", "sha256"] | None,
    typer.Option("--algo", help="Tensor hash: blake3 or sha256 (default blake3)."),
]


def _format(fmt: str | None, output: Path | None, checking: bool) -> str:
    """--format, or json for an -o file named *.json (what --check, diff and check read)."""
    if fmt is None:
        return "json" if output is not None and output.suffix == ".json" else "text"
    if not checking and fmt not in ("text", "json"):
        from exl3tool.rules.errors import UsageError

        raise UsageError(f"--format {fmt}: identity writes text or json (sarif, junit: --check)")
    return fmt


@handle_errors
def identity(
    path: Annotated[
        str,
        typer.Argument(
            help=f"Checkpoint, base, cartridge or shard file ({ARTIFACT_HELP}).", metavar="PATH"
        ),
    ],
    algo: AlgoOpt = None,
    layers: Annotated[
        str | None, typer.Option("--layers", help="Only these layers, e.g. 3-5,7 or other.")
    ] = None,
    threads: Annotated[
        int | None, typer.Option("--threads", min=1, help="Hashing threads (default: cores).")
    ] = None,
    fmt: Annotated[
        Literal["text", "json", "sarif", "junit"] | None,
        typer.Option(
            "--format",
            "-f",
            help="text, json (default for -o *.json); with --check also sarif, junit.",
            show_default=False,
        ),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write to this file (atomically).")
    ] = None,
    sha256sum: Annotated[
        Path | None,
        typer.Option("--sha256sum", help="Also write a `sha256sum -c` manifest of the files."),
    ] = None,
    check_file: Annotated[
        Path | None,
        typer.Option("--check", help="Recompute and compare with this identity JSON."),
    ] = None,
    compat: Annotated[
        bool,
        typer.Option(
            "--compat/--no-compat",
            help="Add the MSRT compatibility block when the experts have a uniform K.",
        ),
    ] = True,
    force: ForceOpt = False,
) -> None:
    """Per-tensor, per-layer and root digests of an artifact's logical tensors.

    Shard boundaries, file names and TP rank slicing do not change them. An artifact whose
    container is broken gets its findings and no digests (exit 1; 3 when unreadable)."""
    from exl3tool.actions import identity as action
    from exl3tool.report.identity import finding_lines, identity_json, identity_text
    from exl3tool.report.render import check_output, write_output

    fmt = _format(fmt, output, check_file is not None)
    check_output(output, force)
    opts = action.Options(
        path, algo, layers, threads, compat, sha256sum, check=check_file, force=force
    )
    result = action.run(opts)
    if check_file is not None:
        _render_check(result, fmt, output, force)
        return
    if result.identity is not None:
        ident = result.identity
        text = identity_json(ident) if fmt == "json" else identity_text(ident, result.path)
        write_output(output, text, force=force)
    sys.stderr.write(finding_lines(result.findings))
    if result.identity is None:
        sys.stderr.write(f"exl3tool: {result.path}: container errors; no identity given\n")
    raise typer.Exit(result.exit_code())


def _render_check(result: Any, fmt: str, output: Path | None, force: bool) -> None:
    """`--check`: the findings as a report, or the one-line verdict (text or JSON)."""
    from exl3tool.report.render import emit, write_output

    if result.summary is None:
        emit(result.report(), fmt, output, force=force)
        raise typer.Exit(result.exit_code() or 1)
    if fmt == "text":
        write_output(output, result.summary + "\n", force=force)
        return
    report = result.report()
    report.notes.append(result.summary)
    write_output(output, json.dumps(report.to_json(), separators=(",", ":")) + "\n", force=force)
