"""`exl3tool plan PATH --tp N`: per rank, the weight bytes the serving runtime allocates and how it
claims each module (headers only)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from exl3tool.cli.common import ARTIFACT_HELP, ForceOpt, TextJsonOpt, handle_errors

_UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def _unit(largest: int) -> tuple[str, int]:
    """The largest binary unit the biggest figure reaches (KiB for tiny checkpoints)."""
    return next(((u, s) for u, s in _UNITS if largest >= s), _UNITS[-1])


def render_text(plan: Any) -> str:
    """Rank table (GiB by class), claim table, findings; fits 80 columns for TP <= 4."""
    classes = sorted({k for r in plan.ranks for k in r})
    unit, scale = _unit(max([*plan.totals(), plan.gpu_memory or 0]))

    def _gib(n: int) -> str:
        return f"{n / scale:,.2f}"

    lines = [
        f"{plan.path}: {plan.kind}, TP {plan.tp}, EXL3 config {plan.exl3_config} ({plan.reason})",
        "",
        f"resident weights per rank ({unit})",
        f"{'class':<24}" + "".join(f"{'rank ' + str(i):>11}" for i in range(plan.tp)),
    ]
    for klass in classes:
        row = "".join(f"{_gib(r.get(klass, 0)):>11}" for r in plan.ranks)
        lines.append(f"{klass[:24]:<24}{row}")
    lines.append(f"{'total':<24}" + "".join(f"{_gib(t):>11}" for t in plan.totals()))
    if plan.gpu_memory is not None:
        lines.append(f"{'GPU memory':<24}" + f"{_gib(plan.gpu_memory):>11}" * plan.tp)
    lines += ["", "how the runtime claims the modules", f"{'method':<34}{'modules':>9}{unit:>11}"]
    for claim in plan.claims.values():
        lines.append(f"{claim.method[:34]:<34}{len(claim.modules):>9}{_gib(claim.nbytes):>11}")
    if plan.findings:
        lines.append("")
    for f in plan.findings:
        where = f.location.tensor or f.location.file or ""
        lines.append(f"{f.level.value} {f.code} {where + ': ' if where else ''}{f.message}")
        lines.append(f"    fix: {f.hint}")
    return "\n".join(lines) + "\n"


@handle_errors
def plan(
    path: Annotated[str, typer.Argument(help=f"A checkpoint directory ({ARTIFACT_HELP}).")],
    tp: Annotated[int, typer.Option("--tp", help="Runtime TP size (ranks).")] = 1,
    gpu_memory: Annotated[
        str | None,
        typer.Option(
            "--gpu-memory",
            help="Memory per GPU (e.g. 96GiB, 80GB): a finding when a rank's weights exceed it.",
        ),
    ] = None,
    quantization: Annotated[
        str | None,
        typer.Option(
            "--quantization",
            help="The --quantization the runtime is started with "
            "(default: none; the checkpoint's configs decide).",
        ),
    ] = None,
    fmt: TextJsonOpt = "text",
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Write a per-rank bar chart (PNG).")
    ] = None,
    force: ForceOpt = False,
) -> None:
    """Boot plan: per TP rank, the resident weight bytes by class (EXL3 dense, routed experts
    per K, MTP/hybrid tail, unquantized) and how the runtime claims each module (tensor_storage
    EXL3, R7 routed experts, rank-sliced tail, unquantized fallback). Reads headers only.

    Exit 0: no errors; 1: errors (the EXL3 config is discarded, a rank exceeds --gpu-memory);
    2: usage error; 3: PATH cannot be read."""
    from exl3tool.actions import plan as action
    from exl3tool.actions.inputs import resolve_input
    from exl3tool.report.render import check_output

    memory = action.parse_memory(gpu_memory) if gpu_memory is not None else None
    source = resolve_input(path)
    check_output(plot, force, (source,))  # before any work: never an input's file
    opts = action.PlanOptions(str(source), tp, memory, quantization)
    result = action.run(opts)
    if plot is not None:
        action.plot(result, plot, force=force)
    if fmt == "json":
        typer.echo(json.dumps(result.to_json(), indent=2))
    else:
        typer.echo(render_text(result), nl=False)
    raise typer.Exit(result.exit_code)
