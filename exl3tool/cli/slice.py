"""`exl3tool slice`: tensor-parallel slices of a checkpoint, an MSRT base or a cartridge."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Annotated

import typer

from exl3tool.cli.common import EXIT_USAGE, check_format, fail, handle_errors
from exl3tool.rules.registry import Findings

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6,
          "mib": 2**20, "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12,
          "tib": 2**40}  # fmt: skip


def parse_size(text: str) -> int:
    """`5GiB`, `500MB`, `1048576` -> bytes (decimal and binary units)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(f"cannot read size {text!r} (e.g. 5GiB, 500MB, 1048576)")
    n = int(float(m.group(1)) * _UNITS[unit])
    if n < 1:
        raise ValueError(f"size {text!r} must be at least one byte")
    return n


def _human(n: int) -> str:
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n} B"


def _plan_text(summary: dict, out: Path | None, dry: bool) -> str:
    lines = [
        f"{'plan' if dry else 'sliced'}: {summary['kind']}, TP {summary['tp']}"
        + (f", mode {summary['mode']}, layout {summary['layout']}" if "mode" in summary else "")
        + (f" -> {out}" if out else "")
    ]
    for r in summary["ranks"]:
        lines.append(
            f"  rank {r['rank']}: {r['tensors']} tensors, {_human(r['bytes'])}"
            f" ({r['replicated_tensors']} replicated, {_human(r['replicated_bytes'])})"
        )
    if summary.get("reported"):
        lines.append(
            f"  {len(summary['reported'])} tensors replicated because no rule splits them:"
        )
        lines += [f"    {x['tensor']}: {x['reason']}" for x in summary["reported"]]
    return "\n".join(lines) + "\n"


def _emit(path: Path, kind: str, findings: Findings, fmt: str, summary: dict | None) -> None:
    from exl3tool.report.model import ArtifactRef, Report
    from exl3tool.report.render import emit

    shown = Findings(f for f in findings if f.code != "TP003")  # TP003 is in the plan text
    report = Report([ArtifactRef(str(path), kind, {"plan": summary} if summary else {})], findings)
    if fmt == "json":
        sys.stdout.write(json.dumps(report.to_json(), indent=2) + "\n")
    elif shown:
        emit(Report(report.artifacts, shown), fmt)


def _progress_total(path: Path) -> int:
    """Bytes the progress bar expects; dangling links or loops are the slicer's to report."""
    try:
        return sum(p.lstat().st_size for p in path.rglob("*.safetensors")) if path.is_dir() else 0
    except OSError:
        return 0


@handle_errors
def slice_cmd(
    path: Annotated[
        Path | None, typer.Argument(help="Checkpoint, MSRT base or cartridge to slice.")
    ] = None,
    tp: Annotated[int | None, typer.Option("--tp", min=1, help="TP size N.")] = None,
    mode: Annotated[
        str, typer.Option("--mode", help="tensor (split experts) or expert (whole experts).")
    ] = "tensor",
    layout: Annotated[
        str, typer.Option("--layout", help="per-rank (rank-{r}/ directories) or rank-sliced.")
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
    force: Annotated[bool, typer.Option("--force", help="Replace an existing output.")] = False,
    threads: Annotated[
        int | None, typer.Option("--threads", min=1, help="Worker threads (default: cores).")
    ] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="text or json.")] = "text",
    sha256: Annotated[
        bool,
        typer.Option("--sha256", help="Also record each output file's sha256 (blake3 always)."),
    ] = False,
) -> None:
    """Slice for tensor parallelism; each rank reads only its own bytes (exl3-format.md §6)."""
    from exl3tool.tp.run import SliceOptions, slice_artifact, verify_output
    from exl3tool.tp.slices import LAYOUTS, MODES, PlanRefused
    from exl3tool.tp.writer import SliceFailed

    check_format(fmt, ("text", "json"))
    if verify_only is not None:
        findings = verify_output(verify_only, path, threads)
        _emit(verify_only, "slices", findings, fmt, None)
        if fmt == "text" and not findings.has_errors():
            typer.echo(f"verified: {verify_only} reassembles its source byte for byte")
        raise typer.Exit(1 if findings.has_errors() else 0)
    if path is None or tp is None:
        fail("slice needs PATH and --tp N (or --verify-only OUT)", EXIT_USAGE)
    if mode not in MODES or layout not in LAYOUTS:
        fail(f"--mode is one of {MODES}, --layout one of {LAYOUTS}", EXIT_USAGE)
    try:
        shard = parse_size(max_shard_size)
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)
    if not dry_run and output is None:
        fail("slice needs -o OUT (or --dry-run)", EXIT_USAGE)
    opts = SliceOptions(tp, mode, layout, shard, force, verify, threads, sha256)
    from exl3tool.io.progress import progress_bar

    try:
        total = _progress_total(Path(path))
        with progress_bar(total, "slicing") as bar:
            outcome = slice_artifact(path, None if dry_run else output, opts, progress=bar)
    except (PlanRefused, SliceFailed) as exc:
        from exl3tool.formats.detect import detect

        _emit(path, detect(path).value, exc.findings, fmt, None)
        raise typer.Exit(1) from None
    summary = outcome.plan.summary() if outcome.plan is not None else outcome.cartridge
    if outcome.plan is None and not dry_run:
        summary = {"kind": "cartridge", "tp": tp, "ranks": [], "reported": []}
    if fmt == "text":
        typer.echo(_plan_text(summary, outcome.out, dry_run), nl=False)
        if verify and not dry_run:
            typer.echo("verified: every source tensor reassembles byte for byte")
    _emit(path, outcome.kind, outcome.findings, fmt, summary)
    raise typer.Exit(1 if outcome.findings.has_errors() else 0)
