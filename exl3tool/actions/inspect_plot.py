"""`inspect --plot`: a layers x experts heatmap of K per projection, one discrete colour per K
value present (a uniform base shows one colour), written atomically."""

from __future__ import annotations

import io
from pathlib import Path

from exl3tool.rules.errors import UsageError, missing_extra

Grid = dict[tuple[int, int, str], int]


def require_matplotlib() -> None:
    """UsageError (exit 2) naming the extra when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        raise missing_extra("matplotlib", "plot", "--plot") from None
    matplotlib.use("Agg")


def _ticks(n: int, most: int = 12) -> list[int]:
    """At most `most` integer positions 0..n-1 (every one when they fit)."""
    step = max(1, -(-n // most))
    return list(range(0, n, step))


def k_colours(ks: list[int]) -> list[tuple[float, float, float, float]]:
    """One discrete colour per K value present (viridis, spread over the values)."""
    import matplotlib.pyplot as plt

    palette = plt.get_cmap("viridis", max(len(ks), 2))
    return [palette(i) for i in range(len(ks))]


def plot_k(grid: Grid, out: Path, title: str, *, force: bool = False) -> None:
    """Draw the heatmap into `out` (PNG); never replaces `out` without `force`."""
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import BoundaryNorm, ListedColormap

    from exl3tool.formats.names import PROJECTIONS
    from exl3tool.io.atomic import write_bytes_atomic

    if not grid:
        raise UsageError("nothing to plot: no routed-expert trellis found")
    layers = sorted({k[0] for k in grid})
    experts = max(k[1] for k in grid) + 1
    row = {layer: i for i, layer in enumerate(layers)}
    ks = sorted(set(grid.values()))
    # one colour per K present: index into the K list, boundaries halfway between indices
    cmap = ListedColormap(k_colours(ks))
    norm = BoundaryNorm([i - 0.5 for i in range(len(ks) + 1)], len(ks))
    index = {k: i for i, k in enumerate(ks)}
    fig, axes = plt.subplots(
        1, 3, figsize=(15, max(3.5, 0.15 * len(layers) + 2)), squeeze=False, layout="constrained"
    )
    image = None
    for ax, proj in zip(axes[0], PROJECTIONS, strict=True):
        m = np.full((len(layers), experts), np.nan)
        for (layer, e, p), k in grid.items():
            if p == proj:
                m[row[layer], e] = index[k]
        image = ax.imshow(m, aspect="auto", interpolation="nearest", cmap=cmap, norm=norm)
        ax.set_title(proj)
        ax.set_xlabel("expert")
        ax.set_ylabel("layer")
        xt = _ticks(experts)
        ax.set_xticks(xt, [str(e) for e in xt])
        yt = _ticks(len(layers))
        ax.set_yticks(yt, [str(layers[i]) for i in yt])
    bar = fig.colorbar(image, ax=axes[0].tolist(), label="K (bits per weight)")
    bar.set_ticks(list(range(len(ks))), labels=[str(k) for k in ks])
    fig.suptitle(f"K per (layer, expert): {title}")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    write_bytes_atomic(Path(out), buf.getvalue(), force=force)
