"""Identity records above the usual JSON limit, read by their layout, not a general parse.

`identity` writes ~210 bytes per tensor: a model of 10^6 tensors gives a 210 MB record, above
the 64 MiB any other JSON document may have. A general parse takes ~4x its text for such a
record (two dicts and a list per tensor) and up to 25x for a hostile document of the same size
(`[{},{},...]`; benchmarks/bench_records.py). Here
the two per-tensor maps, "tensors" (name -> hex digest) and "types" (name -> {"dtype",
"shape"}), are scanned by regex a chunk at a time, their entries proven to tile the text, and
every distinct type becomes one shared value; the rest of the record (a few KB) goes to the
strict reader with each map replaced by a placeholder, which must then stand exactly where the
map stood. A document this large that is anything else is refused with the reason. The record
itself: schemas/exl3tool-identity-1.schema.json.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from operator import itemgetter
from typing import Any

from exl3tool.io.gcpause import paused_gc

_WS = rb"[ \t\n\r]*"
# a JSON string's content: no raw quote or control character; an escape takes the next byte
# (whether it is a valid escape is left to `json.loads` of the few names that hold one)
_NAME = rb'"([^"\\\x00-\x1f]*(?:\\[^\x00-\x1f][^"\\\x00-\x1f]*)*)"'
_INT = rb"(?:0|[1-9][0-9]{0,15})"
_DIMS = _WS + rb"(?:" + _INT + _WS + rb"(?:," + _WS + _INT + _WS + rb")*)?"
# a digest is any 64 string characters here: `record_problem` then proves them hex in one pass
_DIGEST_ENTRY = re.compile(
    rb"(" + _WS + _NAME + _WS + rb":" + _WS + rb'"([^"\\\x00-\x1f]{64})"' + _WS + rb"([,}]))"
)
_TYPE_ENTRY = re.compile(
    rb"(" + _WS + _NAME + _WS + rb":" + _WS + rb"\{" + _WS + rb'"dtype"' + _WS + rb":" + _WS
    + rb'"([A-Za-z0-9_]{1,32})"' + _WS + rb"," + _WS + rb'"shape"' + _WS + rb":" + _WS
    + rb"\[(" + _DIMS + rb")\]" + _WS + rb"\}" + _WS + rb"([,}]))"
)  # fmt: skip
_MAP_START = {key: re.compile(rb'"' + key.encode() + rb'"' + _WS + rb":" + _WS + rb"\{")
              for key in ("tensors", "types")}  # fmt: skip
_EMPTY = re.compile(_WS + rb"\}")
_SURROGATE = re.compile("[\ud800-\udfff]")

CHUNK = 1 << 20  # bytes of a map scanned at once (~5,000 entries)
MAX_TYPES = 1 << 16  # distinct (dtype, shape) values; a real model has hundreds
MAX_REST = 64 << 20  # the record without its two maps, for the strict reader
_PLACEHOLDER = "\x00exl3tool-scanned-{}"


class NotARecord(ValueError):
    """The document is not an identity record in the layout `scan_record` reads."""


def scan_record(data: bytes, loads: Callable[[bytes], Any]) -> Any:
    """The value of the identity record `data`, its per-tensor maps scanned.

    `loads` parses the rest of the document strictly (reporting its own issues; None when it
    has no value). Raises NotARecord with the reason when the document is not in the layout.
    """
    with paused_gc():  # 10^6 names and digests, no cycle among them
        return _scan(data, loads)


def _scan(data: bytes, loads: Callable[[bytes], Any]) -> Any:
    tensors_at = _find_map(data, "tensors", ())
    if tensors_at is None:
        raise NotARecord('no "tensors" map')
    tensors, tensors_end = _scan_map(data, tensors_at, _DIGEST_ENTRY, _digests)
    types_at = _find_map(data, "types", ((tensors_at, tensors_end),))
    spans = [("tensors", tensors_at, tensors_end, tensors)]
    if types_at is not None:
        kinds: dict[tuple[bytes, bytes], dict[str, Any]] = {}
        names = list(tensors)

        def types(rows: list[tuple[bytes, ...]], done: int, esc: bool) -> list[tuple[str, Any]]:
            return _types(rows, done, esc, kinds, names)

        mapped, types_end = _scan_map(data, types_at, _TYPE_ENTRY, types)
        spans.append(("types", types_at, types_end, mapped))
    spans.sort(key=lambda s: s[1])
    pieces, at = [], 0
    for key, begin, end, _ in spans:
        marker = json.dumps(_PLACEHOLDER.format(key)).encode()
        if marker in data:
            raise NotARecord(f"the document holds the text {marker!r}")
        pieces += [data[at:begin], marker]
        at = end
    rest = b"".join([*pieces, data[at:]])
    if len(rest) > MAX_REST:
        raise NotARecord(f"{len(rest)} bytes besides the per-tensor maps (limit {MAX_REST})")
    value = loads(rest)
    if value is None:
        return None
    for key, _, _, mapped in spans:
        if not isinstance(value, dict) or value.get(key) != _PLACEHOLDER.format(key):
            raise NotARecord(f'the "{key}" map is not a member of the top-level object')
        value[key] = mapped
    return value


def _find_map(data: bytes, key: str, skip: tuple[tuple[int, int], ...]) -> int | None:
    """Offset of the `{` of the first `"key": {` outside the spans in `skip`."""
    pos = 0
    while (m := _MAP_START[key].search(data, pos)) is not None:
        inside = next((end for begin, end in skip if begin <= m.start() < end), None)
        if inside is None:
            return m.end() - 1
        pos = inside
    return None


_Rows = Callable[[list[tuple[bytes, ...]], int, bool], list[tuple[str, Any]]]
_FIRST, _NAME_OF, _VALUE_OF, _DIMS_OF, _LAST = (itemgetter(i) for i in (0, 1, 2, 3, -1))


def _scan_map(
    data: bytes, start: int, entry: re.Pattern[bytes], convert: _Rows
) -> tuple[dict[str, Any], int]:
    """(the map whose `{` is at `start`, the offset after its `}`).

    Each chunk's entries must tile it: `findall` gives the leftmost matches, so when the
    matched texts joined equal the bytes from the chunk's start, every match began where the
    previous one ended (a match elsewhere would have been found at the earlier offset)."""
    out: dict[str, Any] = {}
    pos = start + 1
    empty = _EMPTY.match(data, pos)
    if empty is not None:
        return out, empty.end()
    count = 0
    while True:
        rows = entry.findall(data, pos, pos + CHUNK)
        try:
            closing: int | None = list(map(_LAST, rows)).index(b"}")
            rows = rows[: closing + 1]
        except ValueError:
            closing = None
        # an entry the chunk cuts gives no row: a match that starts inside it ends beyond it
        whole = b"".join(map(_FIRST, rows))
        if not whole or data[pos : pos + len(whole)] != whole:
            raise NotARecord(
                f"byte {pos}: not a map entry of the record's layout (or one above {CHUNK} bytes)"
            )
        got = convert(rows, count, b"\\" in whole)
        out.update(got)
        count += len(got)
        pos += len(whole)
        if closing is not None:
            break
    if len(out) != count:
        raise NotARecord(f"{count - len(out)} duplicate names in a per-tensor map")
    return out, pos


def _names(rows: list[tuple[bytes, ...]], escaped: bool) -> list[str]:
    """The rows' names as the JSON strings they are: UTF-8, escapes decoded (`escaped`: the
    rows hold a backslash somewhere), no lone surrogate."""
    try:
        names = list(map(bytes.decode, map(_NAME_OF, rows)))
    except UnicodeDecodeError as exc:
        raise NotARecord(f"a name is not UTF-8 ({exc.reason})") from None
    for i, name in enumerate(names if escaped else ()):
        if "\\" in name:
            try:
                names[i] = text = json.loads(f'"{name}"')
            except ValueError as exc:
                raise NotARecord(f"a name holds a bad escape ({exc})") from None
            if _SURROGATE.search(text):
                raise NotARecord("a name holds a lone UTF-16 surrogate") from None
    return names


def _digests(rows: list[tuple[bytes, ...]], done: int, escaped: bool) -> list[tuple[str, Any]]:
    names = _names(rows, escaped)
    try:
        digests = list(map(bytes.decode, map(_VALUE_OF, rows)))
    except UnicodeDecodeError as exc:
        raise NotARecord(f"a digest is not UTF-8 ({exc.reason})") from None
    return list(zip(names, digests, strict=True))


def _types(
    rows: list[tuple[bytes, ...]],
    done: int,
    escaped: bool,
    kinds: dict[tuple[bytes, bytes], dict[str, Any]],
    tensor_names: list[str],
) -> list[tuple[str, Any]]:
    """(name, type) of each row; a name the "tensors" map has at the same place is its str."""
    names = _names(rows, escaped)
    same = tensor_names[done : done + len(names)]
    if same == names:
        names = same
    keys = list(zip(map(_VALUE_OF, rows), map(_DIMS_OF, rows), strict=True))
    for key in set(keys).difference(kinds):
        if len(kinds) >= MAX_TYPES:
            raise NotARecord(f"more than {MAX_TYPES} distinct dtype and shape pairs")
        dims = key[1].translate(None, b" \t\n\r")
        shape = [int(d) for d in dims.split(b",")] if dims else []
        kinds[key] = {"dtype": key[0].decode(), "shape": shape}
    return list(zip(names, map(kinds.__getitem__, keys), strict=True))
