"""docs/formats/exl3.md §12 test vectors, reproduced exactly."""

from __future__ import annotations

import hashlib

import pytest
import torch

from exl3tool import trellis as tc


def sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().cpu().numpy().tobytes()).hexdigest()


def bits(t: torch.Tensor) -> list[int]:
    return [int(x) & 0xFFFF for x in t.reshape(-1).view(torch.int16)]


def words_1357(count: int) -> torch.Tensor:
    u = torch.tensor([((i + 1) * 0x1357) % 65536 for i in range(count)], dtype=torch.int32)
    return ((u ^ 0x8000) - 0x8000).to(torch.int16)


# §12.1
LUTS = {
    "3inst": (
        "ad88de2dcff5bb05fff2faec37cceceb43aa1c2e8203f9d81a6fbd6dd3393eea",
        [0x3A25, 0xBB5B, 0x3B74, 0xBA96, 0xB7F8, 0xB110],
    ),
    "mcg": (
        "95383563929baa9d1ae5de0be22490284382673620bdd85929feea7bdbef04a9",
        [0x3F60, 0x304E, 0xBA13, 0x4172, 0xB915, 0x3ACD],
    ),
    "mul1": (
        "bc48d02cb1c14939dc47b90f870dd689d63e3b1ab69a157e65538db68677a6c8",
        [0xC2E8, 0x3921, 0xB72D, 0x3FCA, 0xBAF2, 0xB936],
    ),
}


@pytest.mark.parametrize("cb", sorted(LUTS))
def test_lut(cb):
    lut = tc.codebook_lut(cb)
    digest, spots = LUTS[cb]
    assert lut.dtype == torch.float16 and lut.shape == (65536,)
    assert sha(lut) == digest
    assert bits(lut[[0, 1, 2, 0x7FFF, 0x8000, 0xFFFF]]) == spots


# §12.2
STATES = {
    2: ([0x5E24, 0x7892, 0xE249, 0x8926, 0x249A, 0x926A, 0x49AB, 0x26AE], 0x5789,
        "f221b96818ebb866c2b11361bc12352fc3a841b6851e6a8f91f0cb4ee782e9b9"),
    2.5: ([0xC904, 0x4824, 0x2093, 0x049A, 0x126A, 0x9357, 0x4D5C, 0x6AE1], 0xF241,
          "d6b328bb44ad58d59fe9e52a9a44c7ec0f4c526d617681dab3981ebe3ad6c446"),
    4: ([0x2692, 0x6926, 0x926A, 0x26AE, 0x6AE1, 0xAE13, 0xE135, 0x1357], 0xC269,
        "f8952983c0f46e6e23a69af006a2d96c6d2aa24675eb1ea93e9941a3bc6e9374"),
}  # fmt: skip

TILES = {
    (2, "3inst"): ("d7a7fcd694c1c5c85dc45b1495df0d2c5ae4b046a772a79be4f6c34ccccb9e40", [0xBF33, 0x3118, 0xBDC1, 0x3651]),
    (2, "mcg"): ("ae78291c9aca388b12bc4b9bc97ff07bd4b068ef3fa44d67c22a0d3a2319b775", [0xBEA7, 0x38B5, 0xBD69, 0x3F18]),
    (2, "mul1"): ("b51fa1a85a8f0d4f38609c3d9b677761e6eb5df68a10226067e39606eceb36c3", [0x3D31, 0x404D, 0xB4AF, 0x3BAC]),
    (2.5, "mul1"): ("87bd3f76d26ab1fb4e5b8c771481968f6315baa359829c2e94e6a5a2ed989c83", [0x39E3, 0xBE0B, 0xB711, 0x38DC]),
    (4, "3inst"): ("8adf267d5f71c77c260fef24719f301636aab5a15df01d317a08579154d008cb", [0x406C, 0xB53B, 0xB2BA, 0xBDD9]),
    (4, "mcg"): ("9eadc4c5a25a0c32f073c03eb122c5225bc434bf8b226f699cf1db14596affe4", [0xBD62, 0xB898, 0x3986, 0xBCD1]),
    (4, "mul1"): ("3dfb21dcee73b974af9bc2be973b60e0a86612782041e99afb5313d315882c88", [0x418C, 0x385F, 0xBBC2, 0xB409]),
}  # fmt: skip


@pytest.mark.parametrize("K", sorted(STATES))
def test_one_tile_states(K):
    tile = words_1357(int(16 * K)).view(1, 1, -1)
    first, last, digest = STATES[K]
    st = tc.unpack(tile)[0, 0]
    assert [int(x) for x in st[:8]] == first
    assert int(st[255]) == last
    assert hashlib.sha256(st.numpy().astype("<u2").tobytes()).hexdigest() == digest
    assert torch.equal(tc.pack(st, K), tile[0, 0])


@pytest.mark.parametrize(("K", "cb"), sorted(TILES))
def test_one_tile_values(K, cb):
    tile = words_1357(int(16 * K)).view(1, 1, -1)
    digest, row0 = TILES[(K, cb)]
    w = tc.decode_rotated(tile, cb)
    assert w.shape == (16, 16)
    assert sha(w) == digest
    assert bits(w[0, :4]) == row0


# §12.3
def _linear():
    trellis = words_1357(8 * 16 * 48).view(8, 16, 48)
    r = torch.arange(128)
    suh = ((1 + r / 256) * torch.where(r % 2 == 1, -1.0, 1.0)).half()
    c = torch.arange(256)
    svh = (0.5 + c / 512).half()
    return trellis, suh, svh


def test_linear_inputs():
    _, suh, svh = _linear()
    assert sha(suh) == "5d910900841620b8aae2b2332e4d675d753eab59574350e5ab859ffa014e96e7"
    assert sha(svh) == "491b632e42c9661d0bf87fb148052e124e6908ea8f510e28b733d843d7ebff35"


def test_linear_rotated():
    trellis, _, _ = _linear()
    w = tc.decode_rotated(trellis, "mcg")
    assert sha(w) == "2a86716b9c0413128e424c552339a08a2ebbccb771dc585001fb7558d81ccd97"


@pytest.mark.parametrize("method", ["fma", "matmul", "auto"])
def test_linear_effective(method):
    trellis, suh, svh = _linear()
    if method == "matmul" and not tc.matmul_matches_fma("cpu"):
        pytest.skip("fp32 matmul on this CPU does not follow the sequential-FMA order")
    w = tc.effective_weight(trellis, suh, svh, "mcg", method=method)
    assert sha(w) == "336c5d73c4d371568e9560506d68842940f389daff2298db7f22e428957f7102"
    assert bits(w[0, :4]) == [0x3758, 0xC0D1, 0x4346, 0xB4EC]


def test_linear_fused():
    trellis, suh, svh = _linear()
    w = tc.effective_weight(trellis, suh, svh, "mcg", method="fused")
    assert sha(w) == "6ecfb3669ae3a219f98847ace32226e3332e743182c2d2cb1e4fa68212ec8261"
