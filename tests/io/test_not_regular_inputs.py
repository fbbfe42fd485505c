"""Issue 15 item 6: a FIFO (or a directory) in place of a base's `tier_bitmap.json`, a config or
the index is PA003, not "absent" (it exited 0)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from exl3tool.actions.validate import validate_path
from exl3tool.checks.options import ValidateOptions
from exl3tool.synth.exl3 import build_exl3
from exl3tool.synth.msrt import build_base


def _pa003(art: Path) -> list[str]:
    _, findings = validate_path(art, ValidateOptions(threads=1))
    return [Path(f.location.file).name for f in findings if f.rule.code == "PA003"]


@pytest.mark.parametrize("name", ["tier_bitmap.json", "model.safetensors.index.json"])
@pytest.mark.parametrize("kind", ["fifo", "dir"])
def test_base_file_not_regular(tmp_path: Path, name: str, kind: str) -> None:
    art = build_base(tmp_path / "b")
    (art / name).unlink()
    os.mkfifo(art / name) if kind == "fifo" else (art / name).mkdir()
    assert name in _pa003(art)


def test_exl3_quantization_config_fifo(tmp_path: Path) -> None:
    art = build_exl3(tmp_path / "e")
    p = art / "quantization_config.json"
    p.unlink(missing_ok=True)
    os.mkfifo(p)
    assert "quantization_config.json" in _pa003(art)


def test_regular_files_are_not_pa003(tmp_path: Path) -> None:
    assert _pa003(build_base(tmp_path / "b")) == []
