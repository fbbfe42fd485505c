"""Bitstream round trips, slicing, errors and the Hadamard fast path."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from exl3tool import trellis as tc
from exl3tool.trellis import hadamard

ALL_K = [1, 2, 3, 4, 5, 6, 7, 8, 1.5, 2.5, 3.5]


def _trellis(seed: int, tiles_k: int, tiles_n: int, K: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    shape = (tiles_k, tiles_n, int(16 * K))
    return torch.randint(-32768, 32768, shape, dtype=torch.int16, generator=g)


@settings(max_examples=40, deadline=None)
@given(K=st.sampled_from(ALL_K), seed=st.integers(0, 2**31), tiles=st.integers(1, 6))
def test_pack_unpack_identity(K, seed, tiles):
    t = _trellis(seed, 1, tiles, K)
    states = tc.unpack(t)
    assert states.shape == (1, tiles, 256)
    assert int(states.min()) >= 0 and int(states.max()) <= 0xFFFF
    assert torch.equal(tc.pack(states, K), t)
    assert torch.equal(tc.unpack(tc.pack(states, K)), states)


@settings(max_examples=25, deadline=None)
@given(
    K=st.sampled_from(ALL_K),
    seed=st.integers(0, 2**31),
    tk=st.integers(1, 5),
    tn=st.integers(1, 5),
    data=st.data(),
)
def test_slice_decode_is_slice_of_full(K, seed, tk, tn, data):
    cb = "mul1" if int(K) != K else data.draw(st.sampled_from(tc.CODEBOOKS))
    t = _trellis(seed, tk, tn, K)
    full = tc.decode_rotated(t, cb)
    r0 = data.draw(st.integers(0, tk - 1))
    r1 = data.draw(st.integers(r0 + 1, tk))
    c0 = data.draw(st.integers(0, tn - 1))
    c1 = data.draw(st.integers(c0 + 1, tn))
    part = tc.decode_rotated(t, cb, rows=(16 * r0, 16 * r1), cols=slice(16 * c0, 16 * c1))
    assert torch.equal(
        part.view(torch.int16), full[16 * r0 : 16 * r1, 16 * c0 : 16 * c1].view(torch.int16)
    )


def test_decode_matches_states_and_permutation():
    t = _trellis(3, 2, 3, 3)
    vals = tc.decode_states(tc.unpack(t), "mcg")  # [2, 3, 256] in position order
    perm = torch.tensor(tc.tc_perm())
    tiles = torch.empty_like(vals)
    tiles[..., perm] = vals
    expect = tiles.view(2, 3, 16, 16).permute(0, 2, 1, 3).reshape(32, 48)
    assert torch.equal(tc.decode_rotated(t, "mcg"), expect)


def test_effective_weight_slices():
    t = _trellis(5, 16, 16, 4)
    g = torch.Generator().manual_seed(9)
    suh, svh = torch.randn(256, generator=g).half(), torch.randn(256, generator=g).half()
    full = tc.effective_weight(t, suh, svh, "mul1")
    part = tc.effective_weight(t, suh, svh, "mul1", rows=(128, 256), cols=(0, 128))
    assert torch.equal(part, full[128:, :128])
    with pytest.raises(tc.TrellisError, match="128-channel"):
        tc.effective_weight(t, suh, svh, "mul1", cols=(0, 64))


def test_fma_matches_matmul_when_used():
    """The matmul fast path is only taken where it equals the FMA emulation: assert it here."""
    t = _trellis(11, 16, 24, 3)
    g = torch.Generator().manual_seed(2)
    suh, svh = torch.randn(256, generator=g).half(), torch.randn(384, generator=g).half()
    fma = tc.effective_weight(t, suh, svh, "3inst", method="fma")
    auto = tc.effective_weight(t, suh, svh, "3inst")
    assert torch.equal(auto.view(torch.int16), fma.view(torch.int16))
    if tc.matmul_matches_fma("cpu"):
        mm = tc.effective_weight(t, suh, svh, "3inst", method="matmul")
        assert torch.equal(mm.view(torch.int16), fma.view(torch.int16))


@pytest.mark.parametrize(
    ("words", "cb", "match"),
    [
        (40, "mcg", "only defined for the mul1"),
        (24, "3inst", "only defined for the mul1"),
        (20, "mul1", "not 16·K"),
        (144, "mul1", "not 16·K"),
        (32, "q4", "unknown codebook"),
    ],
)
def test_bad_rate_or_codebook(words, cb, match):
    t = torch.zeros((1, 1, words), dtype=torch.int16)
    with pytest.raises(tc.TrellisError, match=match):
        tc.decode_rotated(t, cb)


def test_bad_inputs():
    with pytest.raises(tc.TrellisError, match="int16"):
        tc.decode_rotated(torch.zeros((1, 1, 32), dtype=torch.int32), "mul1")
    with pytest.raises(tc.TrellisError, match="tile boundaries"):
        tc.decode_rotated(torch.zeros((2, 2, 32), dtype=torch.int16), "mul1", rows=(0, 8))
    with pytest.raises(tc.TrellisError, match="suh"):
        tc.effective_weight(
            torch.zeros((8, 8, 32), dtype=torch.int16),
            torch.zeros(64).half(),
            torch.zeros(128).half(),
            "mul1",
        )
    with pytest.raises(tc.TrellisError, match="multiple of 128"):
        tc.had_r_128(torch.zeros((2, 64), dtype=torch.float16))
    assert issubclass(tc.TrellisError, ValueError)


def test_codebook_markers():
    assert tc.codebook_from_markers(False, False) == "3inst"
    assert tc.codebook_from_markers(True, False) == "mcg"
    assert tc.codebook_from_markers(False, True) == "mul1"
    with pytest.raises(tc.TrellisError):
        tc.codebook_from_markers(True, True)


def test_had_r_128_self_inverse_ish():
    x = torch.randn(4, 256).half()
    y = tc.had_r_128(tc.had_r_128(x))
    assert torch.allclose(y.float(), x.float(), atol=2e-2)
    assert pytest.approx(0.0883883461356163) == hadamard.HAD_SCALE_F32
