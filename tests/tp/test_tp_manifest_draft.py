"""The manifest is rendered while the pass runs, with placeholders for what the pass produces
(tp/writer.py `_Draft`); the bytes written equal a rendering of the final manifest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exl3tool.tp.configs import MANIFEST_NAME, dump_json
from exl3tool.tp.run import SliceOptions, slice_artifact
from exl3tool.tp.writer import _Draft


@pytest.mark.parametrize(
    ("src", "opts"),
    [
        ("r7", SliceOptions(2, sha256=True, max_shard_size=100_000)),
        ("r7", SliceOptions(4, layout="rank-sliced")),
        ("base", SliceOptions(2, mode="expert")),
    ],
)
def test_written_manifest_is_the_rendered_manifest(
    sources: dict[str, Path], tmp_path: Path, src: str, opts: SliceOptions
) -> None:
    outcome = slice_artifact(sources[src], tmp_path / "o", opts)
    assert outcome.manifest is not None
    text = (tmp_path / "o" / MANIFEST_NAME).read_bytes()
    assert text == dump_json(outcome.manifest, depth=4)
    assert b"exl3tool-pending-" not in text
    for rec in outcome.manifest["files"]:
        path = tmp_path / "o" / rec["path"]
        assert rec["size"] == path.stat().st_size


def test_a_placeholder_found_twice_renders_again() -> None:
    """A value that happens to contain a placeholder (the source path, say) is left alone."""
    draft = _Draft()
    rec: dict = {"path": "a"}
    draft.slot(rec, "size", lambda: 12)
    draft.slot(rec, "blake3", lambda: "ab" * 32)
    doc = {"source": {"path": f"/x/{rec['size']}", "also": rec["blake3"]}, "files": [rec]}
    text = dump_json(doc, depth=4)
    out = draft.fill(doc, text)
    assert out == dump_json(doc, depth=4)
    got = json.loads(out)
    assert got["files"] == [{"path": "a", "size": 12, "blake3": "ab" * 32}]
    assert got["source"]["also"].startswith("exl3tool-pending-")


@pytest.mark.parametrize("depth", [1, 2, 3, 4, 8])
def test_every_scalar_renders_as_its_placeholder_did(depth: int) -> None:
    """At any depth (indented or inline), in objects and arrays alike."""
    values = [None, 0, 2**40, "", 'é"\\\n\x01', "ab" * 32]
    draft = _Draft()
    doc: dict = {"deep": {"a": [{"x": {}} for _ in values]}, "top": {}}
    for i, v in enumerate(values):
        draft.slot(doc["deep"]["a"][i]["x"], "v", lambda v=v: v)
        draft.slot(doc["top"], f"k{i}", lambda v=v: v)
    out = draft.fill(doc, dump_json(doc, depth=depth))
    assert out == dump_json(doc, depth=depth)
    assert json.loads(out)["top"] == {f"k{i}": v for i, v in enumerate(values)}


@pytest.mark.parametrize("layout", ["per-rank", "rank-sliced"])
def test_each_manifest_entry_is_its_slice_and_file(
    sources: dict[str, Path], tmp_path: Path, layout: str
) -> None:
    outcome = slice_artifact(sources["r7"], tmp_path / "o", SliceOptions(2, layout=layout))
    assert outcome.manifest is not None and outcome.plan is not None
    for rp, rank in zip(outcome.plan.ranks, outcome.manifest["ranks"], strict=True):
        entries = rank["tensors"]
        assert list(entries) == [s.target_name for s in rp.slices]
        for s in rp.slices:
            entry = dict(entries[s.target_name])
            assert entry.pop("file").endswith(".safetensors")
            assert entry == s.to_json()  # the same keys, in the same order
            assert list(entry) == list(s.to_json())
