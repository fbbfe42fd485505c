"""Range arithmetic: properties of every split, and the refusals (TP001, TP002)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exl3tool.rules import tp as tp_rules
from exl3tool.tp.ranges import (
    SplitError,
    channel_ranges,
    expert_ranges,
    intermediate_ranges,
    unit_ranges,
)


def _tiles(ranges: list[tuple[int, int]], size: int) -> None:
    """Contiguous, disjoint, non-empty, covering [0, size) exactly."""
    assert ranges[0][0] == 0 and ranges[-1][1] == size
    for (_, b), (c, _) in itertools.pairwise(ranges):
        assert b == c
    assert all(a < b for a, b in ranges)


@given(st.integers(1, 64), st.integers(1, 16))
def test_intermediate_ranges_are_equal_128_aligned_and_cover(blocks: int, tp: int) -> None:
    size = 128 * blocks
    try:
        ranges = intermediate_ranges(size, tp)
    except SplitError as exc:
        assert blocks % tp != 0
        assert exc.rule is tp_rules.TP_CUTS_HADAMARD
        return
    assert len(ranges) == tp
    _tiles(ranges, size)
    assert len({b - a for a, b in ranges}) == 1
    assert all(a % 128 == 0 and b % 128 == 0 for a, b in ranges)


@given(st.integers(1, 64), st.integers(1, 16))
def test_channel_ranges_are_128_aligned_even_and_cover(blocks: int, tp: int) -> None:
    size = 128 * blocks
    try:
        ranges = channel_ranges(size, tp)
    except SplitError as exc:
        assert blocks < tp and exc.rule is tp_rules.TP_EMPTY_RANK
        return
    _tiles(ranges, size)
    widths = [b - a for a, b in ranges]
    assert all(w % 128 == 0 for w in widths) and max(widths) - min(widths) <= 128


@given(st.integers(1, 300), st.integers(1, 16))
def test_expert_ranges_contiguous_as_even_as_possible(n: int, tp: int) -> None:
    try:
        ranges = expert_ranges(n, tp)
    except SplitError as exc:
        assert n < tp and exc.rule is tp_rules.TP_EMPTY_RANK
        return
    _tiles(ranges, n)
    counts = [b - a for a, b in ranges]
    assert max(counts) - min(counts) <= 1 and counts == sorted(counts, reverse=True)


def test_refusals_name_the_sizes() -> None:
    with pytest.raises(SplitError, match="384 over 2 ranks gives 192") as exc:
        intermediate_ranges(384, 2)
    assert exc.value.rule is tp_rules.TP_CUTS_HADAMARD
    with pytest.raises(SplitError) as exc:
        intermediate_ranges(1, 2)
    assert exc.value.rule is tp_rules.TP_EMPTY_RANK
    with pytest.raises(SplitError, match="3 experts over 4 ranks"):
        expert_ranges(3, 4)
    with pytest.raises(SplitError) as exc:
        channel_ranges(200, 2)
    assert exc.value.rule is tp_rules.TP_CUTS_HADAMARD
    assert unit_ranges(5, 2) == [(0, 3), (3, 5)]
    with pytest.raises(ValueError):
        intermediate_ranges(256, 0)
