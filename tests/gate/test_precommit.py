"""The `exl3tool-validate` pre-commit hook: its definition, run as pre-commit would run it."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from exl3tool.actions.gate.precommit import ARTIFACT_FILES, artifact_dirs

from .conftest import REPO


def hook() -> dict:
    (h,) = [h for h in yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())
            if h["id"] == "exl3tool-validate"]  # fmt: skip
    assert h["language"] == "python" and h["pass_filenames"] is True
    return h


def staged(root: Path) -> list[str]:
    """The files of `root` pre-commit would pass: `files` is matched with re.search."""
    pattern = re.compile(hook()["files"])
    rels = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    return [r for r in rels if pattern.search(r)]


def run_hook(root: Path, files: list[str]) -> subprocess.CompletedProcess[str]:
    argv = shlex.split(hook()["entry"]) + list(hook().get("args", [])) + files
    if argv[0] == "python":  # pre-commit runs the entry inside the hook's virtualenv
        argv[0] = sys.executable
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}
    env.pop("GITHUB_ACTIONS", None)
    return subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=120)


def test_files_pattern_selects_configs_and_manifests() -> None:
    pattern = re.compile(hook()["files"])
    for name in (*ARTIFACT_FILES, "r7-experts-layer-003.json"):
        assert pattern.search(f"models/x/{name}") and pattern.search(name), name
    for name in ("model.safetensors", "README.md", "myconfig.json", "config.json.bak"):
        assert not pattern.search(f"models/x/{name}"), name


def test_hook_passes_on_the_examples(tmp_path: Path) -> None:
    for name in ("r7-tiny", "msrt-base-tiny", "cartridge-k3k4"):
        shutil.copytree(REPO / "examples" / name, tmp_path / name)
    files = staged(tmp_path)
    assert {"r7-tiny/config.json", "cartridge-k3k4/adapter_config.json"} <= set(files)
    run = run_hook(tmp_path, files)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("OK: 0 errors") == 1  # one report, each artifact validated once


def test_hook_fails_on_a_broken_config(tmp_path: Path) -> None:
    shutil.copytree(REPO / "examples" / "r7-tiny", tmp_path / "m")
    (tmp_path / "m" / "quantization_config.json").write_text('{"quant_method": "exl3",')
    run = run_hook(tmp_path, ["m/quantization_config.json", "m/config.json"])
    assert run.returncode == 1
    assert "m/quantization_config.json" in run.stdout and "JS001" in run.stdout


def test_artifact_dirs_dedups_and_skips_foreign_configs(tmp_path: Path) -> None:
    shutil.copytree(REPO / "examples" / "r7-tiny", tmp_path / "m")
    (tmp_path / "web").mkdir()
    (tmp_path / "web" / "config.json").write_text('{"port": 80}')
    os.chdir(tmp_path)
    try:
        dirs, notes = artifact_dirs(
            ["m/config.json", "m/MANIFEST.json", "web/config.json", "gone/config.json"]
        )
    finally:
        os.chdir(REPO)
    assert dirs == [Path("m")]
    assert notes == ["skipped web: not an EXL3/R7/MSRT artifact",
                     "skipped gone/config.json: its directory does not exist"]  # fmt: skip
