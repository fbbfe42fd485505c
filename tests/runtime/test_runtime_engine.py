"""The swap engine's transaction (docs/formats/msrt.md §10) on one CPU rank."""

from __future__ import annotations

import hashlib
import shutil

import pytest
import torch

from exl3tool.runtime.base import load_base
from exl3tool.runtime.distributed import Comm
from exl3tool.runtime.engine import RolledBack, StagingFailed, SwapEngine
from exl3tool.runtime.moe import route
from exl3tool.runtime.verify import VerifyOptions, run_verify
from exl3tool.runtime.verify_parts import corrupt_copy

CPU = torch.device("cpu")


@pytest.fixture
def engine(artifacts, tmp_path) -> SwapEngine:
    return SwapEngine(load_base(artifacts.base, [3, 4], 0, 1, CPU), Comm(), CPU, work_root=tmp_path)


def _out(engine: SwapEngine, layer: int = 3) -> torch.Tensor:
    x = torch.randn((6, engine.base.hidden), generator=torch.Generator().manual_seed(1)).half()
    r = route(x, engine.base.routers[layer], engine.base.num_experts, engine.base.topk, 0)
    return engine.forward(layer, x, r)


def test_load_order_status_and_deactivate(engine, artifacts) -> None:
    before = _out(engine)
    info = engine.load(artifacts.a)
    assert engine.events == ["stage", "pause", "prepare", "activate", "discard", "resume"]
    st = engine.status()
    sha = hashlib.sha256((artifacts.a / "adapter_config.json").read_bytes()).hexdigest()
    assert st["active"] and st["adapter"]["manifest_sha256"] == sha == info.manifest_sha256
    assert st["adapter"]["labels"] == ["k3", "k4"] and st["layers"] == [3, 4]
    assert not torch.equal(_out(engine), before)
    assert engine.deactivate() == 2
    assert engine.status() == {**st, "active": False, "adapter": None, "layers": []}
    assert torch.equal(_out(engine), before)
    assert engine.deactivate() == 0  # nothing active: no pause
    assert engine.events[-1] == "resume" and engine.events.count("pause") == 2


def test_staging_failure_changes_nothing(engine, artifacts, tmp_path) -> None:
    bad = corrupt_copy(artifacts.a, tmp_path / "bad")
    with pytest.raises(StagingFailed, match="sha256"):
        engine.load(bad)
    assert engine.events == ["stage"]
    assert not engine.paused and engine.staged is None and not engine.active


@pytest.mark.parametrize("step", ["prepare", "activate", "resume"])
def test_fault_after_pause_rolls_back_to_base(engine, artifacts, step) -> None:
    before = _out(engine)
    engine.load(artifacts.b)  # something active: the rollback must not fall back to it
    engine.fault_at = step
    with pytest.raises(RolledBack, match="fault injected"):
        engine.load(artifacts.a)
    assert "rollback" in engine.events and engine.events[-1] == "resume"
    assert not engine.active and engine.adapter is None and not engine.paused
    assert torch.equal(_out(engine), before)


def test_paused_engine_refuses_forward(engine) -> None:
    engine.pause()
    with pytest.raises(RuntimeError, match="paused"):
        _out(engine)


def test_adapter_refused_by_staging_stops_the_run(artifacts, tmp_path) -> None:
    bad = corrupt_copy(artifacts.a, tmp_path / "bad")
    report = run_verify(VerifyOptions(artifacts.base, bad, threads=1))
    assert report.exit_code() == 1
    (check,) = report.checks
    assert check.name == "hot-load-equals-cold" and check.passed is False
    assert "sha256" in check.detail


def test_source_replaced_after_staging_is_ignored(engine, artifacts, tmp_path) -> None:
    """prepare reads the verified private copy only (§10.2 step 4)."""
    src = tmp_path / "src"
    shutil.copytree(artifacts.a, src)
    engine.stage(src)
    shutil.rmtree(src)  # the source is gone: prepare must not need it
    engine.pause()
    engine.prepare()
    engine.activate()
    engine.discard()
    engine.resume()
    assert engine.status()["layers"] == [3, 4]
