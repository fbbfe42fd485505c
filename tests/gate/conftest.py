"""Artifacts and a CLI runner for the gate's tests (tiny synthetic artifacts, built once)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


@dataclass(frozen=True)
class Artifacts:
    r7: Path
    base: Path
    cartridge: Path


@pytest.fixture(scope="session")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Artifacts:
    from exl3tool.synth.msrt import build_adapter, build_base
    from exl3tool.synth.r7 import build_r7

    root = tmp_path_factory.mktemp("gate-synth")
    base = build_base(root / "base")
    return Artifacts(
        r7=build_r7(root / "r7"), base=base, cartridge=build_adapter(root / "cart", base)
    )


@pytest.fixture
def copy_of(tmp_path: Path):
    """A private copy of an artifact directory (tests corrupt copies, never the originals)."""

    def make(src: Path, name: str | None = None) -> Path:
        dst = tmp_path / (name or src.name)
        shutil.copytree(src, dst)
        return dst

    return make


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch):
    """Run `exl3tool ARGS` in-process; stdout and stderr kept apart."""
    from exl3tool.cli.main import app

    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)

    def run(*args: str, env: dict[str, str] | None = None) -> Run:
        result = CliRunner().invoke(app, [str(a) for a in args], env=env, catch_exceptions=False)
        return Run(result.exit_code, result.stdout, result.stderr)

    return run


_MEMO: dict[tuple, Run] = {}


def run_cli(args: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> Run:
    """`exl3tool ARGS` in-process from `cwd`; identical invocations (same arguments, cwd and
    environment) run once per session, since the slow ones (verify-swap) are shared by the
    workflow and docs tests."""
    import os

    from exl3tool.cli.main import app

    key = (tuple(args), str(cwd), tuple(sorted((env or {}).items())))
    if key not in _MEMO:
        old = Path.cwd()
        os.chdir(cwd)
        try:
            full_env = {"GITHUB_ACTIONS": None, **(env or {})}
            result = CliRunner().invoke(app, args, env=full_env, catch_exceptions=False)
        finally:
            os.chdir(old)
        _MEMO[key] = Run(result.exit_code, result.stdout, result.stderr)
    return _MEMO[key]


def sarif_errors(log: dict) -> list[str]:
    """Problems of a SARIF log against schemas/sarif-2.1.0-subset.schema.json (written from the
    SARIF 2.1.0 specification; the official schema is not vendored)."""
    import json

    import jsonschema

    schema = json.loads((REPO / "exl3tool/schemas/sarif-2.1.0-subset.schema.json").read_text())
    return [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(log)]


@pytest.fixture(scope="session")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scratch checkout: a copy of examples/, where documented commands run verbatim."""
    return workspace_dir(tmp_path_factory)


def workspace_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    global _WORKSPACE
    if _WORKSPACE is None:  # one per session, even where a test module re-imports the fixture
        ws = tmp_path_factory.mktemp("workspace")
        shutil.copytree(
            EXAMPLES, ws / "examples", ignore=shutil.ignore_patterns("*.py", "__pycache__")
        )
        _WORKSPACE = ws
    return _WORKSPACE


_WORKSPACE: Path | None = None
