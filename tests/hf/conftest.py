"""A Hugging Face hub cache layout of the bundled examples, built the way `hf download` stores a
snapshot: `models--org--name/blobs/<sha256>` holds the bytes, `snapshots/<commit>/<file>` is a
relative symlink `../../blobs/<sha256>`, `refs/main` names the commit."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NAMES = ("r7-tiny", "msrt-base-tiny", "cartridge-k3k4")
COMMIT = "5e1f0c9d2b7a4e6f8091a2b3c4d5e6f708192a3b"


def cache_layout(src: Path, hub: Path, repo_id: str, commit: str = COMMIT) -> Path:
    """Store `src` as `repo_id` at `commit` in the cache `hub`; returns the snapshot directory."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    for f in sorted(p for p in src.rglob("*") if p.is_file()):
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snap / f.relative_to(src)
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blob, link.parent), link)
    return snap


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hf")
    hub = root / "hub"
    for name in NAMES:
        shutil.copytree(EXAMPLES / name, root / "plain" / name)
        cache_layout(EXAMPLES / name, hub, f"org/{name}")
    return hub


@pytest.fixture(scope="module")
def plain(hub: Path) -> Path:
    return hub.parent / "plain"


def snapshot(hub: Path, name: str) -> Path:
    return hub / f"models--org--{name}" / "snapshots" / COMMIT


@pytest.fixture
def in_cache(hub: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return hub
