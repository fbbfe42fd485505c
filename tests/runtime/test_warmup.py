"""The W_eff kernel warm-up at a rank's start: which rates it compiles, in which order, and when."""

from __future__ import annotations

import threading

import pytest
import torch

from exl3tool.formats.checkpoint import load_checkpoint
from exl3tool.io.safetensors import TensorInfo
from exl3tool.rules.registry import Findings
from exl3tool.runtime import warmup
from exl3tool.trellis import _triton_group


class _Ref:
    def __init__(self, name: str, dtype: str, shape: tuple) -> None:
        self.info = TensorInfo(name, dtype, shape, 0, 0)


def test_rates_are_the_trellis_widths_most_frequent_first() -> None:
    refs = [
        _Ref("l.0.gate_proj.trellis", "I16", (8, 8, 48)),
        _Ref("l.1.gate_proj.trellis", "I16", (8, 8, 48)),
        _Ref("l.0.up_proj.rank0.trellis_k5", "I16", (8, 8, 80)),
        _Ref("l.0.down_proj.trellis", "I16", (8, 8, 64)),
        _Ref("l.2.down_proj.trellis", "I16", (8, 8, 64)),
        _Ref("l.3.down_proj.trellis", "I16", (8, 8, 64)),
    ]
    assert warmup.trellis_rates(refs) == [4, 3, 5]


@pytest.mark.parametrize(
    "ref",
    [
        _Ref("l.0.gate_proj.suh", "F16", (256,)),
        _Ref("l.0.gate_proj.trellis", "F16", (8, 8, 48)),  # not int16
        _Ref("l.0.gate_proj.trellis", "I16", (8, 48)),  # not 3-D
        _Ref("l.0.gate_proj.trellis", "I16", (8, 8, 50)),  # not 16·K
        _Ref("l.0.gate_proj.trellis", "I16", (8, 8, 16 * 9)),  # K beyond 8
        _Ref("l.0.gate_proj.trellis", "I16", (8, 8, 0)),
        _Ref("l.0.gate_proj.mcg", "I16", (8, 8, 48)),  # no trellis by name
    ],
)
def test_tensors_that_are_no_trellis_give_no_rate(ref) -> None:
    assert warmup.trellis_rates([ref]) == []


def test_the_synthetic_artifacts_give_base_and_stage_rates(artifacts) -> None:
    base = load_checkpoint(artifacts.base, Findings())
    adapter = load_checkpoint(artifacts.a, Findings(), need_config=False)
    assert warmup.trellis_rates(base.tensors.values()) == [2]
    assert sorted(warmup.trellis_rates(adapter.tensors.values())) == [3, 4]


def test_base_rates_come_first_then_those_only_adapters_use(artifacts, monkeypatch) -> None:
    calls: list[list[int]] = []
    monkeypatch.setattr(_triton_group, "warm_weights", lambda dev, ks: calls.append(ks) or ks)
    base = load_checkpoint(artifacts.base, Findings())
    w = warmup.KernelWarmup(torch.device("cpu"), base, [artifacts.a, artifacts.b])
    w.run()
    assert len(calls) == 1  # one batch: the variants compile side by side
    assert calls[0][0] == 2 and sorted(calls[0][1:]) == [3, 4]  # b's K3 is not there twice
    assert w.warmed == calls[0]


def test_an_unreadable_adapter_leaves_the_base_rates(artifacts, tmp_path, monkeypatch) -> None:
    calls: list[list[int]] = []
    monkeypatch.setattr(_triton_group, "warm_weights", lambda dev, ks: calls.append(ks) or ks)
    base = load_checkpoint(artifacts.base, Findings())
    w = warmup.KernelWarmup(torch.device("cpu"), base, [tmp_path / "missing", artifacts.a])
    w.run()
    assert calls == [[2]]


def test_a_stopped_warmup_compiles_nothing(artifacts, monkeypatch) -> None:
    calls: list[list[int]] = []
    monkeypatch.setattr(_triton_group, "warm_weights", lambda dev, ks: calls.append(ks) or ks)
    base = load_checkpoint(artifacts.base, Findings())
    w = warmup.KernelWarmup(torch.device("cpu"), base, [artifacts.a])
    w._stop_at.set()
    w.start()
    w.join(10)
    assert not w.is_alive() and calls == [] and w.warmed == []


def test_stop_waits_for_the_warmup_in_progress(artifacts, monkeypatch) -> None:
    entered, release = threading.Event(), threading.Event()

    def slow(dev, ks):
        entered.set()
        release.wait(10)
        return ks

    monkeypatch.setattr(_triton_group, "warm_weights", slow)
    base = load_checkpoint(artifacts.base, Findings())
    w = warmup.KernelWarmup(torch.device("cpu"), base, [artifacts.a])
    w.start()
    assert entered.wait(10)
    stopper = threading.Thread(target=w.stop)
    stopper.start()
    stopper.join(0.2)
    assert stopper.is_alive()  # stop() waits: no compile is cut off half-way
    release.set()
    stopper.join(10)
    assert not w.is_alive() and sorted(w.warmed) == [2, 3, 4]


def test_no_warmup_without_cuda(artifacts) -> None:
    base = load_checkpoint(artifacts.base, Findings())
    assert warmup.start_warmup(torch.device("cpu"), base, [artifacts.a]) is None
