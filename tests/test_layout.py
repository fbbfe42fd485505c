"""The README's layout section names exactly the package's subpackages, and the layers contract
in pyproject.toml lists each of them (synth sits outside the stack)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _subpackages() -> set[str]:
    pkg = ROOT / "exl3tool"
    return {p.parent.name for p in pkg.glob("*/__init__.py")} - {"schemas"}


def test_readme_layout_matches_the_tree() -> None:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    block = section.split("```", 2)[1]
    named = set(re.findall(r"^  ([a-z_]+)/", block, flags=re.M))
    assert named == _subpackages()


def test_layers_contract_covers_every_subpackage() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c for c in config["contracts"] if c["type"] == "layers"]
    named = {m.strip().split(".")[1] for layer in layers["layers"] for m in layer.split("|")}
    assert named == _subpackages() - {"synth"}
