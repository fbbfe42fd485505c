"""Synthetic MSRT bases and adapters: deterministic bytes, correct identities, a realistic ladder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from exl3tool.checks.base import check_base
from exl3tool.checks.cartridge import check_cartridge
from exl3tool.checks.options import ValidateOptions
from exl3tool.formats import msrt_spec as spec
from exl3tool.formats.checkpoint import load_checkpoint
from exl3tool.formats.detect import Kind, detect
from exl3tool.rules.registry import Findings
from exl3tool.synth.msrt import build_adapter, build_base
from exl3tool.synth.msrt_dense import build_dense_reference
from exl3tool.synth.msrt_edit import read_tensors


def files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return build_base(tmp_path_factory.mktemp("s") / "base", hidden=128, intermediate=256)


def test_deterministic(base, tmp_path):
    again = build_base(tmp_path / "b2", hidden=128, intermediate=256)
    assert files(again) == files(base)
    a1 = build_adapter(tmp_path / "a1", base)
    a2 = build_adapter(tmp_path / "a2", base)
    assert files(a1) == files(a2)
    assert files(build_base(tmp_path / "b3", hidden=128, intermediate=256, seed=1)) != files(base)


def test_base_is_valid_with_recomputed_identity(base):
    assert detect(base) is Kind.MSRT_BASE
    f = Findings()
    check_base(load_checkpoint(base, f), f, ValidateOptions(hash=True))
    assert not list(f), [(x.code, x.message) for x in f]


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"experts": [[0, 1, 2], [1]], "layers": [4]},
        {
            "chain": (("s1", 2), ("s2", 3), ("s3", 1)),
            "stage_rms": (0.3, 0.1, 0.03),
            "chain_experts": "all",
        },
        {"layout": "rank-sharded", "world_size": 2},
    ],
)
def test_adapters_are_valid(base, tmp_path, kw):
    a = build_adapter(tmp_path / "a", base, **kw)
    assert detect(a) is Kind.CARTRIDGE
    f = Findings()
    check_cartridge(a, f, ValidateOptions(base=base, hash=True, tp=kw.get("world_size", 1)))
    assert not list(f), [(x.code, x.message) for x in f]


def test_scales_give_a_falling_ladder(base, tmp_path):
    """Each correction recon(T_s)/scale_s has about stage_rms[s] x the base weight's RMS."""
    import torch

    from exl3tool.trellis.weight import effective_weight

    a = build_adapter(tmp_path / "a", base, stage_rms=(0.3, 0.1))
    bt = read_tensors(base / "model-layer-003.safetensors")
    at = read_tensors(a / "model-layer-003-b000.safetensors")
    for proj in ("gate_proj", "down_proj"):
        t, su, sv = (
            torch.from_numpy(bt[spec.base_key(3, 1, proj, c)]) for c in ("trellis", "suh", "svh")
        )
        w = effective_weight(t, su, sv, "mcg").float()
        rms = float(w.pow(2).mean().sqrt())
        for label, target in (("k3", 0.3), ("k4", 0.1)):
            ts = torch.from_numpy(at[spec.stage_key(3, 1, proj, 0, "trellis", label)])
            scale = float(at[spec.stage_key(3, 1, proj, 0, "scale", label)])
            corr = effective_weight(ts, su, sv, "mcg").float() / scale
            ratio = float(corr.pow(2).mean().sqrt()) / rms
            assert target * 0.8 < ratio < target * 1.25, (proj, label, ratio)


def test_dense_reference(base, tmp_path):
    a = build_adapter(tmp_path / "a", base, experts=[[0, 1, 2, 3], [0]], layers=[3])
    ref = read_tensors(build_dense_reference(tmp_path / "ref.safetensors", base, a, noise=0.0))
    assert len(ref) == 4 * 3
    w = ref["model.layers.3.mlp.experts.0.down_proj.weight"]
    assert w.dtype == np.float16 and w.shape == (128, 256)  # HF [out, in]
    assert np.isfinite(w).all()
