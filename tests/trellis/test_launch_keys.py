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


def test_direct_start_passes_what_tritons_launcher_would():
    """The direct start calls the compiled launcher with the arguments Triton's own
    CudaLauncher.__call__ forwards to it (its source of truth: that very method, run here on a
    stand-in that records the call)."""
    import pytest

    driver = pytest.importorskip("triton.backends.nvidia.driver")

    class Recorder:
        __call__ = driver.CudaLauncher.__call__  # Triton's forwarding code, unchanged

        def __init__(self):
            self.global_scratch_size = self.profile_scratch_size = 0
            self.global_scratch_align = self.profile_scratch_align = 1
            self.num_ctas, self.launch_cooperative_grid, self.launch_pdl = 1, False, True
            self.calls = []

        def launch(self, *args):
            self.calls.append(args)

    class Kernel:
        def __init__(self):
            self.run, self.function, self.packed_metadata = Recorder(), 1234, ("meta",)

    kernel = Kernel()
    fn, head = _triton._starter(kernel)
    assert fn == kernel.run.launch, "the direct start was not taken"
    args = (0xABC0, 0xDEF0, 0xABC0, 128, 6144, 6144, 32, 2, False, 1, 4, 1, 128, False)
    fn(3, 4, 5, 99, *head, *args)
    kernel.run(3, 4, 5, 99, kernel.function, kernel.packed_metadata, None, None, None, *args)
    direct, forwarded = kernel.run.calls
    assert direct == forwarded

    kernel.run.global_scratch_size = 64  # scratch memory: Triton's call must allocate it
    assert _triton._starter(kernel)[0] is kernel.run
