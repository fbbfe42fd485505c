"""A strict JSON reader: duplicate keys, NaN/Infinity, huge integers and deep nesting are issues.

`json.loads` silently keeps the last duplicate key and accepts NaN; the formats we read are
security-relevant, so every such case is reported with the JSON pointer where it occurs.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain, compress
from operator import attrgetter
from typing import Any

MAX_INT = 2**63 - 1
MAX_DEPTH = 64
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


@dataclass(frozen=True)
class JsonIssue:
    kind: str  # "syntax" | "duplicate" | "nonfinite" | "huge_int" | "depth" | "encoding"
    pointer: str
    message: str


class _Object(dict):
    """A dict that remembers which keys were duplicated while it was parsed."""

    __slots__ = ("duplicates",)


def _object_pairs(pairs: list[tuple[str, Any]]) -> dict:
    obj = _Object(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        obj.duplicates = sorted({k for k, _ in pairs if k in seen or seen.add(k)})  # type: ignore[func-returns-value]
    else:
        obj.duplicates = ()
    return obj


def _constant(name: str) -> float:
    return float("nan") if name == "NaN" else float(name.replace("Infinity", "inf"))


DECODER = json.JSONDecoder(object_pairs_hook=_object_pairs, parse_constant=_constant)


def pointer_join(base: str, token: str | int) -> str:
    """RFC 6901 pointer of `token` under `base`."""
    t = str(token).replace("~", "~0").replace("/", "~1")
    return f"{base}/{t}"


def _walk(value: Any, pointer: str, depth: int, issues: list[JsonIssue]) -> None:
    if depth > MAX_DEPTH:
        issues.append(JsonIssue("depth", pointer, f"nesting deeper than {MAX_DEPTH}"))
        return
    if isinstance(value, dict):
        for key in getattr(value, "duplicates", ()):
            issues.append(
                JsonIssue("duplicate", pointer_join(pointer, key), f"duplicate key {key!r}")
            )
        for k, v in value.items():
            if isinstance(v, dict | list | float) or (type(v) is int and abs(v) > MAX_INT):
                _walk(v, pointer_join(pointer, k), depth + 1, issues)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if isinstance(v, dict | list | float) or (type(v) is int and abs(v) > MAX_INT):
                _walk(v, pointer_join(pointer, i), depth + 1, issues)
    elif isinstance(value, float):
        if not math.isfinite(value):
            issues.append(JsonIssue("nonfinite", pointer, f"non-finite number {value!r}"))
    elif type(value) is int and abs(value) > MAX_INT:
        issues.append(JsonIssue("huge_int", pointer, "integer beyond 64 bits"))


_CONTAINERS = frozenset((_Object, list))
_INTS = frozenset((int,))  # a bool is no int here, as in `_walk`
_FLOATS = frozenset((float,))
_duplicates = attrgetter("duplicates")


def _numbers_clean(values: list[Any], types: list[type], present: set[type]) -> bool:
    """No integer beyond 64 bits and no NaN/Infinity among one level's `values` (`types`
    their types, `present` the set of them). NaN or Inf makes the sum non-finite; an
    overflowing sum of finite floats only costs the caller a walk."""
    if int in present:
        ints = list(compress(values, map(_INTS.__contains__, types)))
        if max(ints) > MAX_INT or min(ints) < -MAX_INT:
            return False
    return float not in present or math.isfinite(
        sum(compress(values, map(_FLOATS.__contains__, types)))
    )


def _levels(
    top: list[Any], dict_type: type, containers: frozenset[type]
) -> Iterator[tuple[int, list[dict], list[Any], list[type]]]:
    """(depth, objects, values, their types) of each nesting level, `top` (a list of
    containers) at depth 0; objects are the level's `dict_type` containers, values what
    they and its lists hold. The next level is the values whose type is in `containers`."""
    level, depth = top, 0
    while level:
        objects = [c for c in level if type(c) is dict_type]
        lists = (c for c in level if type(c) is list)
        values = list(chain(chain.from_iterable(map(dict.values, objects)), *lists))
        types = list(map(type, values))
        yield depth, objects, values, types
        level = list(compress(values, map(containers.__contains__, types)))
        depth += 1


def _may_have_issues(value: Any) -> bool:
    """False only when `_walk` would find nothing in a value parsed by DECODER: no duplicate
    key, no non-finite float, no integer beyond 64 bits, no container at depth MAX_DEPTH (or
    deeper). One pass per nesting level, type tests in C (a layer manifest holds ~9,000
    values): ~4x cheaper than the walk, which then runs only where it has something to say."""
    if type(value) not in _CONTAINERS:
        return True  # a scalar document: the walk is one step
    for depth, objects, values, types in _levels([value], _Object, _CONTAINERS):
        if depth >= MAX_DEPTH or any(map(_duplicates, objects)):
            return True
        if not _numbers_clean(values, types, set(types)):
            return True
    return False


_PLAIN_CONTAINERS = frozenset((dict, list))
_UNSURE = object()  # `_plain_loads`: the strict decoder decides


def _plainly_clean(value: Any, quotes: int) -> bool:
    """Whether a value that plain `json.loads` parsed from a text without backslashes is the
    whole text (no member dropped as a duplicate) and has nothing `_walk` would report.

    Without backslashes every `"` of the text delimits a string, so the text holds
    quotes / 2 strings; a duplicate member's key string is missing from the value. One pass
    per nesting level, type tests in C. The strict decoder's hook runs once per object: an R7
    layer manifest (thousands of small objects) parses in 3.7 ms this way, 4.5 ms with it."""
    strings = 0
    # a scalar document is checked as the one value of a wrapper list at depth 0
    for depth, objects, values, types in _levels([[value]], dict, _PLAIN_CONTAINERS):
        if depth > MAX_DEPTH or not _numbers_clean(values, types, set(types)):
            return False
        strings += sum(map(len, objects)) + types.count(str)
    return quotes == 2 * strings


def _plain_loads(text: str) -> Any:
    """The value of `text` when plain `json.loads` gives exactly what the strict decoder
    would, with no issue (the usual document); `_UNSURE` otherwise (the caller decides)."""
    if "\\" in text:  # an escape may hide a quote or a surrogate: the strict path decides
        return _UNSURE
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return _UNSURE
    return value if _plainly_clean(value, text.count('"')) else _UNSURE


def _lone_surrogate_in(value: Any) -> bool:
    stack = [value]  # iterative: the parser accepts nesting deeper than our recursion budget
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if any("\ud800" <= c <= "\udfff" for c in v):
                return True
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


def has_lone_surrogate(text: str, value: Any) -> bool:
    """Whether a parsed value holds a lone UTF-16 surrogate ("\\ud800"): valid JSON syntax,
    but not Unicode, so strict parsers (serde_json) reject it and it cannot be re-encoded."""
    if "\\" not in text:  # one memchr; the regex costs ~15x that on a 16 MB index
        return False
    return bool(_SURROGATE_ESCAPE.search(text)) and _lone_surrogate_in(value)


def _plain(value: Any) -> Any:
    """Replace the parser's dict subclass by plain dicts (cheap, and equality stays exact)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def loads(text: str | bytes) -> tuple[Any, list[JsonIssue]]:
    """Parse `text`; return (value, issues). value is None when the text is not JSON at all."""
    if isinstance(text, bytes | bytearray | memoryview):
        raw = bytes(text)
        if raw.startswith(b"\xef\xbb\xbf"):
            return None, [JsonIssue("encoding", "", "UTF-8 byte order mark")]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return None, [JsonIssue("encoding", "", f"invalid UTF-8 at byte {exc.start}")]
    value = _plain_loads(text)
    if value is not _UNSURE:
        return value, []
    try:
        value = DECODER.decode(text)
    except json.JSONDecodeError as exc:
        return None, [JsonIssue("syntax", "", f"{exc.msg} at line {exc.lineno} column {exc.colno}")]
    except RecursionError:
        return None, [JsonIssue("depth", "", "nesting too deep to parse")]
    except ValueError as exc:  # e.g. int with too many digits
        return None, [JsonIssue("huge_int", "", str(exc).split(";")[0])]
    issues: list[JsonIssue] = []
    if has_lone_surrogate(text, value):
        issues.append(JsonIssue("encoding", "", "lone UTF-16 surrogate escape (not Unicode)"))
    if _may_have_issues(value):
        _walk(value, "", 0, issues)
    return value, issues


def raw_decode(text: str, start: int) -> tuple[Any, int]:
    """Decode one JSON value at `start` with the strict hooks; returns (value, end index)."""
    return DECODER.raw_decode(text, start)


def walk_issues(value: Any) -> list[JsonIssue]:
    issues: list[JsonIssue] = []
    _walk(value, "", 0, issues)
    return issues


def plain(value: Any) -> Any:
    return _plain(value)


def is_json_int(value: Any) -> bool:
    """A true JSON integer: an int that is not a bool."""
    return type(value) is int


def canonical_json(value: Any) -> bytes:
    """Canonical JSON bytes: sorted keys, compact separators, ASCII (docs/formats/msrt.md §6.2)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def pretty_json(value: Any, depth: int, *, ensure_ascii: bool = True) -> str:
    """JSON with the outer `depth` levels of objects and arrays indented by two spaces and
    everything deeper on one line (C encoder): readable like `indent=2` for manifests of 100k
    entries, without the pure-Python encoder `indent` falls back to (~10x slower)."""
    inline = json.JSONEncoder(ensure_ascii=ensure_ascii, separators=(", ", ": ")).encode
    out: list[str] = []

    def emit(v: Any, level: int) -> None:
        if level >= depth or not isinstance(v, dict | list) or not v:
            out.append(inline(v))
            return
        pad = "\n" + "  " * (level + 1)
        is_dict = isinstance(v, dict)
        out.append("{" if is_dict else "[")
        if level + 1 >= depth:  # every item inline: joined, not an emit call each (10^5 lines)
            if is_dict:
                items = [f"{inline(k)}: {inline(x)}" for k, x in v.items()]
            else:
                items = list(map(inline, v))
            out.append(pad + ("," + pad).join(items))
        else:
            for i, item in enumerate(v.items() if is_dict else v):
                out.append(("," if i else "") + pad)
                if is_dict:
                    out.append(inline(item[0]) + ": ")
                    item = item[1]
                emit(item, level + 1)
        out.append("\n" + "  " * level + ("}" if is_dict else "]"))

    emit(value, 0)
    return "".join(out)
