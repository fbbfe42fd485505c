"""`exl3tool verify-swap`: hot swap, rollback and TP checks on the reference runtime (issue 6).

torch and the runtime are imported inside the command, so other commands start fast.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from exl3tool.cli.common import EXIT_USAGE, check_format, fail, handle_errors
from exl3tool.rules.errors import InputError, UsageError


def render_text(report: Any) -> str:
    """A rich table of the checks (and one of the quality ladder)."""
    from rich.console import Console
    from rich.table import Table

    console = Console(record=True, width=140, file=open("/dev/null", "w"))  # noqa: SIM115
    t = Table(title=f"verify-swap: TP={report.tp}, device {report.device}, layers {report.layers}")
    for col in ("check", "result", "max_abs", "detail"):
        t.add_column(col, overflow="fold")
    for c in report.checks:
        result = {True: "[green]PASS[/]", False: "[red]FAIL[/]", None: "[yellow]SKIP[/]"}[c.passed]
        detail = c.detail
        if c.first_difference:
            fd = c.first_difference
            detail += f"\nfirst difference: {fd.get('where')} at {fd.get('index')}: got {fd.get('got')}, want {fd.get('want')}"
        t.add_row(c.name, result, "" if c.max_abs is None else f"{c.max_abs:.3g}", detail)
    console.print(t)
    if report.quality:
        q = Table(title="quality ladder (max over experts and projections)")
        for col in ("layer", "stage", "K", "experts", "‖c_s‖/‖W_0‖", "vs next", "vs dense", "ok"):
            q.add_column(col)

        def f(v: float | None) -> str:
            return "" if v is None else f"{v:.3g}"

        for r in report.quality:
            q.add_row(
                str(r["layer"]),
                r["label"],
                str(r["k"]),
                str(r["experts"]),
                f(r["correction_ratio_max"]),
                f(r["rel_to_next_max"]),
                f(r["rel_to_dense_max"]),
                "yes" if r["passed"] else "[red]no[/]",
            )
        console.print(q)
    timings = ", ".join(f"{k} {v:.2f}s" for k, v in report.timings.items())
    console.print(f"time: {timings}")
    for n in report.notes:
        console.print(f"note: {n}")
    console.print("[green]all checks passed[/]" if report.passed else "[red]some checks FAILED[/]")
    return console.export_text(styles=sys.stdout.isatty())


@handle_errors
def verify_swap(
    base: Annotated[Path, typer.Argument(help="The MSRT base (exl3-msrt-base/1) directory.")],
    adapter: Annotated[Path, typer.Argument(help="The cartridge (fq-cartridge-adapter/3).")],
    adapter_b: Annotated[
        Path | None, typer.Argument(help="A second cartridge: also check the swap A → B.")
    ] = None,
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel ranks (one process each).")] = 1,
    device: Annotated[str, typer.Option("--device", help="cpu (gloo) or cuda (NCCL).")] = "cpu",
    layers: Annotated[
        str | None,
        typer.Option("--layers", help="Layers to check: 3,5 or 3-6 (default: selected)."),
    ] = None,
    tokens: Annotated[int, typer.Option("--tokens", help="Tokens per layer (seeded).")] = 8,
    seed: Annotated[int, typer.Option("--seed", help="Seed of activations and router.")] = 0,
    dense: Annotated[
        Path | None,
        typer.Option("--dense", help="Dense reference weights (safetensors file or directory)."),
    ] = None,
    threads: Annotated[
        int | None,
        typer.Option("--threads", help="CPU threads per rank (default: cores / TP)."),
    ] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="text or json.")] = "text",
) -> None:
    """Prove hot swaps, unloads and rollbacks bit for bit on the reference runtime.

    A hot load equals a cold build, unloading and rollbacks restore the base bit for bit, and
    TP slices reassemble; exit 0 only if every check passes."""
    check_format(fmt, ("text", "json"))
    if device not in ("cpu", "cuda"):
        fail(f"--device must be cpu or cuda, not {device!r}", EXIT_USAGE)
    if tp < 1 or tokens < 1 or (threads is not None and threads < 1):
        fail("--tp, --tokens and --threads must be at least 1", EXIT_USAGE)
    if threads is None and device == "cpu":
        # ranks share the cores; oversubscribed OpenMP spin-waits are catastrophic on small hosts
        local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", tp)))
        threads = max(1, (os.cpu_count() or 1) // max(tp, local))
    for p in (base, adapter, adapter_b, dense):
        if p is not None and not p.exists():
            raise InputError(f"{p}: no such file or directory")

    from exl3tool.runtime.verify import VerifyOptions, parse_layers, run_verify

    try:
        selected = parse_layers(layers)
    except ValueError as exc:
        raise UsageError(f"--layers {layers!r}: {exc}") from None
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device cuda: no CUDA device is available")
        if tp > torch.cuda.device_count():
            raise UsageError(f"--tp {tp} needs {tp} GPUs, {torch.cuda.device_count()} visible")
    opts = VerifyOptions(
        base, adapter, adapter_b, tp, device, selected, tokens, seed, dense, threads=threads
    )
    try:
        report = run_verify(opts)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    from exl3tool.runtime.distributed import env_world

    found = env_world()
    if found is None or found[0] == 0:  # under torchrun only rank 0 prints
        if fmt == "json":
            sys.stdout.write(json.dumps(report.to_json(), indent=2) + "\n")
        else:
            sys.stdout.write(render_text(report))
    raise typer.Exit(report.exit_code())
