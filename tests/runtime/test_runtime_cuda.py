"""verify-swap on CUDA: one GPU, and TP=2 over NCCL when two GPUs are visible (skip without CUDA)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from exl3tool.runtime.verify import VerifyOptions, run_verify

cuda = pytest.mark.cuda
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
needs_two = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two CUDA GPUs"
)


def _has_exllamav3() -> bool:
    return importlib.util.find_spec("exllamav3") is not None


@cuda
@needs_cuda
def test_verify_swap_on_one_gpu(artifacts) -> None:
    report = run_verify(
        VerifyOptions(
            artifacts.base, artifacts.a, artifacts.b, device="cuda", dense=artifacts.dense
        )
    )
    c = {x.name: x for x in report.checks}
    for name in (
        "hot-load-equals-cold",
        "deactivate-restores-base",
        "failed-load-leaves-base",
        "swap-a-to-b-equals-cold-b",
        "quality-ladder",
    ):
        assert c[name].passed is True, (name, c[name].detail)
    ext = c["exllamav3-agreement"]
    if _has_exllamav3():
        assert ext.passed is True, ext.detail
    else:
        assert ext.passed is None and "skipped" in ext.detail


@cuda
@needs_two
def test_verify_swap_tp2_nccl(artifacts) -> None:
    report = run_verify(VerifyOptions(artifacts.base, artifacts.a, tp=2, device="cuda"))
    c = {x.name: x for x in report.checks}
    assert report.passed, [(x.name, x.detail) for x in report.checks if x.passed is False]
    assert c["tp-weights-concatenate"].passed is True
    assert c["tp-matches-tp1"].passed is True
    assert "2 rank(s)" in c["hot-load-equals-cold"].detail
