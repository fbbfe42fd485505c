"""Decoding agreement: the effective weight decoded from each rank's slice is exactly the matching
slice of the full effective weight (docs/formats/exl3.md §5.2, §6), for column- and row-parallel."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import tp_fixtures as fx

from exl3tool.formats.exl3 import codebook_of, group_linears
from exl3tool.io.views import TensorReader
from exl3tool.tp.linear import slice_linear
from exl3tool.tp.plan import plan_slices
from exl3tool.tp.ranges import intermediate_ranges
from exl3tool.trellis.weight import effective_weight

SAMPLE = {
    "model.layers.1.mlp.experts.0.gate_proj": "column",
    "model.layers.1.mlp.experts.1.up_proj": "column",
    "model.layers.1.mlp.experts.2.down_proj": "row",
}


def _w(arrays: dict[str, np.ndarray], codebook: str) -> np.ndarray:
    t = {k: torch.from_numpy(np.array(v)) for k, v in arrays.items()}
    return effective_weight(t["trellis"], t["suh"], t["svh"], codebook).numpy()


@pytest.mark.parametrize("tp", [2, 4])
def test_rank_weights_are_slices_of_the_full_weight(
    sources: dict[str, Path], tmp_path: Path, tp: int
) -> None:
    src = fx.build_exl3(tmp_path / "x", hidden=128, kv_dim=128, intermediate=512, moe_intermediate=512,
                        n_experts=3, k_values=(2,), codebook="mcg")  # fmt: skip
    ckpt = fx.load(src)
    plan = plan_slices(ckpt, "exl3", tp)
    groups = group_linears(ckpt.tensors)
    with TensorReader() as rd:
        for prefix, role in SAMPLE.items():
            g = groups[prefix]
            arrays = {f: rd.array(r.shard, r.info) for f, r in g.parts.items() if f != "mcg"}
            cb = codebook_of(g.parts)
            full = _w(arrays, cb)
            size = full.shape[1] if role == "column" else full.shape[0]
            for r, (a, b) in enumerate(intermediate_ranges(size, tp)):
                # the plan's cut of this rank equals slice_linear's views
                rank = {s.source: s for s in plan.ranks[r].slices}
                sl = slice_linear(arrays, role, a, b)
                assert rank[f"{prefix}.trellis"].shape == sl["trellis"].shape
                part = _w(sl, cb)
                want = full[:, a:b] if role == "column" else full[a:b, :]
                assert part.view(np.uint16).tobytes() == want.view(np.uint16).tobytes()
