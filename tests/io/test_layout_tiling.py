"""io/safetensors: the tiling shortcut of the layout check reports exactly what the walk does."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exl3tool.io import safetensors as stmod
from exl3tool.io.safetensors import FileStamp, SafetensorsFile, TensorInfo
from exl3tool.rules.registry import Findings

_STAMP = FileStamp(0, 0, 0, 0, 0)


def _file(spans: list[tuple[int, int]], data_len: int, invalid: int = 0) -> SafetensorsFile:
    out = SafetensorsFile(Path("x.safetensors"), "x.safetensors", 8 + 64 + data_len, 64, _STAMP)
    out.tensors = {
        f"t{i}": TensorInfo(f"t{i}", "U8", (e - b,), b, e) for i, (b, e) in enumerate(spans)
    }
    out.invalid_entries = invalid
    return out


def _checked(out: SafetensorsFile, shortcut: bool, monkeypatch: pytest.MonkeyPatch):
    with monkeypatch.context() as m:
        if not shortcut:
            m.setattr(stmod, "_tiles", lambda _out: False)
        findings = Findings()
        stmod._check_layout(out, findings)
    rows = sorted((f.rule.code, f.message, f.location.tensor) for f in findings)
    return rows, sorted(out.tensors), out.invalid_entries


@st.composite
def _layouts(draw: st.DrawFn) -> tuple[list[tuple[int, int]], int, int]:
    """Mostly exact tilings (the shortcut's case), then one of them disturbed: an empty
    payload, a shifted or stretched one, a swapped end, a data length off by some bytes."""
    sizes = draw(st.lists(st.integers(0, 6), min_size=0, max_size=8))
    spans, pos = [], 0
    for n in sizes:
        spans.append((pos, pos + n))
        pos += n
    data_len = pos
    how = draw(st.sampled_from(["as is", "as is", "shift", "stretch", "swap", "length", "empty"]))
    if spans and how == "shift":
        i = draw(st.integers(0, len(spans) - 1))
        d = draw(st.integers(-3, 3))
        b, e = spans[i]
        spans[i] = (max(0, b + d), max(0, b + d) + (e - b))
    elif spans and how == "stretch":
        i = draw(st.integers(0, len(spans) - 1))
        b, e = spans[i]
        spans[i] = (b, e + draw(st.integers(1, 3)))
    elif len(spans) > 1 and how == "swap":
        i, j = draw(st.lists(st.integers(0, len(spans) - 1), min_size=2, max_size=2, unique=True))
        (bi, ei), (bj, ej) = spans[i], spans[j]
        if bi <= ej and bj <= ei:
            spans[i], spans[j] = (bi, ej), (bj, ei)
    elif how == "length":
        data_len = max(0, data_len + draw(st.integers(-3, 3)))
    elif how == "empty":
        at = draw(st.integers(0, max(0, data_len)))
        spans.append((at, at))
    order = draw(st.permutations(spans))
    return list(order), data_len, draw(st.sampled_from([0, 0, 0, 1]))


@settings(max_examples=600, deadline=None, derandomize=True)
@given(_layouts())
def test_the_shortcut_changes_no_finding_and_drops_no_entry(
    layout: tuple[list[tuple[int, int]], int, int],
) -> None:
    spans, data_len, invalid = layout
    with pytest.MonkeyPatch.context() as mp:
        fast = _checked(_file(spans, data_len, invalid), True, mp)
        walked = _checked(_file(spans, data_len, invalid), False, mp)
    assert fast == walked


def test_the_shortcut_takes_exact_tilings_only() -> None:
    assert stmod._tiles(_file([(4, 9), (0, 4), (9, 10)], 10))
    assert not stmod._tiles(_file([(0, 4), (4, 9)], 10))  # trailing byte
    assert not stmod._tiles(_file([(0, 4), (5, 10)], 10))  # a gap
    assert not stmod._tiles(_file([(0, 5), (4, 10)], 10))  # an overlap
    # begins {0, 1} and ends {1, 2} pair up as sorted lists, but [1, 1) lies inside [0, 2)
    assert not stmod._tiles(_file([(0, 2), (1, 1)], 2))
    assert not stmod._tiles(_file([(0, 4), (4, 10)], 10, invalid=1))
    assert not stmod._tiles(_file([], 0))
