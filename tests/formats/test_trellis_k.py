"""formats/exl3.k_of_last_dim: K of a trellis last dimension (docs/formats/exl3.md §1)."""

from __future__ import annotations

from fractions import Fraction

from exl3tool.formats.exl3 import HALF_K, k_of_last_dim


def _reference(last: int) -> float | int | None:
    """The rule in exact rationals: K = last / 16, an integer 1..8 or one of HALF_K."""
    if last % 8:
        return None
    k = Fraction(last, 16)
    if k.denominator == 1 and 1 <= k <= 8:
        return int(k)
    return float(k) if float(k) in HALF_K else None


def test_k_of_last_dim_is_the_rational_rule() -> None:
    for last in range(-64, 4097):
        got, want = k_of_last_dim(last), _reference(last)
        assert got == want and type(got) is type(want), last


def test_k_values() -> None:
    assert [k_of_last_dim(16 * k) for k in range(1, 9)] == list(range(1, 9))
    assert [k_of_last_dim(n) for n in (24, 40, 56)] == [1.5, 2.5, 3.5]
    assert [k_of_last_dim(n) for n in (0, 8, 72, 144, 12, 17)] == [None] * 6
