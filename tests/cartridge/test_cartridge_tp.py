"""full -> rank-sharded conversion (§8): split, replicate, rewrite, verify."""

from __future__ import annotations

import json

import pytest

from exl3tool.checks.cartridge import check_cartridge
from exl3tool.checks.options import ValidateOptions
from exl3tool.formats import msrt_spec as spec
from exl3tool.formats.cartridge import load_cartridge
from exl3tool.rules.errors import InputError, UsageError
from exl3tool.rules.registry import Findings
from exl3tool.synth.msrt_edit import read_tensors, rewrite_shard
from exl3tool.tp.cartridge import rank_shard_path, shard_cartridge, verify_sharded


@pytest.mark.parametrize("world", [1, 2])
def test_shard_and_verify(msrt, tmp_path, world):
    out = tmp_path / "s"
    m = shard_cartridge(msrt["full"], world, out)
    src = json.loads((msrt["full"] / spec.ADAPTER_CONFIG).read_text())
    assert m["tensor_parallel"] == {
        **src["tensor_parallel"],
        "layout": "rank-sharded",
        "world_size": world,
        "ranks": list(range(world)),
    }
    assert m["num_tensors"] == src["num_tensors"] * world
    for f in ("coverage", "chain", "base", "selected_layers", "selected_experts", "created_utc"):
        assert m[f] == src[f]
    assert not list(verify_sharded(msrt["full"], out))
    f = Findings()
    check_cartridge(out, f, ValidateOptions(base=msrt["base"], tp=world, hash=True))
    assert not list(f), [(x.code, x.message) for x in f]


def test_split_axes(msrt, tmp_path):
    out = tmp_path / "s"
    shard_cartridge(msrt["full"], 2, out)
    full = read_tensors(msrt["full"] / "model-layer-003-b000.safetensors")
    r1 = read_tensors(out / "model-layer-003-b000-rank1.safetensors")
    g = "model.layers.3.mlp.experts.0.gate_proj.rank{}.trellis_k3"
    d = "model.layers.3.mlp.experts.0.down_proj.rank{}.trellis_k3"
    assert (r1[g.format(1)] == full[g.format(0)][:, 8:16, :]).all()
    assert (r1[d.format(1)] == full[d.format(0)][8:16]).all()
    s = "model.layers.3.mlp.experts.0.up_proj.rank{}.scale_k3"
    assert r1[s.format(1)].tobytes() == full[s.format(0)].tobytes()


def test_deterministic(msrt, tmp_path):
    shard_cartridge(msrt["full"], 2, tmp_path / "a")
    shard_cartridge(msrt["full"], 2, tmp_path / "b")
    for p in sorted((tmp_path / "a").iterdir()):
        assert p.read_bytes() == (tmp_path / "b" / p.name).read_bytes()


def test_unsplittable_world_size(msrt, tmp_path):
    with pytest.raises(UsageError, match="multiple of 32"):
        shard_cartridge(msrt["full"], 4, tmp_path / "s")  # intermediate 256 = 16 tiles
    assert not (tmp_path / "s" / spec.ADAPTER_CONFIG).exists()


def test_refuses_sharded_input(msrt, tmp_path):
    with pytest.raises(InputError, match="only a full cartridge"):
        shard_cartridge(msrt["sharded"], 2, tmp_path / "s")


def test_verify_detects_tampered_slice(msrt, tmp_path):
    out = tmp_path / "s"
    shard_cartridge(msrt["full"], 2, out)
    name = "model.layers.3.mlp.experts.0.down_proj.rank1.trellis_k3"

    def flip(t):
        t[name] = t[name].copy()
        t[name][0, 0, 0] ^= 1
        return t

    rewrite_shard(out / "model-layer-003-b000-rank1.safetensors", flip)
    f = verify_sharded(msrt["full"], out)
    assert "CA043" in f.codes()


def test_verify_detects_missing_rank_tensor(msrt, tmp_path):
    out = tmp_path / "s"
    shard_cartridge(msrt["full"], 2, out)
    name = "model.layers.3.mlp.experts.0.up_proj.rank1.scale_k3"
    rewrite_shard(
        out / "model-layer-003-b000-rank1.safetensors",
        lambda t: {k: v for k, v in t.items() if k != name},
    )
    assert "CA040" in verify_sharded(msrt["full"], out).codes()


def test_rank_shard_path():
    assert rank_shard_path("a/b.safetensors", 3) == "a/b-rank3.safetensors"
    assert rank_shard_path("blob", 0) == "blob-rank0"


def test_loaded_cartridge_input(msrt, tmp_path):
    """An already loaded Cartridge shards to the same bytes as its path, and verifies."""
    f = Findings()
    cart = load_cartridge(msrt["full"], f)
    assert cart is not None and not f.has_errors()
    from_model = shard_cartridge(cart, 2, tmp_path / "s")
    from_path = shard_cartridge(msrt["full"], 2, tmp_path / "p")
    assert from_model == from_path
    names = sorted(p.name for p in (tmp_path / "s").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "p").iterdir())
    assert len(names) == 1 + len(from_path["shards"])  # the manifest + one per (shard, rank)
    for name in names:
        assert (tmp_path / "s" / name).read_bytes() == (tmp_path / "p" / name).read_bytes()
    assert not list(verify_sharded(msrt["full"], tmp_path / "s"))
