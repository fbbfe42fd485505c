"""Runtime tables (§1.3, §7): stage compaction, bit tables, FP32 inverse scales, fallback pointers."""

from __future__ import annotations

import numpy as np
import pytest

from exl3tool.formats.cartridge import load_cartridge
from exl3tool.formats.cartridge_tables import TablesError, inverse_scale, materialize_tables
from exl3tool.formats.names import PROJECTIONS
from exl3tool.io.views import TensorReader
from exl3tool.rules.registry import Findings


def load(p):
    f = Findings()
    c = load_cartridge(p, f)
    assert not list(f)
    return c


def test_full_tables(msrt):
    cart = load(msrt["full"])
    tables = materialize_tables(cart, num_experts=4)
    assert sorted(tables) == [3, 4]
    t = tables[3]
    assert t.stages == ["k3", "k4"] and t.bits.dtype == np.int32 and list(t.bits) == [1, 1]
    assert t.max_residual_bits == 1
    with TensorReader() as rd:
        for p in PROJECTIONS:
            inv = t.inverse_scale[p]
            assert inv.dtype == np.float32 and inv.shape == (2, 4)
            # sparse entries of stage k4 (layer 3 covers experts 0, 2) are 0.0
            assert inv[1, 1] == 0.0 and inv[1, 3] == 0.0
            for s, label in enumerate(t.stages):
                for e in range(4):
                    name = t.tensor_name[p][s][e]
                    if name is None:
                        continue
                    ref = cart.keys[name.replace("trellis_", "scale_")]
                    scale = float(rd.array(ref.shard, ref.info))
                    assert inv[s, e] == np.float32(1.0 / scale)
                    assert label in name
            # fallback pointer: the first present expert of that stage and projection
            assert t.pointer_name[p][1][1] == t.tensor_name[p][1][0]
            assert t.present(p).sum(axis=1).tolist() == [4, 2]


def test_stage_compaction_and_earlier_stage_fallback(msrt):
    tables = materialize_tables(load(msrt["layer_sparse"]), num_experts=4)
    assert tables[3].stages == ["a"] and list(tables[3].bits) == [1]
    assert tables[4].stages == ["a", "b"] and list(tables[4].bits) == [1, 2]
    assert tables[4].max_residual_bits == 2


def test_incomplete_stage_expert_is_refused(msrt):
    cart = load(msrt["full"])
    t = materialize_tables(cart, num_experts=4)[3]
    # stage k4 without its gate_proj tensors: "Incomplete MSRT cartridge expert stages"
    from exl3tool.formats import cartridge_tables as tb

    slots = {
        k: v
        for k, v in tb._keys_for_rank(cart, 0, 1)[3].items()
        if not (k[0] == "k4" and k[1] == "gate_proj")
    }
    with TensorReader() as rd, pytest.raises(TablesError, match="Incomplete"):
        tb.materialize_layer(cart, 3, slots, 4, rd)
    assert t.pointer_name["gate_proj"][0][0].endswith("trellis_k3")


def test_sharded_tables_per_rank(msrt):
    cart = load(msrt["sharded"])
    full = materialize_tables(load(msrt["full"]), num_experts=4)
    for r in (0, 1):
        t = materialize_tables(cart, rank=r, world_size=2, num_experts=4)
        for L in (3, 4):
            for p in PROJECTIONS:
                assert np.array_equal(t[L].inverse_scale[p], full[L].inverse_scale[p])
                assert all(
                    n is None or f".rank{r}." in n for row in t[L].tensor_name[p] for n in row
                )
    with pytest.raises(TablesError, match="does not match runtime TP"):
        materialize_tables(cart, rank=0, world_size=4)
    with pytest.raises(TablesError, match="rank=2, size=2"):
        materialize_tables(cart, rank=2, world_size=2)


def test_inverse_scale_rules():
    assert inverse_scale(4.0) == 0.25
    for bad in (0.0, -1.0, float("nan"), float("inf"), 1e-40):
        with pytest.raises(TablesError):
            inverse_scale(bad)


def test_summary_is_json(msrt):
    import json

    t = materialize_tables(load(msrt["full"]), num_experts=4)
    s = json.loads(json.dumps(t[4].summary()))
    assert s["present"]["down_proj"] == [4, 1] and len(s["inverse_scale_sha256"]["up_proj"]) == 64
