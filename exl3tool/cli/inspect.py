"""`exl3tool inspect PATH`: what a checkpoint holds (kind, layers, experts, K, tiers, sizes)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from exl3tool.cli.common import check_format, handle_errors
from exl3tool.rules.errors import UsageError

PLOT_HINT = "--plot needs matplotlib: pip install 'exl3tool[plot]'"


@handle_errors
def inspect(
    path: Annotated[Path, typer.Argument(help="Checkpoint directory or .safetensors file.")],
    fmt: Annotated[str, typer.Option("--format", "-f", help="text or json")] = "text",
    plot: Annotated[
        Path | None,
        typer.Option("--plot", help="Write a layers x experts heatmap of K per projection (PNG)."),
    ] = None,
) -> None:
    """Summarise an artifact: layers, experts, K histograms, bits per weight, tiers.

    Kind, layers, experts, K histogram per projection, routed-expert bits per weight, tier
    per layer and sizes; --plot draws a layers x experts heatmap of K."""
    check_format(fmt, ("text", "json"))
    if plot is not None:
        try:
            import matplotlib
        except ImportError:
            raise UsageError(PLOT_HINT) from None
        matplotlib.use("Agg")
    from exl3tool.actions.validate import describe

    info, grid = describe(path)
    if plot is not None:
        _plot(grid, plot, str(path))
        info["plot"] = str(plot)
    if fmt == "json":
        typer.echo(json.dumps(info, indent=2))
    else:
        _text(info)


def _text(info: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    table = Table(title=f"exl3tool inspect {escape(info['path'])}", show_header=False)
    table.add_column("field")
    table.add_column("value")
    rows = [("kind", info["kind"])]
    if "tensors" in info:
        layers = info.get("layers") or []
        span = f"{layers[0]}..{layers[-1]} ({len(layers)})" if layers else "none"
        rows += [
            ("shards / tensors", f"{info['shards']} / {info['tensors']}"),
            ("payload bytes", f"{info['bytes']:,}"),
            ("file bytes", f"{info['file_bytes']:,}"),
            ("routed-expert layers", span),
            ("experts per layer", str(info.get("experts", 0))),
        ]
        if info.get("routed_bpw") is not None:
            rows.append(("routed bits per weight", f"{info['routed_bpw']:.4g}"))
    for k, v in rows:
        table.add_row(k, escape(str(v)))
    console.print(table)
    hist = info.get("k_histogram") or {}
    ks = sorted({k for h in hist.values() for k in h}, key=int)
    if ks:
        kt = Table(title="K histogram per projection")
        kt.add_column("projection")
        for k in ks:
            kt.add_column(f"K={k}", justify="right")
        for proj, h in hist.items():
            kt.add_row(proj, *(str(h.get(k, 0)) for k in ks))
        console.print(kt)
    tiers = info.get("tiers") or {}
    if tiers:
        counts: dict[int, list[str]] = {}
        for layer, t in tiers.items():
            counts.setdefault(t, []).append(layer)
        tt = Table(title="tier per layer", caption="tier = distinct K across gate/up/down")
        tt.add_column("tier", justify="right")
        tt.add_column("layers")
        for t, layers in sorted(counts.items()):
            tt.add_row(str(t), ", ".join(layers))
        console.print(tt)


def _plot(grid: dict[tuple[int, int, str], int], out: Path, title: str) -> None:
    """Heatmap (layers x experts) of K, one panel per projection, written atomically."""
    import matplotlib.pyplot as plt
    import numpy as np

    from exl3tool.formats.names import PROJECTIONS
    from exl3tool.io.atomic import write_bytes_atomic

    if not grid:
        raise UsageError("nothing to plot: no routed-expert trellis found")
    layers = sorted({k[0] for k in grid})
    experts = max(k[1] for k in grid) + 1
    row = {layer: i for i, layer in enumerate(layers)}
    fig, axes = plt.subplots(
        1, 3, figsize=(15, max(3.5, 0.15 * len(layers) + 2)), squeeze=False, layout="constrained"
    )
    lo, hi = min(grid.values()), max(grid.values())
    image = None
    for ax, proj in zip(axes[0], PROJECTIONS, strict=True):
        m = np.full((len(layers), experts), np.nan)
        for (layer, e, p), k in grid.items():
            if p == proj:
                m[row[layer], e] = k
        image = ax.imshow(
            m, aspect="auto", interpolation="nearest", vmin=lo, vmax=hi, cmap="viridis"
        )
        ax.set_title(proj)
        ax.set_xlabel("expert")
        ax.set_ylabel("layer")
        ticks = range(0, len(layers), max(1, len(layers) // 10))
        ax.set_yticks(list(ticks), [str(layers[i]) for i in ticks])
    fig.colorbar(image, ax=axes[0].tolist(), label="K (bits per weight)")
    fig.suptitle(f"K per (layer, expert): {title}")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    write_bytes_atomic(Path(out), buf.getvalue(), force=True)
