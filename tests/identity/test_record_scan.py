"""identity/record_scan: a large record read by its layout is the record a JSON parse gives,
and anything else is refused with a reason, never parsed into memory."""

from __future__ import annotations

import hashlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exl3tool.identity import compare, record_scan
from exl3tool.identity.record_scan import NotARecord, scan_record
from exl3tool.io import jsonfile
from exl3tool.io.jsonfile import parse_json
from exl3tool.io.strict_json import loads
from exl3tool.rules.errors import InputError
from exl3tool.rules.registry import Findings


def _hex(i: int) -> str:
    return hashlib.sha256(str(i).encode()).hexdigest()


def _type(i: int, shapes: list[list[int]]) -> dict[str, Any]:
    return {"dtype": "F16" if i % 3 else "I16", "shape": shapes[i % len(shapes)]}


def _record(names: list[str], shapes: list[list[int]], compat: bool = True) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema": "exl3tool-identity/1",
        "algorithm": "blake3",
        "tensors": {n: _hex(i) for i, n in enumerate(names)},
        "types": {n: _type(i, shapes) for i, n in enumerate(names)},
        "layers": {"3": _hex(-1), "other": _hex(-2)},
        "root": _hex(-3),
    }
    if compat:
        doc["compatibility"] = {
            "schema": "fq-msrt-base-compatibility/2",
            "k": 2,
            "layers": {"3": _hex(-4)},
            "root": _hex(-5),
        }
    return doc


_LAYOUTS = [
    {"indent": 2},
    {},
    {"separators": (",", ":")},
    {"indent": 4, "ensure_ascii": False},
    {"indent": "\t", "separators": (" ,", " : ")},
]
_ODD = ['a"}', "x]},", '"shape": [1]},', "t\\", "é", "\u2028", "a\nb", '"tensors": {', "{}", "\x7f"]
# names that look like the record's own syntax, need escapes, or are not ASCII
_NAMES = st.lists(
    st.one_of(
        st.text(min_size=0, max_size=12),
        st.sampled_from(_ODD),
    ),
    min_size=0,
    max_size=25,
    unique=True,
)
_SHAPES = st.lists(st.lists(st.integers(0, 10**15), max_size=3), min_size=1, max_size=4)


def _scan(text: bytes, findings: Findings | None = None) -> Any:
    out = Findings() if findings is None else findings
    return scan_record(text, lambda rest: parse_json(rest, out, "r.json"))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    _NAMES, _SHAPES, st.sampled_from(range(len(_LAYOUTS))), st.sampled_from([300, 1000, 1 << 20])
)
def test_the_scan_is_the_parse(
    names: list[str], shapes: list[list[int]], layout: int, chunk: int
) -> None:
    doc = _record(names, shapes, compat=bool(len(names) % 2))
    text = json.dumps(doc, **_LAYOUTS[layout]).encode()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(record_scan, "CHUNK", chunk)  # chunk edges inside names and entries
        findings = Findings()
        got = _scan(text, findings)
    assert got == doc and not findings
    if names:  # one value per distinct type, and the names of both maps are the same objects
        assert all(a is b for a, b in zip(got["tensors"], got["types"], strict=True))
        firsts = {json.dumps(t): t for t in got["types"].values()}
        assert all(t is firsts[json.dumps(t)] for t in got["types"].values())


_BASE = json.dumps(_record([f"m.layers.{i}.w" for i in range(40)], [[8], [2, 3]]), indent=2)


@settings(max_examples=500, deadline=None, derandomize=True)
@given(st.integers(0, len(_BASE) - 1), st.integers(0, 12), st.text(max_size=6))
def test_an_edited_record_is_its_parse_or_refused(at: int, cut: int, insert: str) -> None:
    """Whatever an edit does, a value the scan gives is what the strict reader gives."""
    text = (_BASE[:at] + insert + _BASE[at + cut :]).encode()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(record_scan, "CHUNK", 297)
        try:
            got = _scan(text)
        except NotARecord:
            return
    if got is not None:
        assert got == parse_json(text, Findings(), "r.json")


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (lambda t: t.replace('"m.layers.3.w": "', 'x, "m.layers.3.w": "', 1), "not a map entry"),
        (lambda t: t.replace('"m.layers.4.w"', '"m.layers.3.w"', 2), "duplicate names"),
        (lambda t: t.replace('"m.layers.4.w": {', '"m.layers.4.w": {"x": 1, ', 1), "map entry"),
        (lambda t: t.replace('"shape": [\n        8\n', '"shape": [\n        8.0\n', 1), "entry"),
        (lambda t: t.replace('"m.layers.5.w"', '"m.\\q5.w"', 1), "bad escape"),
        (lambda t: t.replace('"m.layers.5.w"', '"m.\\ud800.w"', 1), "lone UTF-16 surrogate"),
        (lambda t: t.replace('"tensors": {', '"nested": {"tensors": {', 1)[:-2] + "}\n}",
         "not a member of the top-level object"),
        (lambda t: t.replace('"algorithm"', '"\\u0000exl3tool-scanned-types": 0, "algorithm"'),
         "holds the text"),
        (lambda t: t.replace('"tensors"', '"tensorz"', 1), 'no "tensors" map'),
        (lambda t: t[: t.index('"types"') + 40], "not a map entry"),
    ],
)  # fmt: skip
def test_what_is_not_the_layout_is_refused(edit: Any, reason: str) -> None:
    with pytest.raises(NotARecord, match=reason):
        _scan(edit(_BASE).encode())


def test_invalid_utf8_and_limits_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    bad = _BASE.replace('"m.layers.6.w"', '"m.\udcff.w"', 1).encode("utf-8", "surrogateescape")
    with pytest.raises(NotARecord, match="not UTF-8"):
        _scan(bad)
    monkeypatch.setattr(record_scan, "MAX_TYPES", 1)
    with pytest.raises(NotARecord, match="distinct dtype and shape"):
        _scan(_BASE.encode())
    monkeypatch.setattr(record_scan, "MAX_TYPES", 1 << 16)
    monkeypatch.setattr(record_scan, "CHUNK", 60)
    with pytest.raises(NotARecord, match="or one above 60 bytes"):
        _scan(_BASE.encode())  # no entry fits a chunk
    monkeypatch.setattr(record_scan, "CHUNK", 1 << 20)
    monkeypatch.setattr(record_scan, "MAX_REST", 100)
    with pytest.raises(NotARecord, match="besides the per-tensor maps"):
        _scan(_BASE.encode())


def test_the_rest_is_read_strictly() -> None:
    """Issues outside the maps are the strict reader's findings, at the same pointers."""
    text = _BASE.replace('"root"', '"algorithm": "blake3",\n  "root"', 1).encode()
    findings = Findings()
    assert _scan(text, findings) == loads(text)[0]
    assert [(f.code, f.location.pointer) for f in findings] == [("JS002", "/algorithm")]
    assert _scan(b"{" + _BASE.encode(), Findings()) is None  # not JSON at all: no value


@pytest.mark.parametrize("layout", [{"indent": 2}, {"separators": (",", ":")}])
def test_load_record_reads_a_large_record_by_its_layout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: dict[str, Any]
) -> None:
    monkeypatch.setattr(jsonfile, "DEFAULT_MAX_BYTES", 1000)
    doc = _record([f"model.layers.{i}.mlp.experts.{i}.w" for i in range(30)], [[4, 4]])
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc, **layout))
    findings = Findings()
    assert compare.load_record(path, findings) == doc and not findings


@pytest.mark.parametrize(
    "text",
    [
        "[" + ",".join(["{}"] * 600) + "]",  # a dict per 3 bytes: ~20x its text once parsed
        '{"tensors": {' + ",".join(f'"{i}": "{i}"' for i in range(200)) + "}}",
        json.dumps({"k": ["x" * 40] * 30}),
    ],
)
def test_a_large_document_that_is_no_record_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    """Above the usual limit, anything but a record in its layout is JS006, not parsed."""
    monkeypatch.setattr(jsonfile, "DEFAULT_MAX_BYTES", 500)
    monkeypatch.setattr(jsonfile, "loads", None)  # the general parser must not be reached
    path = tmp_path / "r.json"
    path.write_text(text)
    findings = Findings()
    assert compare.load_record(path, findings) is None
    assert [f.code for f in findings] == ["JS006"]
    assert "not an identity record" in next(iter(findings)).message


def test_a_fifo_posing_as_a_record_is_unreadable_not_a_hang(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    os.mkfifo(path)

    def hung(*_: object) -> None:
        raise TimeoutError("load_record blocked on a FIFO")

    before = signal.signal(signal.SIGALRM, hung)  # a regression hangs in open()
    signal.alarm(10)
    try:
        with pytest.raises(InputError, match="not a regular file"):
            compare.load_record(path, Findings())
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)
