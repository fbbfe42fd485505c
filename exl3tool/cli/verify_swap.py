"""`exl3tool verify-swap`: hot swap, rollback and TP checks on the reference runtime.

torch and the runtime are imported inside the action, so other commands start fast.
"""

from __future__ import annotations

import json
import shutil
import sys
from typing import Annotated, Literal

import typer

from exl3tool.cli.common import ARTIFACT_HELP, TextJsonOpt, handle_errors


@handle_errors
def verify_swap(
    base: Annotated[
        str,
        typer.Argument(help=f"The MSRT base (exl3-msrt-base/1), {ARTIFACT_HELP}.", metavar="BASE"),
    ],
    adapter: Annotated[
        str,
        typer.Argument(
            help=f"The cartridge (fq-cartridge-adapter/3), {ARTIFACT_HELP}.", metavar="ADAPTER"
        ),
    ],
    adapter_b: Annotated[
        str | None,
        typer.Argument(
            help="A second cartridge: also check the swap A → B.", metavar="[ADAPTER_B]"
        ),
    ] = None,
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel ranks (one process each).")] = 1,
    device: Annotated[
        Literal["cpu", "cuda"], typer.Option("--device", help="cpu (gloo) or cuda (NCCL).")
    ] = "cpu",
    layers: Annotated[
        str | None,
        typer.Option("--layers", help="Layers to check: 3,5 or 3-6 (default: selected)."),
    ] = None,
    tokens: Annotated[int, typer.Option("--tokens", help="Tokens per layer (seeded).")] = 8,
    seed: Annotated[int, typer.Option("--seed", help="Seed of activations and router.")] = 0,
    dense: Annotated[
        str | None,
        typer.Option("--dense", help="Dense reference weights (safetensors file or directory)."),
    ] = None,
    threads: Annotated[
        int | None,
        typer.Option("--threads", help="CPU threads per rank (default: cores / TP)."),
    ] = None,
    max_memory: Annotated[
        str | None,
        typer.Option("--max-memory", help="Memory one rank may use (8G, 512M); VS001 above it."),
    ] = None,
    fmt: TextJsonOpt = "text",
) -> None:
    """Prove hot swaps, unloads and rollbacks bit for bit on the reference runtime.

    A hot load equals a cold build, unloading and rollbacks restore the base bit for bit, and
    TP slices reassemble; exit 0 only if every check passes. A --tp the geometry does not
    divide is refused before any rank starts (exit 1). Needs torch: pip install
    'exl3tool\\[runtime]' (exit 2 without it)."""
    from exl3tool.actions import verify_swap as action
    from exl3tool.report.render import emit

    opts = action.Options(
        base, adapter, adapter_b, tp, device, layers, tokens, seed, dense, threads, max_memory
    )
    result = action.run(opts)
    if result.refused is not None:
        emit(result.refused, fmt)
        raise typer.Exit(result.exit_code())
    if result.prints:
        if fmt == "json":
            sys.stdout.write(json.dumps(result.verify.to_json(), indent=2) + "\n")
        else:
            from exl3tool.report.verify_swap import render_text

            width = (
                max(80, shutil.get_terminal_size((80, 24)).columns) if sys.stdout.isatty() else 80
            )
            sys.stdout.write(render_text(result.verify, width))
    raise typer.Exit(result.exit_code())
