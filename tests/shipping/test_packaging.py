"""The package as users get it (issue 12): what the wheel ships and requires, the pre-commit
hook's install settings, and the import detector that .ci/run relies on. The fresh-venv run of
the core commands is .ci/run's (it needs an index for the core dependencies)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("wheel_check", ROOT / ".ci" / "wheel_check.py")
assert spec is not None and spec.loader is not None
wheel_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(wheel_check)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _names(reqs: list[str]) -> set[str]:
    return {re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower() for r in reqs}  # type: ignore[union-attr]


def test_the_core_install_has_no_torch() -> None:
    core = _names(PROJECT["dependencies"])
    assert core >= {"typer", "rich", "numpy", "jsonschema", "blake3", "safetensors", "tomli"}
    assert not core & {"torch", "exllamav3", "triton", "matplotlib", "huggingface_hub"}


def test_runtime_and_cuda_extras() -> None:
    extras = PROJECT["optional-dependencies"]
    (torch,) = extras["runtime"]
    lo, hi = re.fullmatch(r"torch>=([\d.]+),<([\d.]+)", torch).groups()  # type: ignore[union-attr]
    as_tuple = lambda v: tuple(int(x) for x in v.split("."))  # noqa: E731
    assert as_tuple(lo) <= (2, 13, 0) < as_tuple(hi)  # the CPU build on disk satisfies it
    assert "exllamav3==1.6.5" in extras["cuda"] and "exl3tool[runtime]" in extras["cuda"]
    assert {"plot", "hf", "dev"} <= set(extras)


def test_make_installs_the_cpu_torch_first_then_the_runtime_extra() -> None:
    make = (ROOT / "Makefile").read_text()
    first, then = make.index('install -q "torch==2.13.0"'), make.index(".[dev,plot,runtime]")
    assert first < then


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The wheel of a private copy of the sources (setuptools' build/ in the checkout would be
    shared with concurrent runs and could hold stale modules)."""
    src, out = tmp_path_factory.mktemp("src") / "exl3tool", tmp_path_factory.mktemp("dist")
    junk = shutil.ignore_patterns(
        ".git", "build", "dist", "*.egg-info", "__pycache__", ".*cache", ".hypothesis",
        "demo-out", ".bench", ".devcache", ".whl", ".install.stamp",
    )  # fmt: skip
    shutil.copytree(ROOT, src, ignore=junk, symlinks=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(out), str(src)],
        check=True, capture_output=True,
    )  # fmt: skip
    return next(out.glob("exl3tool-*.whl")), src


def test_the_wheel_ships_every_package_file_and_requires_no_torch(wheel: tuple) -> None:
    whl, src = wheel
    wheel_check.contents(whl, src)
    with zipfile.ZipFile(whl) as z:
        names = set(z.namelist())
    schemas = {p.name for p in (src / "exl3tool" / "schemas").glob("*.json")}
    assert schemas and {f"exl3tool/schemas/{s}" for s in schemas} <= names


def test_the_wheel_check_notices_a_missing_schema(wheel: tuple, tmp_path: Path) -> None:
    whl, source = wheel
    bad = tmp_path / whl.name
    with zipfile.ZipFile(whl) as src, zipfile.ZipFile(bad, "w") as dst:
        for item in src.infolist():
            if not item.filename.endswith("r7-routed-experts.schema.json"):
                dst.writestr(item, src.read(item))
    with pytest.raises(AssertionError, match="r7-routed-experts"):
        wheel_check.contents(bad, source)


def test_the_pre_commit_hook_installs_without_torch(tmp_path: Path) -> None:
    wheel_check.hook(ROOT / ".pre-commit-hooks.yaml")
    text = (ROOT / ".pre-commit-hooks.yaml").read_text()
    bad = tmp_path / "hooks.yaml"
    bad.write_text(text.replace("  language: python\n", "  language: python\n  additional_dependencies: [torch]\n"))  # fmt: skip
    with pytest.raises(AssertionError):
        wheel_check.hook(bad)


def test_the_import_detector_sees_a_caught_torch_import(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(wheel_check._HOOK.format(heavy=wheel_check.HEAVY))
    log = tmp_path / "log"
    env = {"PYTHONPATH": str(tmp_path), "EXL3TOOL_CI_IMPORT_LOG": str(log), "PATH": "/usr/bin"}
    if "LD_LIBRARY_PATH" in os.environ:  # a Python that is not the system's finds libpython
        env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
    code = "try:\n    import torch.nn\nexcept ImportError:\n    pass\nimport json"
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    assert log.read_text().split()[0] == "torch"
    log.unlink()
    subprocess.run([sys.executable, "-c", "import json"], env=env, check=True)
    assert not log.exists()


def test_ci_runs_lint_the_wheel_and_the_tests() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "set -euo pipefail" in ci
    order = [ci.index(s) for s in (
        "ruff check", "ruff format --check", "lint_imports_command", "pip wheel", "-m venv",
        "wheel_check.py\" commands", "make test",
    )]  # fmt: skip
    assert order == sorted(order)
