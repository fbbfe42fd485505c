"""CUDA path: bit-identical with the CPU path and with exllamav3 itself (GPU only)."""

from __future__ import annotations

import pytest
import torch

from exl3tool import trellis as tc

pytestmark = pytest.mark.cuda

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

COMBOS = [(K, cb) for K in (1, 2, 3, 4, 5, 6, 7, 8) for cb in tc.CODEBOOKS] + [
    (1.5, "mul1"),
    (2.5, "mul1"),
    (3.5, "mul1"),
]


def _rand_trellis(k, n, K, seed, device="cuda"):
    g = torch.Generator(device="cpu").manual_seed(seed)
    t = torch.randint(
        -32768, 32768, (k // 16, n // 16, int(16 * K)), dtype=torch.int16, generator=g
    )
    return t.to(device)


def _rand_scales(size, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return (
        (torch.rand(size, generator=g) * 2 + 0.25)
        .mul(torch.randint(0, 2, (size,), generator=g) * 2 - 1)
        .half()
    )


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.cpu().view(torch.int16), b.cpu().view(torch.int16))


@pytest.mark.parametrize(("K", "cb"), COMBOS)
def test_cuda_rotated_matches_cpu(K, cb):
    t = _rand_trellis(256, 640, K, seed=int(K * 10))
    cpu = tc.decode_rotated(t.cpu(), cb)
    assert _same(tc.decode_rotated(t, cb), cpu)
    assert _same(tc.decode_rotated(t, cb, backend="torch"), cpu)
    assert _same(tc.decode_rotated(t, cb, rows=(16, 128), cols=(128, 384)), cpu[16:128, 128:384])
    assert torch.equal(tc.unpack(t).cpu(), tc.unpack(t.cpu()))
    st = tc.unpack(t)
    assert torch.equal(tc.pack(st, K), t)


@pytest.mark.parametrize(("K", "cb"), [(2, "mcg"), (4, "mul1"), (7, "3inst")])
def test_cuda_repeat_call_relaunch(K, cb):
    """Repeat whole-matrix calls into `out` (the relaunch path) decode each new trellis; a call
    that differs in shape, dtype or codebook goes through the checks again."""
    from exl3tool.trellis import _triton

    out = torch.empty(256, 384, dtype=torch.float16, device="cuda")
    for seed in range(3):
        t = _rand_trellis(256, 384, K, seed=50 + seed)
        assert tc.decode_rotated(t, cb, out=out) is out
        assert _same(out, tc.decode_rotated(t.cpu(), cb)), seed
    assert _triton._plans, "no call was kept for relaunch"
    with pytest.raises(tc.TrellisError):
        tc.decode_rotated(t, cb, out=torch.empty(256, 368, dtype=torch.float16, device="cuda"))
    with pytest.raises(tc.TrellisError):
        tc.decode_rotated(t.to(torch.int32), cb, out=out)
    other = "mcg" if cb != "mcg" else "mul1"
    tc.decode_rotated(t, other, out=out)
    assert _same(out, tc.decode_rotated(t.cpu(), other))


@pytest.mark.parametrize(("K", "cb"), [(4, "mul1"), (2.5, "mul1"), (3, "mcg"), (6, "3inst")])
def test_cuda_effective_matches_cpu(K, cb):
    t = _rand_trellis(512, 768, K, seed=7)
    suh, svh = _rand_scales(512, 1), _rand_scales(768, 2)
    for method in ("auto", "fma", "fused"):
        cpu = tc.effective_weight(t.cpu(), suh, svh, cb, method=method)
        gpu = tc.effective_weight(t, suh.cuda(), svh.cuda(), cb, method=method)
        assert _same(gpu, cpu), method
    x = torch.randn(33, 512).half()
    assert _same(tc.had_r_128(x.cuda(), suh.cuda()), tc.had_r_128(x, suh))
    assert _same(tc.had_r_128(x.cuda(), None, suh.cuda()), tc.had_r_128(x, None, suh))


@pytest.mark.parametrize(
    ("K", "cb"), [(2, "mcg"), (3, "mcg"), (4, "mul1"), (5, "mcg"), (3.5, "mul1")]
)
def test_cuda_fused_kernel_matches_fma_order(K, cb):
    """The fused W_eff kernel evaluates §5.4's sequential-FMA order: equal to the CPU reference,
    whole and on 128-aligned TP slices, alone and grouped."""
    t = _rand_trellis(384, 640, K, seed=11)
    suh, svh = _rand_scales(384, 3), _rand_scales(640, 4)
    ref = tc.effective_weight(t.cpu(), suh, svh, cb, method="fma")
    assert _same(tc.effective_weight(t, suh.cuda(), svh.cuda(), cb, method="kernel"), ref)
    part = tc.effective_weight(
        t, suh.cuda(), svh.cuda(), cb, rows=(128, 384), cols=(256, 512), method="kernel"
    )
    assert _same(part, ref[128:384, 256:512])
    others = [_rand_trellis(384, 640, K, seed=20 + i) for i in range(3)]
    items = [(t, suh.cuda(), svh.cuda())] + [(o, suh.cuda(), svh.cuda()) for o in others]
    grouped = tc.effective_weights(items, cb)
    assert _same(grouped[0], ref)
    for o, w in zip(others, grouped[1:], strict=True):
        assert _same(w, tc.effective_weight(o.cpu(), suh, svh, cb, method="fma"))


@pytest.mark.parametrize(("k", "n"), [(2048, 6144), (6144, 2048)])
def test_cuda_fused_kernel_expert_shapes(k, n):
    """Expert-sized matrices: the kernel equals the order-exact emulation run on the GPU."""
    t = _rand_trellis(k, n, 4, seed=k)
    suh, svh = _rand_scales(k, 5).cuda(), _rand_scales(n, 6).cuda()
    kern = tc.effective_weight(t, suh, svh, "mcg", method="kernel")
    assert _same(kern, tc.effective_weight(t, suh, svh, "mcg", method="fma"))


@pytest.mark.parametrize(("K", "cb"), [(3, "mcg"), (5, "mul1")])
def test_cuda_weight_forms(K, cb):
    """Both forms of the fused kernel, where the dot form is taken, equal the FMA emulation."""
    from exl3tool.trellis import _triton_group
    from exl3tool.trellis.bitstream import _check_trellis
    from exl3tool.trellis.hadamard import hadamard_matrix

    t = _rand_trellis(384, 640, K, seed=12)
    suh, svh = _rand_scales(384, 8).cuda(), _rand_scales(640, 9).cuda()
    ref = tc.effective_weight(t, suh, svh, cb, method="fma")
    had = hadamard_matrix("cuda")
    forms = (False, True) if _triton_group.dot_matches(t.device, had) else (False,)
    for dot in forms:
        out = torch.empty(384, 640, dtype=torch.float16, device="cuda")
        _triton_group.weight_group([t], [suh], [svh], [out], had, cb, _check_trellis(t), dot=dot)
        assert _same(out, ref), dot


def test_cuda_warmup_compiles_the_rates_and_changes_no_bits():
    """The warm-up compiles each rate's W_eff variant (in parallel where Triton can); the decode
    after it takes the compiled variant and gives the FMA emulation's bits."""
    from exl3tool.trellis import _triton_group
    from exl3tool.trellis.hadamard import hadamard_matrix

    assert _triton_group.warm_weights(torch.device("cuda"), [3, 5]) == [3, 5]
    warmed = {(v[1].bits, v[3]) for v in _triton_group._launched if v[0].type == "cuda"}
    dot = _triton_group.dot_matches(torch.device("cuda", 0), hadamard_matrix("cuda"))
    assert {(3, dot), (5, dot), (4, False)} <= warmed, warmed
    t = _rand_trellis(384, 640, 5, seed=14)
    suh, svh = _rand_scales(384, 15).cuda(), _rand_scales(640, 16).cuda()
    ref = tc.effective_weight(t, suh, svh, "mcg", method="fma")
    assert _same(tc.effective_weight(t, suh, svh, "mcg", method="kernel"), ref)


def test_cuda_grouped_decode_matches_single():
    """One grouped launch over mixed shapes and rates equals one decode per matrix."""
    ts = [_rand_trellis(2048, 512, K, seed=30 + i) for i, K in enumerate((2, 3, 3, 5, 2))]
    ts.append(_rand_trellis(512, 384, 4, seed=40))
    for cb in ("mcg", "mul1", "3inst"):
        many = tc.decode_rotated_many(ts, cb)
        for t, w in zip(ts, many, strict=True):
            assert _same(w, tc.decode_rotated(t.cpu(), cb))


def _ext():
    pytest.importorskip("exllamav3")
    from exllamav3.ext import exllamav3_ext

    return exllamav3_ext


@pytest.mark.exllamav3
@pytest.mark.parametrize(("K", "cb"), COMBOS)
def test_cuda_matches_exllamav3(K, cb):
    ext = _ext()
    from exllamav3.modules.quant.exl3 import LinearEXL3

    mcg, mul1 = cb == "mcg", cb == "mul1"
    for k, n, seed in ((256, 512, 1), (1024, 2304, 2)):
        t = torch.randint(
            -32768, 32768, (k // 16, n // 16, int(16 * K)), dtype=torch.int16, device="cuda"
        )
        ref = torch.empty((k, n), dtype=torch.half, device="cuda")
        ext.reconstruct(ref, t, float(K), mcg, mul1)
        assert _same(tc.decode_rotated(t, cb), ref)
        assert _same(tc.decode_rotated(t.cpu(), cb), ref)
        suh = (torch.randn(k, device="cuda") + 0.1).half()
        svh = (torch.randn(n, device="cuda") + 0.1).half()
        lin = LinearEXL3(
            None,
            k,
            n,
            suh=suh,
            svh=svh,
            trellis=t,
            mcg=torch.tensor(-877912083, dtype=torch.int32) if mcg else None,
            mul1=torch.tensor(-2082680531, dtype=torch.int32) if mul1 else None,
        )
        assert _same(tc.effective_weight(t, suh, svh, cb), lin.get_weight_tensor())
        fused = torch.empty((k, n), dtype=torch.half, device="cuda")
        ext.reconstruct_had_slice(fused, t, suh, svh, float(K), mcg, mul1, 0)
        assert _same(tc.effective_weight(t, suh, svh, cb, method="fused"), fused)
        x = torch.randn(17, n, device="cuda").half()
        y = torch.empty_like(x)
        ext.had_r_128(x, y, None, svh, 1.0)
        assert _same(tc.had_r_128(x, None, svh), y)
        u = torch.empty((k // 16, n // 16, 256), dtype=torch.int16, device="cuda")
        if float(K).is_integer():
            ext.unpack_trellis(u, t, int(K))
        else:
            ext.unpack_trellis_frac(u, t, int(K), 0xAAAA)
        assert torch.equal(tc.unpack(t), u.to(torch.int32) & 0xFFFF)
        del seed
