"""`exl3tool identity`: logical tensor/layer/root digests, `--check` against a record, and a
`sha256sum -c` manifest of the files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from exl3tool.cli.common import ARTIFACT_HELP, ForceOpt, handle_errors

AlgoOpt = Annotated[
    Literal["blake3", "sha256"] | None,
    typer.Option("--algo", help="Tensor hash: blake3 or sha256 (default blake3)."),
]


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
        int | None, typer.Option("--threads", min=1, help="Hashing workers (default: cores).")
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
    from exl3tool.cli.plain import identity_body

    raise typer.Exit(
        identity_body(
            path, algo, layers, threads, fmt, output, sha256sum, check_file, compat, force
        )
    )
