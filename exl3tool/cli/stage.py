"""`exl3tool stage-cartridge ADAPTER --base BASE [--tp N] -o OUT`: a verified, TP-ready copy."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from exl3tool.cli.common import check_format, handle_errors
from exl3tool.rules.errors import UsageError


@handle_errors
def stage_cartridge(
    adapter: Annotated[Path, typer.Argument(help="The cartridge (adapter) directory.")],
    base: Annotated[Path, typer.Option("--base", help="The exl3-msrt-base/1 base it is for.")],
    out: Annotated[Path, typer.Option("--output", "-o", help="Directory to create.")],
    tp: Annotated[
        int | None,
        typer.Option(
            "--tp", help="Runtime TP size; a full adapter becomes rank-sharded for N > 1."
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing OUT.")] = False,
    threads: Annotated[
        int | None,
        typer.Option(
            "--threads", help="Shards copied in parallel (default: all of them, up to 4 per core)."
        ),
    ] = None,
    fmt: Annotated[
        str, typer.Option("--format", "-f", help="Result format: text or json.")
    ] = "text",
) -> None:
    """Copy, verify and validate a cartridge against its base; publish OUT atomically.

    Exit 0: staged; 1: the adapter was refused or OUT cannot be written (nothing appears
    at OUT); 2: usage error; 3: an input cannot be read."""
    check_format(fmt, ("text", "json"))
    if tp is not None and tp < 1:
        raise UsageError(f"--tp must be >= 1, got {tp}")
    if threads is not None and threads < 1:
        raise UsageError(f"--threads must be >= 1, got {threads}")
    from exl3tool.io.progress import progress_bar
    from exl3tool.report.model import ArtifactRef, Report
    from exl3tool.report.render import emit
    from exl3tool.staging.stage import StageError
    from exl3tool.staging.stage import stage_cartridge as run

    total = _total_bytes(adapter)
    try:
        with progress_bar(total, "staging") as bar:
            result = run(adapter, base, out=out, tp=tp, force=force, threads=threads, progress=bar)
    except StageError as exc:
        report = Report([ArtifactRef(str(adapter), "cartridge")], exc.findings)
        report.notes.append(f"{exc}; {out} was not created or changed")
        emit(report, fmt)
        raise typer.Exit(1) from None
    rec = result.staging
    if fmt == "json":
        sys.stdout.write(json.dumps({"out": str(result.out), "staging": rec}, indent=2) + "\n")
        return
    files = sum(len(r["files"]) for r in rec["ranks"])
    typer.echo(
        f"staged {adapter} -> {result.out}: layout {rec['layout']}, TP {rec['tp_size']}, "
        f"{files} rank files, stages {', '.join(rec['chain'])}, "
        f"max_residual_bits {rec['max_residual_bits']}"
    )


def _total_bytes(adapter: Path) -> int:
    """Bytes to copy, for the progress bar (0 when unknown)."""
    path = Path(adapter) / "adapter_config.json"
    try:
        if not path.is_file():  # a FIFO would block; the loader reports it
            return 0
        manifest = json.loads(path.read_bytes())
        return sum(s["size"] for s in manifest["shards"] if type(s.get("size")) is int)
    except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return 0
