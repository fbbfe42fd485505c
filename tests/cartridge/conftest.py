"""Tiny MSRT artifacts shared by the cartridge tests (built once per session)."""

from __future__ import annotations

from pathlib import Path

import pytest

from exl3tool.synth.msrt import build_adapter, build_base


@pytest.fixture(scope="session")
def msrt(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("msrt")
    base = build_base(root / "base", hidden=128, intermediate=256)
    sparse = [[0, 1, 2, 3], {3: [0, 2], 4: [1]}]
    return {
        "base": base,
        "full": build_adapter(root / "full", base, experts=sparse),
        "sharded": build_adapter(
            root / "sharded", base, experts=sparse, layout="rank-sharded", world_size=2
        ),
        "layer_sparse": build_adapter(
            root / "layer_sparse",
            base,
            chain=(("a", 1), ("b", 2)),
            experts=[[0, 1, 2, 3], {4: [0]}],
        ),
    }
