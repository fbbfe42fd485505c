"""The compact header scan in C (native/header_scan.c) against the Python scan and the full
checks: it takes every header the Python scan takes, whatever it takes the full checks accept
without a finding, and it gives back exactly their entries."""

from __future__ import annotations

import io
import json
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from native_build import check_built

from exl3tool.io import safetensors as stmod
from exl3tool.io.safetensors import TensorInfo
from exl3tool.io.st_writer import write_arrays
from exl3tool.rules.registry import Findings

try:
    from exl3tool.io._header_scan import scan_entries as native
except ImportError:  # the test below says whether that is a fault; the rest skip
    native = None


def test_the_native_scan_is_built() -> None:
    """`make install` compiles it (setup.py) wherever a C compiler is; without one the install
    goes on with the Python scan (the same results, slower), and there is nothing to test."""
    check_built(native, "_header_scan", "the Python scan runs")


needs_native = pytest.mark.skipif(native is None, reason="not built (the test above fails)")


def _scan_with(scan: object, text: str) -> stmod._Fast | None:
    """`_scan_compact(text)` with this native scan (None: the Python scan only)."""
    real = stmod._native_scan
    stmod._native_scan = scan
    try:
        return stmod._scan_compact(text)
    finally:
        stmod._native_scan = real


def _python_scan(text: str) -> stmod._Fast | None:
    return _scan_with(None, text)


def _full(text: str) -> tuple[dict, object, list] | None:
    """What the full checks give for this header text (no fast path at all)."""
    raw = text.encode()
    out = stmod.SafetensorsFile(None, "h", 8 + len(raw), len(raw), None)  # type: ignore[arg-type]
    fs = Findings()
    real = stmod._fast_entries
    stmod._fast_entries = lambda header: None
    try:
        ok = stmod._parse_header(raw, out, fs)
    finally:
        stmod._fast_entries = real
    return (out.tensors, out.metadata, [f.code for f in fs]) if ok else None


def _agree(text: str) -> stmod._Fast | None:
    """The native scan's answer, after asserting that it takes every header the Python scan
    takes, with the same entries, and that whatever it takes the full checks take without a
    finding and read the same way."""
    got = _scan_with(native, text)
    py = _python_scan(text)
    if py is not None and text.isascii():
        assert got == py
    if got is not None:
        tensors, meta, codes = _full(text)  # type: ignore[misc]
        assert codes == [] and got == (tensors, meta)
        assert all(type(v) is TensorInfo for v in got[0].values())
    return got


def _entry(name: str, dtype: str = "U8", shape: str = "2", b: int = 0, e: int = 2) -> str:
    return f'"{name}":{{"dtype":"{dtype}","shape":[{shape}],"data_offsets":[{b},{e}]}}'


def _header(*entries: str, meta: str | None = None) -> str:
    head = f'"__metadata__":{meta},' if meta is not None else ""
    return "{" + head + ",".join(entries) + "}"


@needs_native
def test_it_reads_a_written_header() -> None:
    buf = io.BytesIO()
    arrays = {f"t.{i}": np.arange(i + 1, dtype=np.float16) for i in range(50)}
    write_arrays(buf, arrays, metadata={"format": "pt"})
    raw = buf.getvalue()
    (n,) = struct.unpack("<Q", raw[:8])
    got = _agree(raw[8 : 8 + n].decode())
    assert got is not None and list(got[0]) == list(arrays) and got[1] == {"format": "pt"}
    assert got[0]["t.3"] == TensorInfo("t.3", "F16", (4,), 12, 20)


GOOD = [
    _header(_entry("a"), _entry("b", b=2, e=4)),
    _header(_entry("", shape="", e=1)),  # an empty name and a scalar
    _header(_entry("s", "F32", "0,3", 0, 0)),
    _header(_entry("x", "I16", "2,3,4", 0, 48), meta='{"k":"v"}'),
    _header(_entry("big", "U8", "281474976710655", 0, 2**48 - 1)),
    _header(_entry("a|b~c d"), _entry("]},x", b=2, e=4)),
]

BAD = [
    _header(_entry("a"), _entry("a", b=2, e=4)),  # a name twice
    _header(_entry("__metadata__")),
    _header(_entry("a", shape="3")),  # 3 bytes of U8 in 2
    _header(_entry("a", b=2, e=0)),  # end before begin
    _header(_entry("a", "U8", "01", 0, 1)),  # leading zero
    _header(_entry("a", "U8", "1000000000000000", 0, 1)),  # 16 digits
    _header(_entry("a", "U8", "281474976710656", 0, 2**48)),  # past 2^48
    _header(_entry("a", "X9", "2")),  # no such dtype
    _header(_entry("a", "ABCDEFGHIJKLMNOPQ")),  # 17 characters
    _header(_entry("a", "", "2")),
    _header(_entry("a", shape="-2")),
    _header(_entry("a", shape="2,")),
    _header(_entry("a/b")),
    _header(_entry("a\\u0062")),
    _header(_entry("a\x01")),
    _header(_entry("a\x7f")),
    _header(),
    "{" + _entry("a") + ",}",
    "{" + _entry("a") + "}}",
    "{" + _entry("a") + "} ",  # the caller strips spaces; the scan itself does not
    "{" + _entry("a") + " }",
    "{" + _entry("a") + ",," + _entry("b", b=2, e=4) + "}",
    "{" + _entry("a"),
    "{" + _entry("a")[:-1] + ',"x":1}}',  # a fourth field
    '{"a":{"shape":[2],"dtype":"U8","data_offsets":[0,2]}}',  # another key order
]


@needs_native
@pytest.mark.parametrize("text", GOOD)
def test_it_takes_what_the_full_checks_take(text: str) -> None:
    assert _agree(text) is not None


@needs_native
@pytest.mark.parametrize("text", BAD)
def test_it_leaves_the_rest_to_the_full_checks(text: str) -> None:
    assert native(text, 1, {}, stmod._kind, TensorInfo) is None  # type: ignore[misc]
    _agree(text)


@needs_native
def test_its_arguments_are_checked() -> None:
    text = _header(_entry("a"))
    assert native(text, len(text), {}, stmod._kind, TensorInfo) is None  # type: ignore[misc]
    assert native(text, -1, {}, stmod._kind, TensorInfo) is None  # type: ignore[misc]
    with pytest.raises(ValueError, match="ASCII"):
        native(_header(_entry("é")), 1, {}, stmod._kind, TensorInfo)  # type: ignore[misc]
    with pytest.raises(TypeError):
        native(text, 1, {}, stmod._kind, dict)  # type: ignore[misc]
    with pytest.raises(TypeError, match="kind_of"):
        native(text, 1, {}, lambda d, s: None, TensorInfo)  # type: ignore[misc]
    with pytest.raises(ZeroDivisionError):
        native(text, 1, {}, lambda d, s: 1 / 0, TensorInfo)  # type: ignore[misc]


@needs_native
def test_a_non_ascii_header_takes_the_python_scan() -> None:
    text = _header(_entry("é"))
    assert _scan_with(native, text) == _python_scan(text) is not None


_PIECES = ['"', ":", "{", "}", "[", "]", ",", "0", "1", "9", "a", "U8", "F16", "/", "\\", " ",
           "\x00", "__metadata__", "dtype", "shape", "data_offsets", '"dtype":"U8"', "-", "."]  # fmt: skip


@needs_native
@settings(max_examples=1500, deadline=None)
@given(st.data())
def test_any_mutation_is_taken_alike_or_left_to_the_full_checks(d: st.DataObject) -> None:
    """Cut, repeat or change any part of valid compact headers: the native scan still takes
    exactly what the full checks take without a finding (asserted in `_agree`)."""
    n = d.draw(st.integers(1, 4))
    sizes = [d.draw(st.integers(0, 3)) for _ in range(n)]
    entries, at = [], 0
    for i, k in enumerate(sizes):
        entries.append(_entry(f"t{i}", "U8", str(k), at, at + k))
        at += k
    meta = d.draw(st.sampled_from([None, '{"a":"b"}', '{"a":1}']))
    text = _header(*entries, meta=meta)
    for _ in range(d.draw(st.integers(0, 3))):
        i = d.draw(st.integers(0, len(text)))
        j = d.draw(st.integers(i, min(len(text), i + 4)))
        text = text[:i] + d.draw(st.sampled_from(_PIECES)) + text[j:]
    if ".." in text:
        return
    _agree(text)


@needs_native
def test_kinds_are_asked_once_per_dtype_and_shape() -> None:
    asked: list[tuple[str, str]] = []

    def kind_of(dtype: str, dims: str) -> tuple:
        asked.append((dtype, dims))
        return stmod._kind(dtype, dims)

    entries = [_entry(f"t{i}", "U8", "2" if i % 3 else "2,1", 2 * i, 2 * i + 2) for i in range(9)]
    got = native(_header(*entries), 1, {}, kind_of, TensorInfo)  # type: ignore[misc]
    assert got is not None and len(got) == 9
    assert sorted(asked) == [("U8", "2"), ("U8", "2,1")]


@needs_native
def test_a_header_of_many_tensors() -> None:
    entries = [
        _entry(f"model.layers.{i}.w", "F16", "4,8", 64 * i, 64 * i + 64) for i in range(20000)
    ]
    text = _header(*entries)
    got = _agree(text)
    assert got is not None and len(got[0]) == 20000
    assert json.loads(text).keys() == got[0].keys()


@needs_native
@pytest.mark.parametrize("junk", [[1, 2, 3], 5, ("U8", (2,), "16"), ("U8", (2,))])
def test_a_kinds_map_filled_with_junk_is_refused(junk: object) -> None:
    # what `kinds` already holds is checked like what kind_of returns (a 3-tuple, int bits)
    text = _header(_entry("a"))
    with pytest.raises(TypeError, match="kind_of"):
        native(text, 1, {'U8","shape":[2': junk}, stmod._kind, TensorInfo)  # type: ignore[misc]


@needs_native
def test_kind_of_may_empty_the_kinds_map_mid_scan() -> None:
    # the scan keeps its own references to the kinds it caches: kind_of is arbitrary code
    kinds: dict = {}

    def kind_of(dtype: str, dims: str) -> tuple:
        kinds.clear()
        return stmod._kind(dtype, dims)

    entries = [_entry("a"), _entry("b", "U8", "3", 2, 5), _entry("c", b=5, e=7)]
    got = native(_header(*entries), 1, kinds, kind_of, TensorInfo)  # type: ignore[misc]
    assert got == {n: t for n, t in _python_scan(_header(*entries))[0].items()}  # type: ignore[index]
