"""Tiny synthetic MSRT bases and cartridges for the runtime tests (built once per session)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from exl3tool.synth.msrt import build_adapter, build_base
from exl3tool.synth.msrt_dense import build_dense_reference


@dataclass(frozen=True)
class Artifacts:
    base: Path
    a: Path  # 2 stages (K3, K4), sparse: stage 2 covers fewer experts
    b: Path  # 1 stage on layer 3 only (swap A -> B releases layer 4)
    dense: Path


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Artifacts:
    root = tmp_path_factory.mktemp("runtime")
    base = build_base(root / "base", layers=(3, 4), experts=4, hidden=256, intermediate=256, k=2)
    a = build_adapter(
        root / "a", base, chain=(("k3", 3), ("k4", 4)), experts=[[0, 1, 2], [0, 1]], seed=0
    )
    b = build_adapter(root / "b", base, chain=(("k3", 3),), layers=[3], seed=1, assembly="other")
    dense = build_dense_reference(root / "dense.safetensors", base, a)
    return Artifacts(base, a, b, dense)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny GEMMs: one thread is fastest, and oversubscribed OpenMP on a busy host is very slow."""
    import torch

    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)
