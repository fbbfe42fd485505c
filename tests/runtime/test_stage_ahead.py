"""Stagings started on threads before the engine exists (verify-swap's first layer)."""

from __future__ import annotations

import threading

import pytest

from exl3tool.runtime.base import load_base
from exl3tool.runtime.distributed import Comm
from exl3tool.runtime.engine import StageAhead, StagingFailed, SwapEngine
from exl3tool.runtime.verify import VerifyOptions, run_verify
from exl3tool.runtime.verify_parts import corrupt_copy

CPU_COMM = Comm()


def _engine(artifacts, tmp_path) -> SwapEngine:
    base = load_base(artifacts.base, [3, 4], 0, 1, CPU_COMM.device)
    return SwapEngine(base, CPU_COMM, CPU_COMM.device, work_root=tmp_path)


def _ahead(adapter, artifacts, tmp_path) -> StageAhead:
    return StageAhead(adapter, artifacts.base, 0, 1, 4, tmp_path)


def test_a_staging_started_ahead_loads_like_one_made_on_the_spot(artifacts, tmp_path) -> None:
    engine = _engine(artifacts, tmp_path)
    ahead = engine.stage_once(artifacts.a, _ahead(artifacts.a, artifacts, tmp_path))
    here = engine.stage_once(artifacts.a)
    assert ahead.info == here.info
    assert sorted(ahead.tables) == sorted(here.tables)
    info = engine.load_staged(ahead)
    assert info.layers == here.info.layers and engine.status()["active"]
    for st in (ahead, here):
        SwapEngine.drop_staged(st)


def test_a_corrupted_copy_started_ahead_fails_staging_with_no_pause(artifacts, tmp_path) -> None:
    engine = _engine(artifacts, tmp_path)
    bad = corrupt_copy(artifacts.a, tmp_path / "bad")
    with pytest.raises(StagingFailed, match="sha256"):
        engine.load(bad, _ahead(bad, artifacts, tmp_path))
    assert "pause" not in engine.events and not engine.status()["active"]


def test_a_staging_of_another_adapter_is_refused(artifacts, tmp_path) -> None:
    engine = _engine(artifacts, tmp_path)
    ahead = _ahead(artifacts.b, artifacts, tmp_path)
    with pytest.raises(ValueError, match="started ahead"):
        engine.stage_once(artifacts.a, ahead)
    ahead.discard()


def test_verify_leaves_no_staging_thread_and_no_temp_dir(artifacts, tmp_path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    opts = VerifyOptions(
        artifacts.base, artifacts.a, adapter_b=artifacts.b, threads=1, work_dir=work
    )
    assert run_verify(opts).passed
    assert not [t for t in threading.enumerate() if t.name.startswith("exl3tool-stage")]
    assert list(work.iterdir()) == []


def test_a_staging_whose_preparation_fails_is_refused_not_raised(artifacts, tmp_path) -> None:
    engine = _engine(artifacts, tmp_path)

    def broken() -> None:
        raise OSError(28, "No space left on device")

    ahead = StageAhead(artifacts.a, artifacts.base, 0, 1, 4, tmp_path, broken)
    with pytest.raises(StagingFailed, match="No space left on device"):
        engine.load(artifacts.a, ahead)
    assert "pause" not in engine.events


def test_a_cancelled_staging_stops_early_and_leaves_nothing(
    artifacts, tmp_path, monkeypatch
) -> None:
    # each chunk of the copy sleeps (uncancelled, this staging takes about a minute), so the
    # cancel lands while chunks remain: the staging ends with the cancel, not with a copy
    monkeypatch.setenv("EXL3TOOL_TEST_STAGE_SLEEP", "0.5")
    monkeypatch.setattr("exl3tool.staging.stage.CHUNK", 4096)
    ahead = StageAhead(artifacts.a, artifacts.base, 0, 1, 4, tmp_path)
    ahead.discard(cancel=True)
    assert not ahead.is_alive() and list(tmp_path.iterdir()) == []
    _, staged, error = ahead.result()
    assert staged is None and "cancelled" in error
