"""The committed MSRT examples equal a fresh build and are valid."""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

from exl3tool.checks.cartridge import check_cartridge
from exl3tool.checks.options import ValidateOptions
from exl3tool.rules.registry import Findings

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _maker():
    spec = importlib.util.spec_from_file_location(
        "make_msrt_examples", EXAMPLES / "make_msrt_examples.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_committed_examples_match_a_fresh_build():
    mk = _maker()
    with tempfile.TemporaryDirectory() as tmp:
        mk.build(Path(tmp))
        for d in (mk.BASE, mk.CARTRIDGE):
            assert mk.differences(EXAMPLES / d, Path(tmp) / d) == [], d


def test_example_cartridge_is_valid_for_tp2():
    f = Findings()
    opts = ValidateOptions(base=EXAMPLES / "msrt-base-tiny", hash=True, tp=2)
    check_cartridge(EXAMPLES / "cartridge-k3k4", f, opts)
    assert not list(f), [(x.code, x.message) for x in f]
