"""`exl3tool decode`: one EXL3 linear to fp16 safetensors in the Hugging Face orientation."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Literal

import typer

from exl3tool.cli.common import ARTIFACT_HELP, ForceOpt, handle_errors


@handle_errors
def decode(
    path: Annotated[
        str,
        typer.Argument(
            help=f"Checkpoint directory or one .safetensors file ({ARTIFACT_HELP}).",
            metavar="PATH",
        ),
    ],
    tensor: Annotated[
        str, typer.Option("--tensor", help="Linear prefix, e.g. model.layers.0.mlp.down_proj.")
    ],
    output: Annotated[Path, typer.Option("-o", "--output", help="Output .safetensors file.")],
    rotated: Annotated[
        bool, typer.Option("--rotated", help="Write Ŵᵀ (PREFIX.weight_rotated) instead of W.")
    ] = False,
    device: Annotated[
        Literal["cpu", "cuda"], typer.Option("--device", help="cpu or cuda (bit-identical).")
    ] = "cpu",
    force: ForceOpt = False,
) -> None:
    """Decode one EXL3 linear to fp16 in HF orientation (out, in), bit-exact with exllamav3.

    Needs torch: pip install 'exl3tool\\[runtime]' (exit 2 without it)."""
    from exl3tool.actions import decode as action
    from exl3tool.report.render import emit

    result = action.run(action.Options(path, tensor, output, rotated, device, force))
    if result.name is None:
        emit(result.report(), "text")
        raise typer.Exit(result.exit_code())
    sys.stdout.write(f"wrote {result.name} {result.shape} fp16 -> {output}\n")
