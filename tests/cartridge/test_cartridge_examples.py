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


def test_a_base_that_does_not_load_is_said_once_and_matches_nothing(tmp_path: Path) -> None:
    import shutil

    base = tmp_path / "base"
    shutil.copytree(EXAMPLES / "msrt-base-tiny", base)
    (base / "model-layer-004.safetensors").unlink()  # a half-downloaded base
    for hash_ in (False, True):
        f = Findings()
        check_cartridge(
            EXAMPLES / "cartridge-k3k4", f, ValidateOptions(base=base, hash=hash_, tp=2)
        )
        codes = [x.code for x in f]
        assert codes == ["CA070"], codes  # not CA071/CA074: the cartridge is not to blame
        (only,) = f
        assert "does not load" in only.message and "CK003" in only.message
