"""strict_json and jsonfile: every JS rule, with pointers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exl3tool.io import jsonfile, strict_json
from exl3tool.io.strict_json import canonical_json, is_json_int, loads, pointer_join, pretty_json
from exl3tool.rules.registry import Findings


def kinds(text: str | bytes) -> list[tuple[str, str]]:
    return [(i.kind, i.pointer) for i in loads(text)[1]]


def test_duplicates_with_pointers() -> None:
    v, issues = loads(
        '{"a": 1, "a": 2, "b": {"c/d": [{"x~y": 1, "x~y": 1}]}, "b2": {"k": 1, "k": 3}}'
    )
    assert v["a"] == 2  # last wins, like json.loads
    assert [(i.kind, i.pointer) for i in issues] == [
        ("duplicate", "/a"),
        ("duplicate", "/b/c~1d/0/x~0y"),
        ("duplicate", "/b2/k"),
    ]


def test_nonfinite_and_overflow() -> None:
    assert kinds('{"a": NaN}') == [("nonfinite", "/a")]
    assert kinds('{"a": [1, Infinity, -Infinity]}') == [
        ("nonfinite", "/a/1"),
        ("nonfinite", "/a/2"),
    ]
    assert kinds('{"a": 1e999}') == [("nonfinite", "/a")]
    assert kinds('{"a": 1.5}') == []


def test_huge_ints() -> None:
    assert kinds(f'{{"a": {2**63 - 1}, "b": {-(2**63 - 1)}}}') == []
    assert kinds(f'{{"a": {2**63}}}') == [("huge_int", "/a")]
    assert kinds(f"[{-(2**64)}]") == [("huge_int", "/0")]
    value, issues = loads('{"a": ' + "9" * 5000 + "}")  # beyond int's digit limit
    assert value is None and issues[0].kind == "huge_int"


def test_deep_nesting() -> None:
    assert kinds("[" * 70 + "]" * 70)[0][0] == "depth"
    assert kinds("[" * 60 + "]" * 60) == []
    value, issues = loads("[" * 100_000 + "]" * 100_000)
    assert value is None and issues[0].kind == "depth"


def test_syntax_and_encoding() -> None:
    assert kinds("{") == [("syntax", "")]
    assert kinds(b"\xef\xbb\xbf{}") == [("encoding", "")]
    assert kinds(b'{"a": "\xff"}') == [("encoding", "")]
    assert kinds('{"a": "\\ud800"}') == [("encoding", "")]
    assert kinds('{"a": "\\ud83d\\ude00", "b": "\\\\ud800"}') == []


def test_helpers() -> None:
    assert pointer_join("", "a/b") == "/a~1b" and pointer_join("/x", "~") == "/x/~0"
    assert pointer_join("/x", 3) == "/x/3"
    assert is_json_int(3) and not is_json_int(True) and not is_json_int(3.0)
    assert canonical_json({"b": 1, "a": [1, "é"]}) == b'{"a":[1,"\\u00e9"],"b":1}'
    v, _ = loads('{"a": {"b": 1}}')
    assert type(strict_json.plain(v)["a"]) is dict and strict_json.plain(v) == {"a": {"b": 1}}


def _agrees_with_stdlib(text: str | bytes) -> None:
    """loads never raises; what the standard library rejects is rejected with a reason (garbage
    yields an issue), and what loads accepts without issues is exactly the standard value."""
    value, issues = loads(text)
    try:
        ref, ok = json.loads(text), True
    except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError, digit limit
        ref, ok = None, False
    if not ok:
        assert value is None and issues, text
        assert {i.kind for i in issues} <= {"syntax", "encoding", "depth", "huge_int"}
    if not issues:
        assert ok and value == ref, text


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.text(max_size=200))
def test_loads_never_raises(text: str) -> None:
    _agrees_with_stdlib(text)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.binary(max_size=200))
def test_loads_never_raises_on_bytes(data: bytes) -> None:
    _agrees_with_stdlib(data)


_JSONISH = st.text(alphabet='{}[]":,0123456789-.eE tnrufalsNIy\\', max_size=40)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(_JSONISH)
def test_loads_agrees_with_stdlib_on_jsonish_text(text: str) -> None:
    _agrees_with_stdlib(text)


@pytest.mark.parametrize(
    ("content", "code"),
    [
        (b"{", "JS001"),
        (b'{"a": 1, "a": 1}', "JS002"),
        (b'{"a": NaN}', "JS003"),
        (b'{"a": 99999999999999999999}', "JS004"),
        (b"\xef\xbb\xbf{}", "JS005"),
        (b"[" * 70 + b"]" * 70, "JS007"),
        (b"[1, 2]", "JS008"),
        (b"null", "JS008"),
        (b'"text"', "JS008"),
    ],
)
def test_read_json_rules(tmp_path: Path, content: bytes, code: str) -> None:
    p = tmp_path / "config.json"
    p.write_bytes(content)
    fs = Findings()
    jsonfile.read_json(p, fs, "config.json")
    assert code in fs.codes()
    assert all(f.location.file == "config.json" for f in fs)


def test_read_json_too_large_and_valid(tmp_path: Path) -> None:
    p = tmp_path / "big.json"
    p.write_bytes(b'{"a": "' + b"x" * 100 + b'"}')
    fs = Findings()
    assert jsonfile.read_json(p, fs, "big.json", max_bytes=50) is None
    assert fs.codes() == {"JS006"}
    fs = Findings()
    assert jsonfile.read_json(p, fs, "big.json") == {"a": "x" * 100} and not fs
    p.write_bytes(b"[1]")
    assert jsonfile.read_json(p, Findings(), "x", require_object=False) == [1]


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(_JSON, st.integers(0, 6), st.booleans())
def test_pretty_json_round_trips_and_matches_indent_2_when_deep_enough(
    value: object, depth: int, ascii_only: bool
) -> None:
    text = pretty_json(value, depth, ensure_ascii=ascii_only)
    assert json.loads(text) == value
    full = pretty_json(value, 64, ensure_ascii=ascii_only)
    assert full == json.dumps(value, indent=2, ensure_ascii=ascii_only)


def _pretty_one_by_one(value: object, depth: int, ensure_ascii: bool) -> str:
    """pretty_json as first written: an emit call per item at every level (the oracle of the
    joined last level)."""
    inline = json.JSONEncoder(ensure_ascii=ensure_ascii, separators=(", ", ": ")).encode
    out: list[str] = []

    def emit(v: object, level: int) -> None:
        if level >= depth or not isinstance(v, dict | list) or not v:
            out.append(inline(v))
            return
        pad = "\n" + "  " * (level + 1)
        is_dict = isinstance(v, dict)
        out.append("{" if is_dict else "[")
        for i, item in enumerate(v.items() if is_dict else v):
            out.append(("," if i else "") + pad)
            if is_dict:
                out.append(inline(item[0]) + ": ")
                item = item[1]
            emit(item, level + 1)
        out.append("\n" + "  " * level + ("}" if is_dict else "]"))

    emit(value, 0)
    return "".join(out)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(_JSON, st.integers(0, 6), st.booleans())
def test_pretty_json_is_the_item_by_item_rendering(
    value: object, depth: int, ascii_only: bool
) -> None:
    assert pretty_json(value, depth, ensure_ascii=ascii_only) == _pretty_one_by_one(
        value, depth, ascii_only
    )


def test_pretty_json_keeps_deeper_levels_on_one_line() -> None:
    doc = {"ranks": [{"tensors": {"a": {"shape": [1, 2], "file": "x"}}}]}
    lines = pretty_json(doc, 4).splitlines()
    assert '        "a": {"shape": [1, 2], "file": "x"}' in lines
    assert pretty_json(doc, 0) == json.dumps(doc, separators=(", ", ": "))


def _walked(text: str) -> list[tuple[str, str, str]]:
    """The issues of the full walk over every value (what `loads` reported before its screen)."""
    value = strict_json.DECODER.decode(text)
    issues = strict_json.walk_issues(value)
    return [(i.kind, i.pointer, i.message) for i in issues]


def _nested(depth: int, leaf: str) -> str:
    out = leaf
    for i in range(depth):
        out = f'{{"k{i}": {out}}}' if i % 2 else f"[1, {out}]"
    return out


_SCALARS = st.sampled_from(
    [
        "0", "-1", "true", "false", "null", '"s"', "1.5", "NaN", "-Infinity", "1e999",
        "-1e999", "9223372036854775807", "9223372036854775808", "-9223372036854775807",
        "-9223372036854775808", "1e308", "[]", "{}",
    ]
)  # fmt: skip


@st.composite
def _documents(draw: st.DrawFn) -> str:
    """Objects and arrays with duplicate keys, non-finite and 64-bit edge numbers, bools and
    nesting around MAX_DEPTH."""

    def value(level: int) -> str:
        if level > 3 or draw(st.booleans()):
            leaf = draw(_SCALARS)
            deep = draw(st.sampled_from([0, 0, 0, 60, 62, 63, 64, 65]))
            return _nested(deep, leaf) if deep else leaf
        if draw(st.booleans()):
            return "[" + ", ".join(value(level + 1) for _ in range(draw(st.integers(0, 4)))) + "]"
        keys = draw(st.lists(st.sampled_from(["a", "b", "c/d", "e~"]), max_size=4))
        return "{" + ", ".join(f'"{k}": {value(level + 1)}' for k in keys) + "}"

    return value(0)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(_documents())
def test_screened_loads_reports_what_the_full_walk_reports(text: str) -> None:
    """`loads` walks a value only when its screen finds something the walk could report; the
    issues are the walk's own, in its order."""
    got = [(i.kind, i.pointer, i.message) for i in loads(text)[1]]
    assert got == _walked(text), text


@pytest.mark.parametrize(
    "text",
    [
        _nested(63, "1"),
        _nested(64, "1"),
        _nested(64, "[]"),
        _nested(64, "1.5"),
        _nested(65, '"s"'),
        '{"a": [1, 2, 9223372036854775808]}',
        '{"a": {"b": [true, -9223372036854775808]}}',
        "[1e308, 1e308]",  # a finite pair whose sum overflows: walked, nothing found
        '{"a": {"x": 1, "x": 1}}',
        "NaN",
        "[[[[-Infinity]]]]",
    ],
)
def test_screen_edges(text: str) -> None:
    assert [(i.kind, i.pointer, i.message) for i in loads(text)[1]] == _walked(text)


def _strict_only(text: str) -> tuple[object, list[tuple[str, str, str]]]:
    value = strict_json.DECODER.decode(text)
    issues = [(i.kind, i.pointer, i.message) for i in strict_json.walk_issues(value)]
    return repr(strict_json.plain(value)), issues  # repr: NaN equals itself


@st.composite
def _quoted_documents(draw: st.DrawFn) -> str:
    """`_documents` with strings that hold quotes, colons and escapes in keys and values."""
    text = draw(_documents())
    extra = draw(st.sampled_from(['"a\\":b"', '"x\\": 1, \\"x"', '"k:v"', '"\\u0041"', '"é"']))
    key = draw(st.sampled_from(['"a"', '"a\\""', '"q:"', '"\\u0061"']))
    return draw(st.sampled_from([text, f"[{text}, {extra}]", f"{{{key}: {text}, {key}: {extra}}}",
                                 f'{{{key}: {extra}, "z": {text}}}']))  # fmt: skip


@settings(max_examples=400, deadline=None, derandomize=True)
@given(_quoted_documents())
def test_the_plain_path_gives_the_strict_decoders_value_and_issues(text: str) -> None:
    """`loads` may take plain `json.loads` (no hook) for a clean document: its value and issues
    are those of the strict decoder's full walk, duplicates hidden behind escapes included."""
    value, issues = loads(text)
    assert (repr(value), [(i.kind, i.pointer, i.message) for i in issues]) == (
        _strict_only(text)
    ), text


def test_a_duplicate_after_an_escaped_quote_is_found() -> None:
    text = '{"a\\"": 1, "b": "x\\"y", "a\\"": 2}'
    assert [(i.kind, i.pointer) for i in loads(text)[1]] == [("duplicate", '/a"')]


@pytest.mark.parametrize(
    "text",
    ['{"a": 1, "a": 1}', '[{"k": "v", "k": "v"}]', '{"x": {"y": [1, {"z": "", "z": ""}]}}'],
)
def test_plain_duplicates_are_found(text: str) -> None:
    assert [i.kind for i in loads(text)[1]] == ["duplicate"]
