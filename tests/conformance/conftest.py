"""Runtime-conformance tests: each fixture is one artifact the serving runtime refuses (or loads),
built from the bundled examples or the synthetic builders; tests mutate copies."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "checks"))
sys.path.insert(0, str(ROOT / "tests" / "conformance"))
sys.path.insert(0, str(ROOT / "examples"))


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from exl3tool.synth.exl3 import build_exl3
    from exl3tool.synth.msrt import build_adapter, build_base
    from exl3tool.synth.r7 import build_rank_sliced

    root = tmp_path_factory.mktemp("conformance")
    base = build_base(root / "sharded-base", hidden=128, intermediate=256)
    return {
        "sharded-cartridge": build_adapter(
            root / "sharded", base, experts=[[0, 1], [0, 1]], layout="rank-sharded", world_size=2
        ),
        "rank-sliced-k2": build_rank_sliced(root / "rs-k2", bits=2),
        "rank-sliced-k3": build_rank_sliced(root / "rs-k3", bits=3),
        "sparse-base": build_base(root / "sparse-base", layers=(3, 10)),
        "exl3": build_exl3(root / "exl3", shards=2),
    }
