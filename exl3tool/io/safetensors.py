"""Strict safetensors header parser (docs/formats/r7.md §10.2, rules S1-S12).

Reads the 8-byte length and the header only; tensor bytes are never touched. Every defect is a
finding; entries that are themselves valid are still returned so later checks can run.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import repeat
from operator import itemgetter, lshift, sub
from pathlib import Path
from typing import NamedTuple

from exl3tool.io import native
from exl3tool.io.dtypes import BITS
from exl3tool.io.gcpause import paused_gc
from exl3tool.io.strict_json import has_lone_surrogate, raw_decode, walk_issues
from exl3tool.rules import io as rules
from exl3tool.rules.registry import Findings

# native/header_scan.c: the compact scan in C. Absent when the package was built without a C
# compiler; EXL3TOOL_PURE_SCAN=1 leaves it unused (the same results, to compare or rule it out).
_native_scan: Callable[..., dict[str, TensorInfo] | None] | None = None
if native.ENABLED:
    with contextlib.suppress(ImportError):
        from exl3tool.io._header_scan import scan_entries as _native_scan

MAX_HEADER = 100_000_000
MAX_INT48 = 2**48 - 1
_ENTRY_FIELDS = frozenset(("dtype", "shape", "data_offsets"))
# Lone surrogates (from "\\ud800" escapes) are not Unicode: they cannot be written as UTF-8.
_UNSAFE_NAME = re.compile(r"[\x00-\x1f\x7f\\/\ud800-\udfff]|(^|\.)\.\.(\.|$)|^\.\.$")
_JSON_WS = " \t\n\r"
# The characters of _UNSAFE_NAME, for one scan over all names joined by "|" (the `..` segment
# rule is covered by `".." in joined`, which may only send a safe name to the full checks).
_UNSAFE_CHAR = re.compile(r"[\x00-\x1f\x7f\\/\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_ABSENT: dict[str, str] = {}  # no __metadata__ key (None: the key holds JSON null)


class TensorInfo(NamedTuple):
    """One header entry; offsets are relative to the data section (a tuple: a header may hold
    10^6 of them)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class FileStamp:
    """Identity of a file's content for change detection: (dev, ino, size, mtime_ns, ctime_ns)."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileStamp:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass
class SafetensorsFile:
    """A parsed header. `label` is the path shown in findings (relative to the artifact)."""

    path: Path
    label: str
    file_size: int
    header_len: int
    stamp: FileStamp
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    metadata: dict[str, str] | None = None
    invalid_entries: int = 0  # entries dropped as malformed (layout checks then stay quiet)

    @property
    def data_start(self) -> int:
        return 8 + self.header_len

    def span(self, name: str) -> tuple[int, int]:
        """Absolute [start, end) file offsets of a tensor's payload."""
        t = self.tensors[name]
        return self.data_start + t.begin, self.data_start + t.end


def escape_name(name: str) -> str:
    """Printable form of a tensor name (control characters escaped, markup-safe)."""
    return name.encode("unicode_escape").decode("ascii")


def is_unsafe_name(name: str) -> bool:
    return bool(_UNSAFE_NAME.search(name))


def read_header(path: Path, findings: Findings, label: str | None = None) -> SafetensorsFile | None:
    """Parse the header of `path`. Returns None when no entry can be trusted at all.

    Raises OSError when the file cannot be opened or read (the caller decides: exit 3 or finding).
    """
    label = label or str(path)
    # O_NONBLOCK: a FIFO posing as a shard must not hang the reader.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with open(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            findings.add(rules.PA_NOT_REGULAR, "not a regular file", file=label)
            return None
        size = st.st_size
        head = fh.read(8)
        if len(head) < 8:
            findings.add(rules.ST_SHORT, f"file has {len(head)} bytes", file=label)
            return None
        (n,) = struct.unpack("<Q", head)
        if n == 0 or n > MAX_HEADER or 8 + n > size:
            findings.add(
                rules.ST_HEADER_LEN,
                f"header length {n} (file {size} bytes, limit {MAX_HEADER})",
                file=label,
            )
            return None
        raw = fh.read(n)
        if len(raw) != n:
            findings.add(rules.ST_CHANGED, "file shrank while reading the header", file=label)
            return None
    out = SafetensorsFile(path, label, size, n, FileStamp.of(st))
    with paused_gc():
        if not _parse_header(raw, out, findings):
            return None
    _check_layout(out, findings)
    return out


def _parse_header(raw: bytes, out: SafetensorsFile, findings: Findings) -> bool:
    label = out.label
    if raw.startswith(b"\xef\xbb\xbf"):
        findings.add(rules.ST_ENCODING, "header starts with a UTF-8 BOM", file=label)
        return False
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        findings.add(rules.ST_ENCODING, f"invalid UTF-8 at header byte {exc.start}", file=label)
        return False
    fast = _fast_entries(text)
    if fast is not None:  # the usual, valid header: nothing to report
        out.tensors, out.metadata = fast
        return True
    start = len(text) - len(text.lstrip(_JSON_WS))
    if start:
        findings.add(rules.ST_LEADING_WS, f"{start} whitespace bytes before '{{'", file=label)
    try:
        header, end = raw_decode(text, start)
    except RecursionError:
        findings.add(rules.ST_DEPTH, "header nests too deeply to parse", file=label)
        return False
    except ValueError as exc:
        findings.add(rules.ST_JSON, str(exc), file=label)
        return False
    tail = text[end:]
    if tail.strip(" "):
        bad = next(c for c in tail if c != " ")
        findings.add(
            rules.ST_PADDING,
            f"byte {bad!r} after the JSON object (only spaces may pad the header)",
            file=label,
        )
    if not isinstance(header, dict):
        findings.add(rules.ST_NOT_OBJECT, f"header is a JSON {type(header).__name__}", file=label)
        return False
    if has_lone_surrogate(text, header):
        findings.add(
            rules.ST_ENCODING,
            "a string holds a lone UTF-16 surrogate escape (not Unicode; the reference reader "
            "rejects it)",
            file=label,
        )
    for issue in walk_issues(header):
        if issue.kind == "huge_int":
            continue  # shape/data_offsets checks report it under the right rule (ST011/ST012)
        r = {
            "duplicate": rules.ST_DUPLICATE,
            "nonfinite": rules.ST_NONFINITE,
            "depth": rules.ST_DEPTH,
        }[issue.kind]
        top = issue.pointer[1:].split("/", 1)[0].replace("~1", "/").replace("~0", "~")
        tensor = top if issue.kind == "duplicate" and top != "__metadata__" else None
        findings.add(
            r,
            issue.message,
            file=label,
            tensor=tensor and escape_name(tensor),
            pointer=issue.pointer,
        )
    if "__metadata__" in header:
        meta = header.pop("__metadata__")
        if isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values()):
            out.metadata = dict(meta)
        else:
            findings.add(
                rules.ST_METADATA,
                "__metadata__ must map strings to strings",
                file=label,
                pointer="/__metadata__",
            )
    for name, entry in header.items():
        info = _entry(name, entry, label, findings)
        if info is not None:
            out.tensors[name] = info
        else:
            out.invalid_entries += 1
    if not header:
        findings.add(rules.ST_EMPTY, "header lists no tensors", file=label)
    return True


_Fast = tuple[dict[str, TensorInfo], dict[str, str] | None]
# (dtype, dims text) -> (dtype, shape, payload bits): `_kind`, once per pair in a header
_Kinds = dict[tuple[str, str], tuple[str, tuple[int, ...], int]]


def _fast_entries(text: str) -> _Fast | None:
    """(tensors, metadata) of a header that the full checks would accept without a single
    finding; None as soon as anything is unusual (the caller then runs the full checks, which
    report it). Headers of 10^6 tensors are parsed at start-up: these are their paths."""
    return _scan_compact(text) or _round_trip(text)


# One entry of the compact header every safetensors writer emits: a name without escapes,
# control characters or slashes, then exactly dtype, shape and data_offsets with JSON integers
# of at most 15 digits. A header that is `{`, optional metadata, then only such entries is
# valid JSON whose entries the full checks accept as far as their syntax goes.
_INT = r"(?:0|[1-9][0-9]{0,14})"
_ENTRY = re.compile(
    r'"([^"\\/\x00-\x1f\x7f]*)":\{"dtype":"([A-Z0-9_]{1,16})","shape":\['
    rf"((?:{_INT}(?:,{_INT})*)?)"
    rf'\],"data_offsets":\[({_INT}),({_INT})\]\}}([,}}])'
)
_META_START = '{"__metadata__":'


def _scan_compact(text: str) -> _Fast | None:
    """The compact header by regex scans, no JSON objects built (10^6 entries: a fraction of
    `json.loads`, and no parsed dict to hold in memory next to the tensors)."""
    body = text.rstrip(" ")
    if not body.startswith("{") or ".." in body:
        return None  # `..` may be a name segment: the full checks decide
    pos, meta = 1, None
    if body.startswith(_META_START):
        try:
            meta, pos = raw_decode(body, len(_META_START))
        except (ValueError, RecursionError):
            return None
        if getattr(meta, "duplicates", True) or not all(type(v) is str for v in meta.values()):
            return None
        if body[pos : pos + 1] != "," or _SURROGATE_ESCAPE.search(body, 0, pos):
            return None
        meta, pos = dict(meta), pos + 1
    if _native_scan is not None and body.isascii():  # the same grammar, one pass in C
        got = _native_scan(body, pos, {}, _kind, TensorInfo)
        return None if got is None else (got, meta)
    out: dict[str, TensorInfo] = {}
    kinds: _Kinds = {}
    count, end = 0, len(body)
    while pos < end:
        # A chunk ends after an entry's `]},`; one that its entries do not tile exactly (the
        # cut fell inside a name, or anything else sits between entries) ends the fast path.
        cut = body.find("]},", pos + _CHUNK)
        stop = end if cut < 0 else cut + 3
        got = _chunk_entries(body, pos, stop, kinds)
        if got is None:
            return None
        out.update(got)
        count += len(got)
        pos = stop
    if count == 0 or len(out) != count or "__metadata__" in out:
        return None
    return out, meta


_CHUNK = 1 << 20  # characters of header text per scan (~8,000 entries held as groups at once)
_SAMPLE = _ENTRY.fullmatch('"n":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},')
_FIXED = len(_SAMPLE.group(0)) - sum(map(len, _SAMPLE.groups()[:5]))  # an entry's other chars
_KIND_DTYPE, _KIND_SHAPE, _KIND_BITS = itemgetter(0), itemgetter(1), itemgetter(2)


def _chunk_entries(
    body: str, pos: int, stop: int, kinds: _Kinds
) -> list[tuple[str, TensorInfo]] | None:
    """(name, entry) of each entry in body[pos:stop], or None unless entries tile it exactly,
    every separator is a comma but a `}` closing the header, and every size is right.

    `findall` matches do not overlap and lie inside [pos, stop): when their lengths add up to
    stop - pos they cover it without a gap. Every step is a C-level loop."""
    rows = _ENTRY.findall(body, pos, stop)
    if not rows:
        return None
    names, dtypes, dims, begins, ends, seps = zip(*rows, strict=True)
    covered = _FIXED * len(rows) + sum(
        sum(map(len, group)) for group in (names, dtypes, dims, begins, ends)
    )
    closes = stop == len(body)
    if covered != stop - pos or seps.count(",") != len(seps) - closes:
        return None
    if seps[-1] != ("}" if closes else ","):
        return None
    keys = list(zip(dtypes, dims, strict=True))
    for key in set(keys).difference(kinds):
        kinds[key] = _kind(*key)
    of = list(map(kinds.__getitem__, keys))
    b, e = list(map(int, begins)), list(map(int, ends))
    if max(e) > MAX_INT48:
        return None
    if list(map(lshift, map(sub, e, b), repeat(3))) != list(map(_KIND_BITS, of)):
        return None
    fields = zip(names, map(_KIND_DTYPE, of), map(_KIND_SHAPE, of), b, e, strict=True)
    return list(zip(names, map(tuple.__new__, repeat(TensorInfo), fields), strict=True))


MAX_NUMEL = 2**64 - 1


def shape_numel(shape: list[int] | tuple[int, ...]) -> int | None:
    """The element count of non-negative dimensions, multiplied left to right as the reference
    reader multiplies them (checked 64-bit products): None once a partial product passes
    2^64 - 1, which it refuses even when a later dimension is 0. Bounded work: 10^5 dimensions
    of 2^48 would otherwise make a product of a million digits, quadratically."""
    n = 1
    for d in shape:
        n *= d
        if n > MAX_NUMEL:
            return None
    return n


def _kind(dtype: str, dims: str) -> tuple[str, tuple[int, ...], int]:
    """(dtype, shape, payload bits) shared by every entry of that dtype and shape; -1 bits
    when no entry may have them (unknown dtype, a dimension beyond 2^48, a count that
    overflows)."""
    shape = tuple(int(d) for d in dims.split(",")) if dims else ()
    bits = BITS.get(dtype)
    numel = shape_numel(shape) if not any(d > MAX_INT48 for d in shape) else None
    if bits is None or numel is None:
        return dtype, shape, -1
    return next(k for k in BITS if k == dtype), shape, numel * bits


def _round_trip(text: str) -> _Fast | None:
    """The same from the C JSON parser, for headers in another layout (keys in another order,
    escapes in names).

    The plain parser keeps the last of duplicate keys and accepts NaN, so it is trusted only
    when re-encoding its result gives back the exact header text (padding spaces aside): the
    compact form every safetensors writer emits, which cannot hold a duplicate key, a
    non-finite number or leading whitespace.
    """
    body = text.rstrip(" ")
    if _SURROGATE_ESCAPE.search(body):
        return None  # lone surrogates survive an ASCII round trip: the full checks decide
    try:
        header = json.loads(body)
        if type(header) is not dict:
            return None
        again = json.dumps(header, separators=(",", ":"), ensure_ascii=body.isascii(),
                           allow_nan=False)  # fmt: skip
    except (ValueError, RecursionError):
        return None
    if again != body:
        return None
    meta = header.pop("__metadata__", None) if "__metadata__" in header else _ABSENT
    if meta is not _ABSENT and (
        type(meta) is not dict or not all(type(v) is str for v in meta.values())
    ):
        return None
    joined = "|".join(header)
    if not header or ".." in joined or _UNSAFE_CHAR.search(joined):
        return None
    out: dict[str, TensorInfo] = {}
    bits_of = BITS.get
    for name, entry in header.items():
        if type(entry) is not dict or len(entry) != 3:
            return None
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        bits = bits_of(dtype) if type(dtype) is str else None
        if bits is None or type(shape) is not list or type(offsets) is not list:
            return None
        for d in shape:
            if type(d) is not int or d < 0 or d > MAX_INT48:
                return None
        if len(offsets) != 2:
            return None
        begin, end = offsets
        if type(begin) is not int or type(end) is not int or not 0 <= begin <= end <= MAX_INT48:
            return None
        numel = shape_numel(shape)
        if numel is None or numel * bits % 8 or numel * bits >> 3 != end - begin:
            return None
        out[name] = TensorInfo(name, dtype, tuple(shape), begin, end)
    return out, (None if meta is _ABSENT else meta)


def _valid_int_list(v: object, n: int | None = None) -> bool:
    return (
        type(v) is list
        and (n is None or len(v) == n)
        and all(type(d) is int and 0 <= d <= MAX_INT48 for d in v)
    )


def _entry(name: str, entry: object, label: str, findings: Findings) -> TensorInfo | None:
    shown = escape_name(name)
    ptr = "/" + name.replace("~", "~0").replace("/", "~1")
    if is_unsafe_name(name):
        findings.add(rules.ST_NAME, f"tensor name {shown!r} is unsafe", file=label, tensor=shown)
    if not isinstance(entry, dict) or not entry.keys() >= _ENTRY_FIELDS:
        findings.add(
            rules.ST_ENTRY,
            "entry must be an object with dtype, shape, data_offsets",
            file=label,
            tensor=shown,
            pointer=ptr,
        )
        return None
    extra = sorted(set(entry) - _ENTRY_FIELDS)
    if extra:
        findings.add(
            rules.ST_EXTRA_FIELD, f"unknown fields {extra}", file=label, tensor=shown, pointer=ptr
        )
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    ok = True
    if not isinstance(dtype, str) or dtype not in BITS:
        findings.add(
            rules.ST_DTYPE,
            f"unknown dtype {dtype!r}",
            file=label,
            tensor=shown,
            pointer=ptr + "/dtype",
        )
        ok = False
    if not _valid_int_list(shape):
        findings.add(
            rules.ST_SHAPE, f"shape {shape!r}", file=label, tensor=shown, pointer=ptr + "/shape"
        )
        ok = False
    if not (_valid_int_list(offsets, 2) and offsets[0] <= offsets[1]):
        findings.add(
            rules.ST_OFFSETS,
            f"data_offsets {offsets!r}",
            file=label,
            tensor=shown,
            pointer=ptr + "/data_offsets",
        )
        ok = False
    if not ok:
        return None
    numel = shape_numel(shape)
    length = offsets[1] - offsets[0]
    if numel is None:
        findings.add(
            rules.ST_SIZE,
            f"the element count of shape {_shown_shape(shape)} passes 2^64 - 1 (safetensors "
            "refuses it)",
            file=label,
            tensor=shown,
            pointer=ptr + "/shape",
        )
        return None
    bits = numel * BITS[dtype]
    if bits % 8 or bits // 8 != length:
        findings.add(
            rules.ST_SIZE,
            f"{dtype}{shape} needs {_bytes_text(bits)}, data_offsets span {length}",
            file=label,
            tensor=shown,
            pointer=ptr + "/data_offsets",
        )
        return None
    return TensorInfo(name, dtype, tuple(shape), offsets[0], offsets[1])


def _shown_shape(shape: list[int]) -> str:
    """A shape for a message: at most 8 dimensions, then how many more."""
    head = ", ".join(map(str, shape[:8]))
    return f"[{head}, … {len(shape) - 8} more]" if len(shape) > 8 else f"[{head}]"


def _bytes_text(bits: int) -> str:
    """`bits` as bytes, in integers only (a hostile shape's product is beyond any float)."""
    whole, rest = divmod(bits, 8)
    return f"{whole} bytes" if not rest else f"{whole} bytes and {rest} bits"


_BEGIN, _END = itemgetter(3), itemgetter(4)


def _tiles(out: SafetensorsFile) -> bool:
    """Whether the payloads of a complete header cover the data section exactly, one after
    the other, none empty; C-level sorts of the offsets instead of a walk (10^6 entries).

    Sorted begins b and ends e with b[0] = 0, b[i+1] = e[i] and e[-1] = the data length mean
    every byte of the section lies in exactly one payload (a byte at x is in as many payloads
    as there are begins at or below x less the ends at or below it: one); with no payload
    empty, that is a tiling without gap or overlap."""
    infos = out.tensors.values()
    if not infos or out.invalid_entries:
        return False
    begins, ends = sorted(map(_BEGIN, infos)), sorted(map(_END, infos))
    return (
        begins[0] == 0
        and ends[-1] == out.file_size - out.data_start
        and begins[1:] == ends[:-1]
        and 0 not in map(sub, map(_END, infos), map(_BEGIN, infos))
    )


def _check_layout(out: SafetensorsFile, findings: Findings) -> None:
    label = out.label
    if out.data_start % 8:
        findings.add(rules.ST_ALIGN, f"data starts at byte {out.data_start}", file=label)
    if _tiles(out):
        return  # the usual file: the walk below would report and drop nothing
    # With a malformed entry dropped, its bytes look like a gap or trailing data: say nothing.
    complete = not out.invalid_entries
    pos = 0
    owner: TensorInfo | None = None
    for t in sorted(out.tensors.values(), key=itemgetter(3, 4)):  # (begin, end)
        if t.begin > pos and complete:
            findings.add(
                rules.ST_GAP,
                f"{t.begin - pos} unused bytes before this tensor",
                file=label,
                tensor=escape_name(t.name),
            )
        elif t.begin < pos and owner is not None:
            findings.add(
                rules.ST_OVERLAP,
                f"[{t.begin}, {t.end}) overlaps {escape_name(owner.name)}",
                file=label,
                tensor=escape_name(t.name),
            )
        if t.end >= pos:
            pos, owner = t.end, t
    data_len = out.file_size - out.data_start
    if pos > data_len or (pos < data_len and complete):
        what = "trailing bytes after" if pos < data_len else "payloads run past end of file by"
        findings.add(rules.ST_COVERAGE, f"{what} {abs(data_len - pos)} bytes", file=label)
    # A payload past the end of the file cannot be read: drop its entry (reported above) so no
    # later check maps bytes that are not there.
    for name in [n for n, t in out.tensors.items() if t.end > data_len]:
        del out.tensors[name]
        out.invalid_entries += 1
