from __future__ import annotations

from pathlib import Path

import pytest
import tp_fixtures as fx


@pytest.fixture(scope="session")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tp-sources")
    b = fx.base(root / "base")
    return {
        "exl3": fx.exl3(root / "exl3"),
        "r7": fx.r7(root / "r7"),
        "r7-mixed": fx.r7(root / "r7-mixed", uniform=False),
        "base": b,
        "cartridge": fx.cartridge(root / "cartridge", b),
    }
