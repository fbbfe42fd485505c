"""How one EXL3 linear is sliced for a channel range (docs/formats/exl3.md §6, §13 "TP slice").

| field | column-parallel [first, last) of out | row-parallel [first, last) of in |
|---|---|---|
| trellis | tile axis 1 `[first/16, last/16)` | tile axis 0 `[first/16, last/16)` |
| suh / su | replicated | `[first, last)` / `[first/16, last/16)` |
| svh / sv | `[first, last)` / `[first/16, last/16)` | replicated |
| bias | `[first, last)` | whole on the rank with first == 0 only |
| mcg / mul1 (markers), other | replicated | replicated |
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only views are made here: `validate` and `plan` import this without numpy
    import numpy as np

ROLES = ("column", "row")
TILE = 16


@dataclass(frozen=True)
class FieldCut:
    """What a rank holds of one field: `axis` None means the whole tensor."""

    axis: int | None
    start: int = 0
    stop: int = 0
    present: bool = True  # False: the rank holds nothing (row-parallel bias off the first rank)
    replicated: bool = False  # the whole tensor, identical on every rank


WHOLE = FieldCut(None, replicated=True)


def field_cut(role: str, fld: str, first: int, last: int) -> FieldCut:
    """The cut of field `fld` of a `role` linear for channels [first, last)."""
    if role == "column":
        if fld == "trellis":
            return FieldCut(1, first // TILE, last // TILE)
        if fld in ("svh", "bias"):
            return FieldCut(0, first, last)
        if fld == "sv":  # legacy packed signs, 16 channels per int16 (§1.3)
            return FieldCut(0, first // TILE, last // TILE)
        return WHOLE
    if role == "row":
        if fld == "trellis":
            return FieldCut(0, first // TILE, last // TILE)
        if fld == "suh":
            return FieldCut(0, first, last)
        if fld == "su":
            return FieldCut(0, first // TILE, last // TILE)
        if fld == "bias":  # the all-reduce sums partials: add the bias once (§6)
            return FieldCut(None, present=first == 0)
        return WHOLE
    raise ValueError(f"unknown role {role!r}; choose one of {ROLES}")


def field_size(role: str, fld: str, shape: tuple[int, ...]) -> int | None:
    """Channels along the split dimension that a field's shape implies, if it is sliced."""
    cut = field_cut(role, fld, 0, 0)
    if cut.axis is None or len(shape) <= cut.axis:
        return None
    unit = TILE if fld in ("trellis", "su", "sv") else 1
    return shape[cut.axis] * unit


def slice_linear(
    arrays: Mapping[str, np.ndarray], role: str, start: int, stop: int
) -> dict[str, np.ndarray]:
    """One rank's arrays of an EXL3 linear `{field: array}` for channels [start, stop): numpy
    views (no copy); fields the rank does not hold (row-parallel bias off rank 0) are omitted."""
    if start % 128 or stop % 128 or not 0 <= start < stop:
        raise ValueError(f"range [{start}, {stop}) must be non-empty and on 128-channel boundaries")
    out: dict[str, np.ndarray] = {}
    for fld, a in arrays.items():
        cut = field_cut(role, fld, start, stop)
        if not cut.present:
            continue
        if cut.axis is None:
            out[fld] = a
            continue
        if cut.stop > a.shape[cut.axis]:
            raise ValueError(f"{fld}: range ends at {cut.stop} beyond axis {cut.axis} of {a.shape}")
        index = [slice(None)] * a.ndim
        index[cut.axis] = slice(cut.start, cut.stop)
        out[fld] = a[tuple(index)]
    return out
