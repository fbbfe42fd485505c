"""The warm-up's parallel compile releases each variant as soon as that variant is compiled: a
decode waiting for the base's rate does not wait for the adapters' rates too. Triton's compile is
replaced by futures the test completes itself, so this runs without a GPU or Triton."""

from __future__ import annotations

import threading
import types
from concurrent.futures import Future

import pytest
import torch

from exl3tool.trellis import _triton, _triton_group
from exl3tool.trellis.bitstream import rate_from_k


class _Compiled:
    """What Triton's warmup gives under AsyncCompileMode: a kernel still compiling."""

    def __init__(self) -> None:
        self.future: Future = Future()
        self.finalized = False

    def result(self) -> _Compiled:
        self.future.result()
        self.finalized = True
        return self


class _Mode:
    def __init__(self, pool) -> None:  # type: ignore[no-untyped-def]
        self.pool = pool

    def __enter__(self) -> _Mode:
        return self

    def __exit__(self, *exc) -> None:  # type: ignore[no-untyped-def]
        return None


def _variant(dev: torch.device, k: int) -> tuple:
    return (dev, rate_from_k(k), _triton._CB_ID["mcg"], True, _triton._specialized(0, 0, 256, 16))


def test_each_variant_is_released_once_compiled(monkeypatch) -> None:
    dev = torch.device("cpu")
    compiles: dict[int, _Compiled] = {}
    submitted = threading.Event()

    def warmup(*_args, KB, **_kw):  # type: ignore[no-untyped-def]
        compiles[KB] = _Compiled()
        if len(compiles) == 2:
            submitted.set()
        return compiles[KB]

    monkeypatch.setattr(_triton_group, "triton", types.SimpleNamespace(AsyncCompileMode=_Mode),
                        raising=False)  # fmt: skip
    monkeypatch.setattr(_triton_group, "_group_weight_kernel",
                        types.SimpleNamespace(warmup=warmup), raising=False)  # fmt: skip
    monkeypatch.setattr(_triton_group, "_launched", set())
    monkeypatch.setattr(_triton_group, "_locks", {})
    forms = [(rate_from_k(2), True), (rate_from_k(3), True)]
    ahead = threading.Thread(
        target=_triton_group._compile_ahead, args=(dev, torch.zeros(1), forms, "mcg")
    )
    ahead.start()
    assert submitted.wait(10)
    first, second = (_triton_group._compile_lock(_variant(dev, k)) for k in (2, 3))
    assert first.locked() and second.locked()  # both compiling: a decode would wait for either
    compiles[2].future.set_result(None)
    assert first.acquire(timeout=10)  # K2 is ready: its decode goes on ...
    first.release()
    assert second.locked() and ahead.is_alive()  # ... while K3 is still compiling
    assert compiles[2].finalized and _variant(dev, 2) in _triton_group._launched
    assert _variant(dev, 3) not in _triton_group._launched
    compiles[3].future.set_result(None)
    ahead.join(10)
    assert not ahead.is_alive() and not second.locked()
    assert {_variant(dev, 2), _variant(dev, 3)} <= _triton_group._launched


def test_a_failed_compile_releases_its_variant_uncompiled(monkeypatch) -> None:
    dev = torch.device("cpu")
    compiled = _Compiled()
    compiled.future.set_exception(RuntimeError("compile failed"))
    monkeypatch.setattr(_triton_group, "triton", types.SimpleNamespace(AsyncCompileMode=_Mode),
                        raising=False)  # fmt: skip
    monkeypatch.setattr(_triton_group, "_group_weight_kernel",
                        types.SimpleNamespace(warmup=lambda *a, **k: compiled), raising=False)  # fmt: skip
    monkeypatch.setattr(_triton_group, "_launched", set())
    monkeypatch.setattr(_triton_group, "_locks", {})
    with pytest.raises(RuntimeError):  # the warm-up's caller stops silently
        _triton_group._compile_ahead(dev, torch.zeros(1), [(rate_from_k(4), True)], "mcg")
    # the decode then compiles it itself
    assert not _triton_group._compile_lock(_variant(dev, 4)).locked()
    assert _variant(dev, 4) not in _triton_group._launched
