"""org/name[@revision] resolution on a synthetic Hugging Face cache (offline, HF_HUB_CACHE)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from exl3tool.actions.gate.hf import HfRef, cache_dir, parse_hf_id, resolve
from exl3tool.rules.registry import Findings

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OLD = "fedcba9876543210fedcba9876543210fedcba98"


def make_cache(root: Path, artifact: Path | None = None) -> Path:
    """models--org--name with two snapshots; refs/main -> COMMIT, refs/v1 -> OLD."""
    repo = root / "models--org--name"
    for rev in (COMMIT, OLD):
        snap = repo / "snapshots" / rev
        if artifact is not None and rev == COMMIT:
            shutil.copytree(artifact, snap)
        else:
            snap.mkdir(parents=True)
            (snap / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    (repo / "refs" / "v1").write_text(OLD)
    return root


@pytest.mark.parametrize(
    ("arg", "ref"),
    [
        ("org/name", HfRef("org/name", None)),
        ("org/name@main", HfRef("org/name", "main")),
        ("Org-1/Name_2.5@refs/pr/3", HfRef("Org-1/Name_2.5", "refs/pr/3")),
        ("org", None),
        ("org/name/extra", None),
        ("./org/name", None),
        ("../org", None),
        ("/abs/path", None),
        ("org/..", None),
        ("-org/name", None),
    ],
)
def test_parse_hf_id(arg: str, ref: HfRef | None) -> None:
    assert parse_hf_id(arg) == ref


def test_an_existing_local_path_is_never_an_hf_id(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert parse_hf_id("org/name") is None


def test_cache_dir_follows_the_environment_at_call_time(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"


@pytest.mark.parametrize("rev", [None, "main", COMMIT, COMMIT[:10], "v1"])
def test_resolves_refs_commits_and_short_commits(tmp_path: Path, monkeypatch, rev) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(make_cache(tmp_path / "hub")))
    findings = Findings()
    got = resolve(HfRef("org/name", rev), findings)
    want = OLD if rev == "v1" else COMMIT
    assert not findings
    assert got == tmp_path / "hub" / "models--org--name" / "snapshots" / want


@pytest.mark.parametrize(
    ("ref", "says"),
    [
        (HfRef("org/other", None), "nothing of it is cached"),
        (HfRef("org/name", "v2"), f"cached revisions: {COMMIT[:12]} (main), {OLD[:12]} (v1)"),
        (HfRef("org/name", "f" * 40), "cached revisions"),
    ],
)
def test_not_cached_is_a_gt003_finding(tmp_path: Path, monkeypatch, ref: HfRef, says: str) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(make_cache(tmp_path / "hub")))
    findings = Findings()
    assert resolve(ref, findings) is None
    (f,) = findings
    assert f.code == "GT003" and str(ref) in f.message and says in f.message


def test_empty_cache_dir_is_a_gt003_finding(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "absent"))
    findings = Findings()
    assert resolve(HfRef("org/name", None), findings) is None
    assert findings.codes() == {"GT003"}


def test_without_huggingface_hub_gt004(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import raises ImportError
    findings = Findings()
    assert resolve(HfRef("org/name", None), findings) is None
    assert findings.codes() == {"GT004"}
