"""Range arithmetic of TP splits (docs/formats/exl3.md §6; docs/formats/r7.md §3.4, §7.1).

All channel ranges are in units of 128 channels: a slice boundary must not cut a 128-wide
Hadamard block. Impossible splits raise `SplitError` carrying the rule that refuses them.
"""

from __future__ import annotations

from exl3tool.rules import tp as tp_rules
from exl3tool.rules.registry import Rule

HAD = 128  # Hadamard block width = TP channel granularity


class SplitError(ValueError):
    """A split that the TP rules refuse; `rule` is TP001 or TP002."""

    def __init__(self, rule: Rule, message: str) -> None:
        super().__init__(message)
        self.rule = rule

    def __reduce__(self) -> tuple[type[SplitError], tuple[Rule, str]]:
        # a rank process hands it to the parent by pickle (verify-swap --tp N)
        return (type(self), (self.rule, str(self)))


def _check_tp(tp: int) -> None:
    if type(tp) is not int or tp < 1:
        raise ValueError(f"TP size must be a positive integer, got {tp!r}")


def intermediate_ranges(size: int, tp: int) -> list[tuple[int, int]]:
    """N equal, 128-aligned channel ranges of an expert intermediate size (R7/vLLM: start r·I, size I).

    Raises SplitError when size/N is not a positive multiple of 128.
    """
    _check_tp(tp)
    if size // tp == 0:
        raise SplitError(
            tp_rules.TP_EMPTY_RANK, f"size {size} over {tp} ranks leaves a rank with no channels"
        )
    if size % (HAD * tp):
        raise SplitError(
            tp_rules.TP_CUTS_HADAMARD,
            f"size {size} over {tp} ranks gives {size / tp:g} channels per rank, "
            f"not a multiple of {HAD}",
        )
    per = size // tp
    return [(r * per, (r + 1) * per) for r in range(tp)]


def even_counts(total: int, tp: int) -> list[int]:
    """`total` items over `tp` ranks, as even as possible, the first ranks taking the remainder."""
    _check_tp(tp)
    base, extra = divmod(total, tp)
    return [base + (1 if r < extra else 0) for r in range(tp)]


def unit_ranges(units: int, tp: int, what: str = "units") -> list[tuple[int, int]]:
    """Contiguous ranges of whole units, as even as possible; refuses a rank with none."""
    if units < tp:
        raise SplitError(
            tp_rules.TP_EMPTY_RANK, f"{units} {what} over {tp} ranks leaves a rank with none"
        )
    out, pos = [], 0
    for c in even_counts(units, tp):
        out.append((pos, pos + c))
        pos += c
    return out


def expert_ranges(num_experts: int, tp: int) -> list[tuple[int, int]]:
    """Whole experts per rank (expert parallel): contiguous [first, last), as even as possible."""
    return unit_ranges(num_experts, tp, "experts")


def channel_ranges(size: int, tp: int, unit: int = HAD) -> list[tuple[int, int]]:
    """Dense-module channel ranges in whole `unit`-channel blocks, as even as possible
    (exllamav3's TP allocation with equal shares; uneven splits allowed, empty ranks refused)."""
    if size % unit:
        raise SplitError(
            tp_rules.TP_CUTS_HADAMARD,
            f"size {size} is not a multiple of the {unit}-channel split unit",
        )
    return [
        (a * unit, b * unit) for a, b in unit_ranges(size // unit, tp, f"{unit}-channel blocks")
    ]
