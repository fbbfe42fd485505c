"""The fast commands must not import torch (STYLE.md: io and formats never import torch)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Every module of these packages is imported, so a torch import anywhere in them is caught.
_PROBE = """
import importlib, pkgutil, sys
import exl3tool.cli.main
for pkg in ("exl3tool.io", "exl3tool.formats", "exl3tool.checks", "exl3tool.report"):
    mod = importlib.import_module(pkg)
    for info in pkgutil.walk_packages(mod.__path__, pkg + "."):
        importlib.import_module(info.name)
from exl3tool.rules.registry import all_rules
all_rules()
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "triton", "exllamav3"))
print(",".join(heavy))
"""


def test_fast_paths_do_not_import_torch() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "", f"torch imported at module level: {out.stdout[:300]}"


def test_probe_notices_a_torch_import() -> None:
    # the same probe, with a torch-backed module (the trellis codec) added, reports torch
    probe = _PROBE.replace("import exl3tool.cli.main", "import exl3tool.trellis.decode")
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert "torch" in out.stdout.split(",")
