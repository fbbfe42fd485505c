"""`exl3tool check`: exit codes, usage errors, HF ids, output conventions."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from exl3tool.cli.main import app

REPO = Path(__file__).resolve().parents[2]
R7 = REPO / "examples" / "r7-tiny"


def run(*args: str, cwd: Path, env: dict | None = None):
    import os

    old = Path.cwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(
            app, ["check", *args], env={"GITHUB_ACTIONS": None, **(env or {})}
        )
    finally:
        os.chdir(old)


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    r = run(cwd=tmp_path)
    assert r.exit_code == 2 and "nothing to check" in r.stderr
    (tmp_path / "exl3tool.toml").write_text("tp = [")
    r = run(cwd=tmp_path)
    assert r.exit_code == 2 and "not valid TOML" in r.stderr
    assert run(str(R7), "--format", "yaml", cwd=tmp_path).exit_code == 2


def test_missing_path_exits_3(tmp_path: Path) -> None:
    r = run("no-such-dir", cwd=tmp_path)
    assert r.exit_code == 3 and "no-such-dir" in r.stderr


def test_schema_errors_exit_1_and_check_nothing(tmp_path: Path) -> None:
    (tmp_path / "exl3tool.toml").write_text('tp = [2]\nverify = true\n[[artifacts]]\npath = "x"\n')
    r = run("--format", "json", cwd=tmp_path)
    doc = json.loads(r.stdout)
    assert r.exit_code == 1 and {f["code"] for f in doc["findings"]} == {"GT001"}
    assert doc["artifacts"] == [] and "no artifact was checked" in " ".join(doc["notes"])


def test_json_stdout_is_pure_and_notes_go_to_stderr(tmp_path: Path) -> None:
    r = run(str(R7), "--format", "json", cwd=tmp_path)
    assert r.exit_code == 0
    json.loads(r.stdout)
    assert "note: inferred for" in r.stderr
    q = run(str(R7), "--format", "json", "--quiet", cwd=tmp_path)
    assert q.exit_code == 0 and q.stderr == ""


def test_text_quiet_prints_only_the_verdict(tmp_path: Path) -> None:
    r = run(str(R7), "--quiet", cwd=tmp_path, env={"NO_COLOR": "1"})
    assert r.exit_code == 0 and r.stderr == ""
    assert r.stdout.strip().startswith("OK: 0 errors") and "\n" not in r.stdout.strip()


@pytest.fixture
def hf_cache(tmp_path: Path) -> Path:
    """The Hub's real layout: snapshot files are relative symlinks into ../../blobs."""
    commit = "c" * 40
    repo = tmp_path / "hub" / "models--org--r7"
    snap, blobs = repo / "snapshots" / commit, repo / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    for f in sorted(R7.iterdir()):
        blob = blobs / hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copyfile(f, blob)
        (snap / f.name).symlink_to(Path("..", "..", "blobs", blob.name))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return tmp_path / "hub"


def test_hf_id_resolves_offline_from_the_cache(tmp_path: Path, hf_cache: Path) -> None:
    r = run("org/r7@main", "--format", "json", cwd=tmp_path, env={"HF_HUB_CACHE": str(hf_cache)})
    assert r.exit_code == 0, r.stdout
    (art,) = json.loads(r.stdout)["artifacts"]
    assert art["kind"] == "r7" and art["path"].endswith("snapshots/" + "c" * 40)
    assert art["details"]["source"] == "org/r7@main"


def test_hf_id_not_cached_is_a_finding(tmp_path: Path, hf_cache: Path) -> None:
    r = run("org/absent", "--format", "json", cwd=tmp_path, env={"HF_HUB_CACHE": str(hf_cache)})
    assert r.exit_code == 1
    (f,) = json.loads(r.stdout)["findings"]
    assert f["code"] == "GT003" and "org/absent" in f["message"]


def test_a_typo_beside_a_local_folder_is_a_missing_path(tmp_path: Path, hf_cache: Path) -> None:
    """`models/x` next to a local models/ is a misspelt path (GT002), not an uncached Hub id;
    a cached `org/r7` still resolves from the cache when a local org/ exists."""
    (tmp_path / "models").mkdir()
    (tmp_path / "org").mkdir()
    env = {"HF_HUB_CACHE": str(hf_cache)}
    r = run("models/x", "--format", "json", cwd=tmp_path, env=env)
    assert r.exit_code == 1
    (f,) = json.loads(r.stdout)["findings"]
    assert f["code"] == "GT002" and "models/x: no such file or directory" in f["message"]
    r = run("org/r7@main", "--format", "json", cwd=tmp_path, env=env)
    assert r.exit_code == 0, r.stdout
    assert json.loads(r.stdout)["artifacts"][0]["kind"] == "r7"
