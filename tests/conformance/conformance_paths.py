"""Paths the conformance tests share (a uniquely named module: `conftest` names clash across
test folders when pytest collects them together)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
