"""The files a slice carries beside its shards: a side file that is a looping or dangling link is
left behind, not a traceback (found by the fuzz campaign's slice entry)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from exl3tool.formats.checkpoint import load_checkpoint
from exl3tool.rules.registry import Findings
from exl3tool.tp.configs import carried_files
from exl3tool.tp.run import SliceOptions, slice_artifact


@pytest.mark.parametrize("link", ["loop", "dangling", "file"])
def test_side_files_are_regular_files_or_links_to_one(
    sources: dict[str, Path], tmp_path: Path, link: str
) -> None:
    src = tmp_path / "src"
    shutil.copytree(sources["exl3"], src)
    (src / "notes.txt").write_text("kept")
    target = {"loop": "tokenizer.json", "dangling": "nowhere.json", "file": "notes.txt"}[link]
    os.symlink(target, src / "tokenizer.json")
    ckpt = load_checkpoint(src, Findings())
    carried = carried_files(ckpt)
    assert "notes.txt" in carried and "config.json" in carried
    assert ("tokenizer.json" in carried) is (link == "file")
    out = tmp_path / "out"
    slice_artifact(src, out, SliceOptions(tp=2))
    assert (out / "rank-0" / "notes.txt").read_text() == "kept"
    assert (out / "rank-1" / "tokenizer.json").exists() is (link == "file")
