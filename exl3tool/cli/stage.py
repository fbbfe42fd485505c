"""`exl3tool stage-cartridge ADAPTER --base BASE [--tp N] -o OUT`: a verified, TP-ready copy."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from exl3tool.cli.common import ARTIFACT_HELP, ForceOpt, TextJsonOpt, handle_errors


@handle_errors
def stage_cartridge(
    adapter: Annotated[
        str,
        typer.Argument(
            help=f"The cartridge (adapter) directory ({ARTIFACT_HELP}).", metavar="ADAPTER"
        ),
    ],
    base: Annotated[
        str, typer.Option("--base", help=f"The exl3-msrt-base/1 base it is for ({ARTIFACT_HELP}).")
    ],
    out: Annotated[Path, typer.Option("--output", "-o", help="Directory to create.")],
    tp: Annotated[
        int | None,
        typer.Option(
            "--tp", help="Runtime TP size; a full adapter becomes rank-sharded for N > 1."
        ),
    ] = None,
    force: ForceOpt = False,
    threads: Annotated[
        int | None,
        typer.Option(
            "--threads", help="Shards copied in parallel (default: all of them, up to 4 per core)."
        ),
    ] = None,
    fmt: TextJsonOpt = "text",
) -> None:
    """Copy, verify and validate a cartridge against its base; publish OUT atomically.

    Exit 0: staged; 1: the adapter was refused or OUT cannot be written (nothing appears
    at OUT); 2: usage error; 3: an input cannot be read or changed while it was read; 130/143:
    interrupted (nothing appears at OUT, unless the signal came after it was published)."""
    from exl3tool.actions import stage as action
    from exl3tool.report.render import emit

    result = action.run(action.Options(adapter, base, out, tp, force, threads))
    rec = result.staging
    if rec is None:
        emit(result.report, fmt)
        raise typer.Exit(result.exit_code())
    if fmt == "json":
        sys.stdout.write(json.dumps({"out": str(result.out), "staging": rec}, indent=2) + "\n")
        return
    files = sum(len(r["files"]) for r in rec["ranks"])
    typer.echo(
        f"staged {adapter} -> {result.out}: layout {rec['layout']}, TP {rec['tp_size']}, "
        f"{files} rank files, stages {', '.join(rec['chain'])}, "
        f"max_residual_bits {rec['max_residual_bits']}"
    )
