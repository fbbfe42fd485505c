"""Recompute one oracle case with exl3tool's trellis codec and compare with exllamav3's hashes.

Shared by tests/trellis/test_oracle.py and benchmarks/make_oracle_vectors.py.
"""

from __future__ import annotations

import numpy as np
import torch
import trellis_oracle_inputs as inp

from exl3tool import trellis as tc


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def compute(case: dict, device: str = "cpu") -> dict[str, str]:
    """sha256 of exl3tool's outputs for the quantities `case` records."""
    kind = case["kind"]
    if kind == "lut":
        return {"sha256": inp.sha(_np(tc.codebook_lut(case["codebook"], device)))}
    if kind == "had":
        x = torch.from_numpy(inp.fp16_np(case["seed"], (case["rows"], case["cols"]))).to(device)
        sc = torch.from_numpy(inp.scales_np(case["seed"] + 1, case["cols"])).to(device)
        mode = case["mode"]
        y = tc.had_r_128(
            x,
            sc if mode == "pre" else None,
            sc if mode == "post" else None,
            case["scale"],
        )
        return {"y": inp.sha(_np(y))}
    K, cb = case["K"], case["codebook"]
    if kind == "pack":
        st = torch.from_numpy(inp.states_np(case["seed"], (4, 6))).to(device)
        return {"packed": inp.sha(_np(tc.pack(st, K)))}
    k, n = case["k"], case["n"]
    tr = torch.from_numpy(inp.trellis_np(case["seed"], k, n, K)).to(device)
    if kind == "rot":
        return {"w_rot": inp.sha(_np(tc.decode_rotated(tr, cb)))}
    if kind == "rot_slice":
        c0 = case["n_offset"]
        w = tc.decode_rotated(tr, cb, cols=(c0, c0 + case["width"]))
        return {"w_rot_slice": inp.sha(_np(w))}
    if kind == "unpack":
        st = tc.unpack(tr).to(torch.int32)
        st = ((st ^ 0x8000) - 0x8000).to(torch.int16)  # exllamav3 returns int16
        return {"states": inp.sha(_np(st))}
    if kind == "eff":
        suh = torch.from_numpy(inp.scales_np(case["scale_seed"], k)).to(device)
        svh = torch.from_numpy(inp.scales_np(case["scale_seed"] + 1, n)).to(device)
        w = tc.effective_weight(tr, suh, svh, cb)
        wf = tc.effective_weight(tr, suh, svh, cb, method="fused")
        return {"w_eff": inp.sha(_np(w)), "w_fused": inp.sha(_np(wf))}
    raise ValueError(f"unknown case kind {kind!r}")


def mismatches(case: dict, device: str = "cpu") -> list[str]:
    """Names of the quantities where exl3tool differs from the recorded exllamav3 hash."""
    if "error" in case:
        return []
    got = compute(case, device)
    return [key for key, value in got.items() if case.get(key) != value]


def describe(case: dict) -> str:
    keys = ("kind", "K", "codebook", "k", "n", "mode", "scale", "rows", "cols")
    return " ".join(f"{k}={case[k]}" for k in keys if k in case)


def check_cases(cases: list[dict], device: str = "cpu") -> list[str]:
    """One line per mismatching case."""
    bad = []
    for case in cases:
        miss = mismatches(case, device)
        if miss:
            bad.append(f"{describe(case)}: {', '.join(miss)}")
    return bad
