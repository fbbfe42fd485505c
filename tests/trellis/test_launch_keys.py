"""Kernels kept for a direct relaunch are reused only where Triton would compile the same one."""

import torch

from exl3tool.trellis import _triton


def test_specialization_key_separates_what_triton_specializes():
    words = torch.zeros(64, dtype=torch.int16)
    aligned, offset = words[:32], words[1:33]  # 0 and 2 bytes past a 16-byte boundary
    base = _triton._specialized(aligned, 128, 6144)
    assert _triton._specialized(aligned, 384, 2048) == base  # same divisibility: same kernel
    assert _triton._specialized(offset, 128, 6144) != base  # pointer alignment
    assert _triton._specialized(aligned, 1, 6144) != base  # an integer equal to 1 is a constant
    assert _triton._specialized(aligned, 24, 6144) != base  # not divisible by 16
    assert _triton._specialized(aligned, 1, 6144) != _triton._specialized(aligned, 3, 6144)
