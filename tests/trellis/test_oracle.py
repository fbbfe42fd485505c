"""exl3tool vs the committed exllamav3 1.6.5 oracle vectors: bit for bit, every (K, codebook)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import trellis_oracle_inputs as inp
from oracle_check import compute, describe

from exl3tool import trellis as tc

DATA = Path(__file__).resolve().parents[1] / "data"
ORACLE = json.loads((DATA / "oracle_trellis.json").read_text())
CASES = ORACLE["cases"]


def test_oracle_complete():
    assert ORACLE["meta"]["errors"] == []
    assert not any("error" in c for c in CASES)
    rot = {(c["K"], c["codebook"], c["k"], c["n"]) for c in CASES if c["kind"] == "rot"}
    for K, cb in inp.COMBOS:
        for shape in ((256, 384), (16, 512), (1024, 768)):
            assert (K, cb, *shape) in rot
    assert {c["kind"] for c in CASES} == {"lut", "rot", "rot_slice", "unpack", "pack", "eff", "had"}


@pytest.mark.parametrize("case", CASES, ids=describe)
def test_oracle_case(case):
    got = compute(case)
    for key, value in got.items():
        assert value == case[key], f"{describe(case)}: {key} differs from exllamav3"


def test_oracle_full_arrays():
    """The few stored full outputs, element by element (0 mismatches)."""
    arrays = np.load(DATA / "oracle_trellis_arrays.npz")
    by_key = {}
    for c in CASES:
        if c["kind"] in ("rot", "eff"):
            by_key[(c["kind"], c["K"], c["codebook"], c["k"], c["n"])] = c
    checked = 0
    for name in arrays.files:
        ref = arrays[name]
        if name.startswith("had_"):
            continue
        kind, shape, k_part, cb = name.split("_")[1:] if name.startswith("w_") else (None,) * 4
        k, n = (int(x) for x in shape.split("x"))
        K = float(k_part[1:])
        K = int(K) if K.is_integer() else K
        case = by_key[("rot" if kind == "rot" else "eff", K, cb, k, n)]
        tr = torch.from_numpy(inp.trellis_np(case["seed"], k, n, K))
        if kind == "rot":
            got = tc.decode_rotated(tr, cb)
        else:
            suh = torch.from_numpy(inp.scales_np(case["scale_seed"], k))
            svh = torch.from_numpy(inp.scales_np(case["scale_seed"] + 1, n))
            got = tc.effective_weight(
                tr, suh, svh, cb, method="fused" if kind == "fused" else "auto"
            )
        mism = int((got.numpy().view(np.uint16) != ref.view(np.uint16)).sum())
        assert mism == 0, f"{name}: {mism} mismatching elements"
        checked += 1
    assert checked >= 6
