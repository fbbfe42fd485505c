"""The grouped Triton kernels under Triton's CPU interpreter (runs where triton is installed).

The interpreter emulates the FMA in float64, as the CPU reference does, so this checks the
kernels' indexing, block scratch and TP offsets without a GPU; the GPU run (test_cuda.py) checks
the true-FMA build. A subprocess, because TRITON_INTERPRET must be set before triton loads.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

SCRIPT = textwrap.dedent(
    """
    import torch
    from exl3tool import trellis as tc

    def same(a, b):
        return a.shape == b.shape and torch.equal(a.view(torch.int16), b.view(torch.int16))

    g = torch.Generator().manual_seed(5)
    for K, cb in ((2, "mcg"), (3, "mul1"), (4, "3inst"), (2.5, "mul1")):
        ts = [torch.randint(-32768, 32768, (16, 24, int(16 * K)), dtype=torch.int16, generator=g)
              for _ in range(2)]
        suh = torch.randn(256, generator=g).half()
        svh = torch.randn(384, generator=g).half()
        for t in ts:
            ref = tc.effective_weight(t, suh, svh, cb, method="fma")
            assert same(tc.effective_weight(t, suh, svh, cb, method="kernel"), ref), (K, cb)
            part = tc.effective_weight(t, suh, svh, cb, rows=(128, 256), cols=(128, 384),
                                       method="kernel")
            assert same(part, ref[128:256, 128:384]), (K, cb, "slice")
        from exl3tool.trellis import _triton_group
        from exl3tool.trellis.bitstream import _check_trellis
        outs = torch.empty(len(ts), 256, 384, dtype=torch.float16)
        _triton_group.decode_group(ts, outs, tc.check_rate_codebook(_check_trellis(ts[0]), cb),
                                   _check_trellis(ts[0]))
        for t, o in zip(ts, outs):
            assert same(o, tc.decode_rotated(t, cb, backend="torch")), (K, cb, "decode")
        # W_eff of several matrices in one grouped launch, each with its own scales
        from exl3tool.trellis.hadamard import hadamard_matrix
        sus = [torch.randn(256, generator=g).half() for _ in ts]
        svs = [torch.randn(384, generator=g).half() for _ in ts]
        outs = [torch.empty(256, 384, dtype=torch.float16) for _ in ts]
        rate = _check_trellis(ts[0])
        _triton_group.weight_group(ts, sus, svs, outs, hadamard_matrix("cpu"),
                                   tc.check_rate_codebook(rate, cb), rate)
        for t, su, sv, o in zip(ts, sus, svs, outs):
            assert same(o, tc.effective_weight(t, su, sv, cb, method="fma")), (K, cb, "group")
    # the per-matrix decode kernel, every rate
    for words, cb in ((16, "mcg"), (24, "mul1"), (48, "3inst"), (56, "mul1"), (128, "mcg")):
        t = torch.randint(-32768, 32768, (8, 16, words), dtype=torch.int16, generator=g)
        assert same(tc.decode_rotated(t, cb, backend="triton"),
                    tc.decode_rotated(t, cb, backend="torch")), (words, cb)
    # partial programs (tile rows and columns past the edge), TP-style slices (row stride), K > 5
    for words, cb in ((32, "mcg"), (96, "mul1"), (40, "mul1")):
        t = torch.randint(-32768, 32768, (5, 5, words), dtype=torch.int16, generator=g)
        ref = tc.decode_rotated(t, cb, backend="torch")
        assert same(tc.decode_rotated(t, cb, backend="triton"), ref), (words, cb, "edge")
        part = tc.decode_rotated(t, cb, rows=(16, 64), cols=(32, 80), backend="triton")
        assert same(part, ref[16:64, 32:80]), (words, cb, "slice")
    # the public grouped calls over mixed shapes and rates: one launch per (shape, K)
    mix = [torch.randint(-32768, 32768, shape, dtype=torch.int16, generator=g)
           for shape in ((16, 24, 32), (8, 16, 48), (16, 24, 32), (8, 16, 32))]
    for t, w in zip(mix, tc.decode_rotated_many(mix, "mcg")):
        assert same(w, tc.decode_rotated(t, "mcg", backend="torch")), "many"
    items = [(t, torch.randn(16 * t.shape[0], generator=g).half(),
              torch.randn(16 * t.shape[1], generator=g).half()) for t in mix]
    for (t, su, sv), w in zip(items, tc.effective_weights(items, "mcg")):
        assert same(w, tc.effective_weight(t, su, sv, "mcg", method="fma")), "weights"
    # the warm-up: it launches each rate's variant once and records it as launched; a rate it
    # cannot build (K 9) ends it without an error
    from exl3tool.trellis import _triton_group
    assert not any(v[1].bits == 5 for v in _triton_group._launched)
    assert _triton_group.warm_weights(torch.device("cpu"), [3, 5, 9, 2]) == [3, 5]
    warmed = {(v[1].bits, v[2], v[3]) for v in _triton_group._launched}
    assert {(3, 1, False), (5, 1, False)} <= warmed, warmed
    # a build whose every config decodes wrongly falls back to the torch path, same bits
    from exl3tool.trellis import _triton
    _triton._best.clear()
    _triton.same_bits = lambda a, b: False
    for words, cb in ((32, "mcg"), (48, "mul1")):
        t = torch.randint(-32768, 32768, (8, 16, words), dtype=torch.int16, generator=g)
        ref = tc.decode_rotated(t, cb, backend="torch")
        assert same(tc.decode_rotated(t, cb, backend="triton"), ref), (words, cb, "fallback")
        assert same(tc.decode_rotated_many([t, t.clone()], cb)[1], ref), (words, cb, "group")
    assert all(v is None for v in _triton._best.values())
    print("ok")
    """
)


def test_kernels_under_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")
