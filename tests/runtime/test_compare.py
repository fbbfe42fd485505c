"""Bit-level comparison of tensors: equal bits are equal (NaN too), a difference is located."""

import math

import torch

from exl3tool.runtime.compare import compare


def test_equal_bits_are_equal_with_zero_error_even_with_nan() -> None:
    a = torch.tensor([1.0, float("nan"), -0.0], dtype=torch.float16)
    d = compare(a, a.clone(), "w")
    assert (d.equal, d.max_abs, d.rel_l2, d.first_difference) == (True, 0.0, 0.0, None)


def test_signed_zero_differs_in_bits() -> None:
    d = compare(torch.tensor([0.0]), torch.tensor([-0.0]), "w")
    assert d.equal is False and d.max_abs == 0.0 and d.first_difference["index"] == [0]


def test_first_difference_max_abs_and_relative_error() -> None:
    want = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    got = want.clone()
    got[1, 2] += 0.5
    got[2, 3] -= 2.0
    d = compare(got, want, "layer 3 W_eff")
    assert d.equal is False and d.max_abs == 2.0
    assert math.isclose(d.rel_l2, math.sqrt(0.25 + 4.0) / float(want.double().norm()))
    assert d.first_difference == {
        "where": "layer 3 W_eff",
        "index": [1, 2],
        "got": 6.5,
        "want": 6.0,
    }


def test_shape_or_dtype_mismatch_is_an_infinite_difference() -> None:
    d = compare(torch.zeros(2, 3), torch.zeros(3, 2), "w")
    assert d.equal is False and d.max_abs == math.inf
    assert compare(torch.zeros(2), torch.zeros(2, dtype=torch.float16), "w").equal is False
