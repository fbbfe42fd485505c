"""Synthetic checkpoints built once per session; tests mutate copies."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))


@pytest.fixture(scope="session")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from make_examples import r7_tiny_spec

    from exl3tool.synth.exl3 import build_exl3
    from exl3tool.synth.r7 import build_r7, build_rank_sliced

    root = tmp_path_factory.mktemp("pristine")
    return {
        "r7": build_r7(root / "r7", r7_tiny_spec()),
        "exl3": build_exl3(root / "exl3", shards=2),
        "rank-sliced": build_rank_sliced(root / "rank-sliced"),
    }
