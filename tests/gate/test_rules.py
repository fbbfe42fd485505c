"""Each GT rule that a step raises, triggered through `run_check` (config rules: test_config,
resolution rules: test_plan, HF rules: test_hf)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from exl3tool.actions.gate import steps
from exl3tool.actions.gate.config import ArtifactSpec, GateConfig
from exl3tool.actions.gate.run import run_check
from exl3tool.rules.registry import Severity

from .conftest import REPO, Artifacts


def codes(cfg: GateConfig) -> set[str]:
    return run_check(cfg).findings.codes()


def test_gt008_identity_file_missing(synth: Artifacts, tmp_path: Path) -> None:
    spec = ArtifactSpec(str(synth.r7), identity="nope.json")
    assert "GT008" in codes(GateConfig(artifacts=(spec,), hash=False, root=tmp_path))


def test_identity_match_passes_and_fails(synth: Artifacts, tmp_path: Path, cli) -> None:
    rec = tmp_path / "r7.json"
    assert cli("identity", str(synth.r7), "--format", "json", "-o", str(rec)).code == 0
    ok = run_check(GateConfig(artifacts=(ArtifactSpec(str(synth.r7), identity=str(rec)),)))
    assert ok.findings.errors() == [] and ok.artifacts[0].extra["identity_root"]
    other = ArtifactSpec(str(synth.base), identity=str(rec))
    found = codes(GateConfig(artifacts=(other,), hash=False))
    assert {"ID001", "ID002", "ID006"} <= found  # missing/unexpected tensors, other root


def test_gt009_a_crashing_step_fails_the_gate(synth: Artifacts, monkeypatch) -> None:
    def boom(ctx, **kw):
        raise RuntimeError("disk on fire")

    monkeypatch.setitem(steps.ACTIONS, "identity_root", boom)
    report = run_check(GateConfig(artifacts=(ArtifactSpec(str(synth.r7)),)))
    (f,) = [f for f in report.findings if f.code == "GT009"]
    assert "identity root: internal error RuntimeError: disk on fire" in f.message
    assert report.exit_code() == 1
    assert [c["status"] for c in report.artifacts[0].extra["checks"]] == ["pass", "fail"]


def test_gt010_slice_refused() -> None:
    # r7-tiny's expert intermediate size is 128: TP 2 would cut a Hadamard block.
    spec = ArtifactSpec(str(REPO / "examples" / "r7-tiny"), tp=(2,))
    report = run_check(GateConfig(artifacts=(spec,), hash=False))
    assert "GT010" in report.findings.codes()
    checks = {c["name"]: c["status"] for c in report.artifacts[0].extra["checks"]}
    assert checks["slice-verify --tp 2"] == "fail"


def _verify_report(passed: bool | None):
    check = SimpleNamespace(name="hot-load-equals-cold", passed=passed, detail="differs",
                            max_abs=0.5, first_difference={"layer": 3})  # fmt: skip
    return SimpleNamespace(checks=[check], passed=passed is not False, timings={"total": 0.1})


@pytest.mark.parametrize(("passed", "code"), [(False, "GT011"), (None, "GT012")])
def test_gt011_gt012_verify_swap_failures_and_skips(
    synth: Artifacts, monkeypatch, passed: bool | None, code: str
) -> None:
    import exl3tool.runtime.verify as verify

    monkeypatch.setattr(verify, "run_verify", lambda opts: _verify_report(passed))
    spec = ArtifactSpec(str(synth.cartridge), base=str(synth.base), verify_swap=True)
    report = run_check(GateConfig(artifacts=(spec,), hash=False))
    assert code in report.findings.codes()
    if code == "GT011":
        (f,) = [f for f in report.findings if f.code == "GT011"]
        assert "hot-load-equals-cold: differs (max |diff| 0.5)" in f.message


def test_gt012_verify_swap_skipped_without_cuda_is_said(synth: Artifacts, monkeypatch) -> None:
    monkeypatch.setattr(steps, "swap_unavailable", lambda device, tp: "CUDA is not available")
    spec = ArtifactSpec(str(synth.cartridge), base=str(synth.base), verify_swap=[2])
    report = run_check(GateConfig(artifacts=(spec,), hash=False, device="cuda"))
    assert report.exit_code() == 0
    assert any("verify-swap --tp 2 --device cuda skipped: CUDA" in n for n in report.notes)
    checks = {c["name"]: c["status"] for c in report.artifacts[0].extra["checks"]}
    assert checks["verify-swap --tp 2"] == "skipped"
    # a declared check that did not run is a warning: --strict fails the gate on it
    (f,) = [f for f in report.findings if f.code == "GT012"]
    assert f.level is Severity.WARNING
    assert report.exit_code(strict=True) == 1


def test_gt012_a_part_of_a_run_not_checked_here_is_an_info(synth: Artifacts, monkeypatch) -> None:
    import exl3tool.runtime.verify as verify

    monkeypatch.setattr(verify, "run_verify", lambda opts: _verify_report(None))
    spec = ArtifactSpec(str(synth.cartridge), base=str(synth.base), verify_swap=True)
    report = run_check(GateConfig(artifacts=(spec,), hash=False))
    (f,) = [f for f in report.findings if f.code == "GT012"]
    assert f.level is Severity.INFO and report.exit_code(strict=True) == 0


def test_swap_unavailable_names_the_missing_component(monkeypatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert steps.swap_unavailable("cuda", 1) == "CUDA is not available on this machine"
    monkeypatch.setattr(torch.distributed, "is_available", lambda: False)
    assert "torch.distributed" in (steps.swap_unavailable("cpu", 2) or "")
    assert steps.swap_unavailable("cpu", 1) is None
