"""`exl3tool slice`: tensor-parallel slices of a checkpoint, an MSRT base or a cartridge."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from exl3tool.cli.common import ARTIFACT_HELP, ForceOpt, TextJsonOpt, handle_errors

if TYPE_CHECKING:
    from exl3tool.actions.slice import SliceResult


def _emit(result: SliceResult, fmt: str) -> None:
    from exl3tool.report.model import Report
    from exl3tool.report.render import emit

    report = result.report()
    if fmt == "json":
        sys.stdout.write(json.dumps(report.to_json(), indent=2) + "\n")
        return
    shown = [f for f in report.findings if f.code != "TP003"]  # TP003 is in the plan text
    if shown:
        from exl3tool.rules.registry import Findings

        emit(Report(report.artifacts, Findings(shown)), fmt)


@handle_errors
def slice_cmd(
    path: Annotated[
        str | None,
        typer.Argument(
            help=f"Checkpoint, MSRT base or cartridge to slice ({ARTIFACT_HELP}).",
            metavar="PATH",
            show_default=False,
        ),
    ] = None,
    tp: Annotated[int | None, typer.Option("--tp", min=1, help="TP size N.")] = None,
    mode: Annotated[
        Literal["tensor", "expert"],
        typer.Option("--mode", help="tensor (split experts) or expert (whole experts)."),
    ] = "tensor",
    layout: Annotated[
        Literal["per-rank", "rank-sliced"],
        typer.Option("--layout", help="per-rank (rank-{r}/ directories) or rank-sliced."),
    ] = "per-rank",
    max_shard_size: Annotated[
        str, typer.Option("--max-shard-size", help="Largest output shard, e.g. 5GiB.")
    ] = "5GiB",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan; write nothing.")
    ] = False,
    verify: Annotated[
        bool, typer.Option("--verify", help="Prove the reassembly before publishing.")
    ] = False,
    verify_only: Annotated[
        Path | None,
        typer.Option("--verify-only", help="Only verify this existing slice output."),
    ] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Output directory.")] = None,
    force: ForceOpt = False,
    threads: Annotated[
        int | None, typer.Option("--threads", min=1, help="Worker threads (default: cores).")
    ] = None,
    fmt: TextJsonOpt = "text",
    sha256: Annotated[
        bool,
        typer.Option("--sha256", help="Also record each output file's sha256 (blake3 always)."),
    ] = False,
) -> None:
    """Slice for tensor parallelism; each rank reads only its own bytes (docs/formats/exl3.md §6)."""
    if "numpy" not in sys.modules:  # its OpenBLAS starts a thread per core; slicing uses none
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from exl3tool.actions import slice as action
    from exl3tool.report.slice import plan_text

    opts = action.Options(
        path, tp, mode, layout, max_shard_size, dry_run, verify, verify_only, output, force,
        threads, sha256,
    )  # fmt: skip
    result = action.run(opts)
    if verify_only is not None:
        _emit(result, fmt)
        if fmt == "text" and not result.findings.has_errors():
            typer.echo(f"verified: {verify_only} reassembles its source byte for byte")
        raise typer.Exit(result.exit_code())
    if not result.refused and fmt == "text" and result.summary is not None:
        typer.echo(plan_text(result.summary, result.out, dry_run), nl=False)
        if verify and not dry_run:
            typer.echo("verified: every source tensor reassembles byte for byte")
    _emit(result, fmt)
    raise typer.Exit(result.exit_code())
