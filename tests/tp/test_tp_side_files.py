"""The files beside a slice's shards: a side file that is a looping or dangling link is left
behind, not a traceback; the manifest's integers are JSON integers (both found by the fuzz
campaign's slice entries)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from exl3tool.formats.checkpoint import load_checkpoint
from exl3tool.rules.registry import Findings
from exl3tool.tp.configs import MANIFEST_NAME, carried_files
from exl3tool.tp.run import SliceOptions, slice_artifact, verify_output


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


@pytest.mark.parametrize(("key", "value"), [("stop", 8.0), ("start", True), ("axis", 1.0)])
def test_a_manifest_integer_written_as_a_float_is_a_finding(
    sources: dict[str, Path], tmp_path: Path, key: str, value: object
) -> None:
    """JSON Schema's draft calls 8.0 an integer; our manifests do not (the verifier slices with
    it: a TypeError before, found by the fuzz campaign)."""
    out = tmp_path / "out"
    slice_artifact(sources["base"], out, SliceOptions(tp=2))
    doc = json.loads((out / MANIFEST_NAME).read_text())
    rec = next(r for r in doc["ranks"][0]["tensors"].values() if r["axis"] is not None)
    rec[key] = value
    (out / MANIFEST_NAME).write_text(json.dumps(doc))
    findings = verify_output(out, sources["base"])
    assert findings.codes() == {"TP007"}  # the manifest is refused: nothing else is read
    assert [f.location.pointer.rsplit("/", 1)[1] for f in findings] == [key]
