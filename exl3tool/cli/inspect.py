"""`exl3tool inspect PATH`: what a checkpoint holds (kind, layers, experts, K, tiers, sizes), or
what a cartridge declares (its base pin, its chain of stages, layers, layout)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from exl3tool.cli.common import ARTIFACT_HELP, ForceOpt, TextJsonOpt, handle_errors


@handle_errors
def inspect(
    path: Annotated[
        str,
        typer.Argument(
            help=f"Checkpoint directory or .safetensors file ({ARTIFACT_HELP}).", metavar="PATH"
        ),
    ],
    fmt: TextJsonOpt = "text",
    plot: Annotated[
        Path | None,
        typer.Option("--plot", help="Write a layers x experts heatmap of K per projection (PNG)."),
    ] = None,
    force: ForceOpt = False,
) -> None:
    """Summarise an artifact: layers, experts, K histograms, bits per weight, tiers.

    Kind, layers, experts, K histogram per projection, routed-expert bits per weight, tier
    per layer and sizes; --plot draws a layers x experts heatmap of K. Of a cartridge: its
    base pin, its chain of stages, layers, layout and sizes. Exit 1 when the artifact cannot
    be described (its findings say why), 3 when PATH cannot be read."""
    from exl3tool.actions import inspect as action
    from exl3tool.report.render import emit

    result = action.run(action.Options(path, plot=plot, force=force))
    if result.findings:
        emit(result.report(), fmt)
        raise typer.Exit(result.exit_code())
    if fmt == "json":
        typer.echo(json.dumps(result.info, indent=2))
    else:
        from exl3tool.report.inspect import print_inspect

        print_inspect(result.info)
