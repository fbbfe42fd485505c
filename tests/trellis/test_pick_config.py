"""The decode kernel's config choice: only a config whose output equals the torch path is taken."""

from __future__ import annotations

import pytest
import torch

from exl3tool.trellis import _triton
from exl3tool.trellis.bitstream import rate_from_k


@pytest.fixture(autouse=True)
def fresh_choices(monkeypatch):
    monkeypatch.setattr(_triton, "_best", {})


def _pick(wrong: set, launched: list):
    current = {}

    def try_launch(cand):
        launched.append(cand)
        current["cfg"] = cand

    def agrees():
        return current["cfg"] not in wrong

    return _triton.pick_config(8, 64, 1, rate_from_k(2), torch.device("cpu"), try_launch, agrees)


def test_a_config_that_decodes_wrongly_is_never_taken() -> None:
    launched: list = []
    assert _pick({_triton.CONFIGS[0]}, launched) == _triton.CONFIGS[1]
    assert launched == list(_triton.CONFIGS[:2])


def test_no_agreeing_config_means_the_torch_path_and_is_remembered() -> None:
    launched: list = []
    assert _pick(set(_triton.CONFIGS), launched) is None
    assert launched == list(_triton.CONFIGS)
    assert _pick(set(), launched) is None and len(launched) == len(_triton.CONFIGS)


def test_the_first_agreeing_config_is_taken_off_cuda() -> None:
    launched: list = []
    assert _pick(set(), launched) == _triton.CONFIGS[0] and launched == [_triton.CONFIGS[0]]
