"""`io.paths.open_inside(links=...)` and `link_escape`: which symlinks are read like files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from exl3tool.io.paths import PathViolation, link_escape, open_inside

from .conftest import cache_layout


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """art/ with links: inside (file and directory), outside (file and directory), dangling."""
    art, out = tmp_path / "art", tmp_path / "out"
    (art / "in").mkdir(parents=True)
    out.mkdir()
    (art / "in" / "f").write_text("in")
    (out / "f").write_text("out")
    (art / "to-in").symlink_to("in/f")
    (art / "dir-in").symlink_to("in")
    (art / "to-out").symlink_to(out / "f")
    (art / "dir-out").symlink_to(out)
    (art / "dangling").symlink_to(art / "nothing")
    return art


def read(root: Path, rel: str, links: str) -> str:
    fd = open_inside(root, rel, links=links)  # type: ignore[arg-type]
    with os.fdopen(fd) as fh:
        return fh.read()


@pytest.mark.parametrize("rel", ["to-in", "dir-in/f", "to-out", "dir-out/f", "dangling"])
def test_no_link_is_followed_by_default(tree: Path, rel: str) -> None:
    with pytest.raises(PathViolation) as exc:
        open_inside(tree, rel)
    assert exc.value.kind == "symlink"


@pytest.mark.parametrize(("rel", "text"), [("to-in", "in"), ("dir-in/f", "in"), ("in/f", "in")])
def test_cache_mode_reads_links_inside(tree: Path, rel: str, text: str) -> None:
    assert read(tree, rel, "cache") == text


@pytest.mark.parametrize(("rel", "kind"), [("to-out", "symlink"), ("dir-out/f", "symlink"), ("dangling", "missing")])  # fmt: skip
def test_cache_mode_refuses_links_that_leave(tree: Path, rel: str, kind: str) -> None:
    with pytest.raises(PathViolation) as exc:
        open_inside(tree, rel, links="cache")
    assert exc.value.kind == kind


def test_any_mode_follows_every_link(tree: Path) -> None:
    assert read(tree, "to-out", "any") == read(tree, "dir-out/f", "any") == "out"


def test_links_into_the_hub_cache_blobs_are_files(tmp_path: Path, tree: Path) -> None:
    snap = cache_layout(tree / "in", tmp_path / "hub", "org/x")
    assert (snap / "f").is_symlink()
    assert read(snap, "f", "cache") == "in"
    assert link_escape(snap, snap / "f") is None
    (snap / "g").symlink_to(tree.parent / "out" / "f")  # leaves the snapshot and the cache
    assert "outside the artifact" in (link_escape(snap, snap / "g") or "")


def test_link_escape(tree: Path) -> None:
    assert link_escape(tree, tree / "in" / "f") is None  # not a link
    assert link_escape(tree, tree / "to-in") is None
    assert link_escape(tree, tree / "dangling") is None  # reported as missing by readers
    assert link_escape(tree, tree / "to-out") is not None
