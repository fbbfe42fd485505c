"""Issue 15 item 3: one exception boundary per check family. An exception escaping a family's
checks is one `check-crashed` finding (the family's X099 rule) naming the exception and the
exl3tool source line; exl3tool's own errors (exit 3) pass through."""

from __future__ import annotations

from pathlib import Path

import pytest

from exl3tool.actions.validate import validate_path
from exl3tool.checks import boundary
from exl3tool.checks.options import ValidateOptions
from exl3tool.rules import crash
from exl3tool.rules.errors import InputError
from exl3tool.rules.registry import Findings
from exl3tool.synth.exl3 import build_exl3
from exl3tool.synth.msrt import build_adapter, build_base
from exl3tool.synth.r7 import build_r7, build_rank_sliced


def _boom(*_a, **_k):
    raise ValueError("x" * 500)


CASES = [
    ("exl3.check_exl3", build_exl3, "EX099"),
    ("r7.check_r7", build_r7, "R7099"),
    ("rank_sliced.check_rank_sliced", build_rank_sliced, "RS099"),
    ("base.check_base", lambda p: build_base(p), "MB099"),
]


@pytest.mark.parametrize(("target", "build", "code"), CASES, ids=[c[2] for c in CASES])
def test_a_crashing_family_check_is_one_finding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str, build, code: str
) -> None:
    art = build(tmp_path / "a")
    _, clean = validate_path(art, ValidateOptions())
    assert not [f for f in clean if f.rule.code.endswith("099")]  # the valid twin
    mod, fn = target.split(".")
    monkeypatch.setattr(f"exl3tool.checks.{mod}.{fn}", _boom)
    _, findings = validate_path(art, ValidateOptions())
    hits = [f for f in findings if f.rule.code == code]
    assert len(hits) == 1
    msg = hits[0].message
    assert msg.startswith("ValueError: xxx") and "test_boundary.py" not in msg
    assert len(msg) < 400  # the exception text is capped


def test_cartridge_family(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = build_base(tmp_path / "base")
    cart = build_adapter(tmp_path / "cart", base)
    _, clean = validate_path(cart, ValidateOptions())
    assert not [f for f in clean if f.rule.code == "CA099"]
    monkeypatch.setattr("exl3tool.checks.cartridge.check_cartridge", _boom)
    _, findings = validate_path(cart, ValidateOptions())
    assert [f.rule.code for f in findings if f.rule.code == "CA099"] == ["CA099"]


def test_location_is_the_innermost_exl3tool_frame() -> None:
    def inner() -> None:
        {}["missing"]

    findings = Findings()
    with boundary.family_boundary(findings, crash.EX_CRASH, file="m.safetensors"):
        boundary.crash_rule("exl3")  # inside exl3tool, then the failing frame (a test's)
        inner()
    (f,) = list(findings)
    assert f.rule is crash.EX_CRASH and f.location.file == "m.safetensors"
    assert "KeyError" in f.message and "outside exl3tool" in f.message


def test_own_errors_pass_through() -> None:
    with pytest.raises(InputError), boundary.family_boundary(Findings(), crash.CA_CRASH):
        raise InputError("m.safetensors: shrank while it was read")
