"""The one `--layers` grammar (identity, verify-swap, the gate's identity step).

A spec is comma-separated decimal layer numbers (up to MAX_LAYER) and ranges `a-b` (a <= b),
plus the keywords a command allows: `other` (identity: the tensors outside any layer) or `all` (verify-swap: every
layer, the default). Anything else is a UsageError naming the spec (exit 2).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from exl3tool.rules.errors import UsageError

OTHER = "other"
ALL = "all"
MAX_LAYER = (1 << 16) - 1  # no model has more layers; a larger number would only size a set


@dataclass(frozen=True)
class LayerSpec:
    layers: frozenset[int]
    keywords: frozenset[str]  # the allowed keywords the spec names


def _index(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() else None


def parse_layer_spec(spec: str, keywords: Collection[str] = ()) -> LayerSpec:
    """`3-5,7,other` -> LayerSpec({3, 4, 5, 7}, {"other"}) when `other` is allowed."""
    layers: set[int] = set()
    named: set[str] = set()
    for part in spec.split(","):
        part = part.strip()
        if part in keywords:
            named.add(part)
            continue
        lo_text, sep, hi_text = part.partition("-")
        lo, hi = _index(lo_text.strip()), _index(hi_text.strip()) if sep else None
        if lo is None or (sep and (hi is None or hi < lo)):
            extra = "".join(f" or {k}" for k in sorted(keywords))
            raise UsageError(f"--layers {spec!r}: expected e.g. 3-5,7{extra}")
        if max(lo, hi or 0) > MAX_LAYER:
            raise UsageError(f"--layers {spec!r}: layer numbers go up to {MAX_LAYER}")
        layers.update(range(lo, (hi if sep else lo) + 1))
    return LayerSpec(frozenset(layers), frozenset(named))


def layers_text(layers: list[int]) -> str:
    """`layer 4`, or `layers 0, 3-9, 12` (sorted, runs joined; at most 8 runs named)."""
    runs: list[list[int]] = []
    for layer in layers:
        if runs and layer == runs[-1][1] + 1:
            runs[-1][1] = layer
        else:
            runs.append([layer, layer])
    parts = [f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:8]]
    more = f" and {len(runs) - 8} more runs" if len(runs) > 8 else ""
    return ("layer " if len(layers) == 1 else "layers ") + ", ".join(parts) + more
