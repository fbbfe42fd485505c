"""Payload reads of the checks: a random-access reader, deferred marker reads and a deferred
NaN/Inf scan, done together in one packed gather per shard (few preads, never the whole shard).

The scan runs in C where native/spans.c is built; else numpy is imported only when the vectors
to scan are large enough for its import (~50 ms) to pay off, and smaller scans test the
exponent bits with Python integers. All three give the same results.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter
from pathlib import Path
from typing import Any

from exl3tool.formats.checkpoint import TensorRef
from exl3tool.io import native
from exl3tool.io.safetensors import MAX_HEADER, FileStamp, SafetensorsFile
from exl3tool.io.views import TensorReader
from exl3tool.rules.registry import Findings

# Vector bytes scanned by one process from which it uses numpy: its import and first use cost
# ~0.1-0.2 s, what Python integers take for ~30 MB of words (GLM-5.2's MTP shard, 12.6 MB:
# 0.04 s with integers); numpy then scans ~5 GB/s.
NUMPY_MIN_BYTES = 32 << 20

_I32 = struct.Struct("<i")
_FIRST, _SECOND = itemgetter(0), itemgetter(1)


class RandomAccessReader(TensorReader):
    """A TensorReader whose files are advised POSIX_FADV_RANDOM: the checks read 4-byte markers
    and small vectors scattered between large trellis payloads, and the kernel's default
    readahead would otherwise pull in megabytes of trellis around every read. Marker reads
    are deferred into `markers` and done with the NaN/Inf scan (`run_deferred`)."""

    def __init__(self) -> None:
        super().__init__()
        self.markers = MarkerCheck()

    def _map(self, st: SafetensorsFile) -> Any:
        fresh = st.path not in self._maps
        m = super()._map(st)
        if fresh:
            m.advise_random()
        return m


def read_scalar_i32(reader: TensorReader, ref: TensorRef) -> int | None:
    """The int32 value of a 4-byte scalar tensor (read with pread), or None."""
    if ref.info.nbytes != 4:
        return None
    try:
        return int.from_bytes(reader.payload(ref.shard, ref.info), "little", signed=True)
    except (ValueError, OSError):
        return None


def _by_shard(items: list[tuple[TensorRef, Any]]) -> dict[Path, list[tuple[TensorRef, Any]]]:
    """`items` grouped by their shard's path, each group in order (runs of one shard object are
    found by identity, in C: the checks defer a shard's items together)."""
    out: dict[Path, list[tuple[TensorRef, Any]]] = {}
    shards = list(map(_FIRST, map(_FIRST, items)))
    at = 0
    for _, run in groupby(map(id, shards)):
        n = len(list(run))
        group = out.get(shards[at].path)
        if group is None:
            group = out[shards[at].path] = []
        group.extend(items[at : at + n])
        at += n
    return out


class MarkerCheck:
    """Deferred reads of int32 scalar markers (a GLM-5.2 R7 checkpoint has 57,600 of them; a
    pread each costs more than the check)."""

    def __init__(self) -> None:
        # (ref, expected), in order; who appends here directly keeps what `add` keeps
        self.items: list[tuple[TensorRef, int]] = []

    def add(self, ref: TensorRef, expected: int) -> None:
        info = ref.info
        if info.nbytes == 4 and info.end + ref.shard.data_start <= ref.shard.file_size:
            self.items.append((ref, expected))


# word size and exponent mask per float dtype; all exponent bits set = NaN or Inf
_EXPONENT_BITS = {"F16": (2, 0x7C00), "F32": (4, 0x7F800000)}
_WORD_VIEW = {2: "<u2", 4: "<u4"}
# (dtype, payload bytes, position in the packed data) of one vector to scan
Placed = tuple[str, int, int]


class FiniteCheck:
    """Deferred NaN/Inf scan of F16/F32 vectors: a vector fails when a whole word of its
    payload has every exponent bit set."""

    def __init__(self) -> None:
        # (ref, None), in order; who appends here directly keeps what `add` keeps
        self.items: list[tuple[TensorRef, None]] = []

    def add(self, ref: TensorRef) -> None:
        info = ref.info
        end_ok = info.end + ref.shard.data_start <= ref.shard.file_size
        if info.dtype in _EXPONENT_BITS and info.nbytes and end_ok:
            self.items.append((ref, None))


# A vector read ahead by the worker (`read_facts`) at most this size, and at most this many
# vector bytes in all (GLM-5.2: 236 MB; a header may list any number of overlapping ones);
# what is left out the checks read themselves if they scan it at all.
FACTS_MAX_VECTOR = 1 << 20
FACTS_MAX_TOTAL = 512 << 20


@dataclass(frozen=True)
class ShardFacts:
    """The bytes `run_deferred` would read from one shard, read ahead by a worker: the int32
    value at the begin of every 4-byte span, and which F16/F32 vectors hold a NaN/Inf word.
    Offsets are relative to the data section, so they hold only while the shard's stamp (its
    header with it) is unchanged; vectors are keyed (begin, end, dtype)."""

    stamp: FileStamp
    values: dict[int, int]
    scanned: frozenset[tuple[int, int, str]]
    failed: frozenset[tuple[int, int, str]]


# The dtype and offsets of the entries that can be markers or scanned vectors (I32 markers,
# F16/F32 vectors). The facts need no names (spans are their keys), so a shard is read ahead
# without a full parse: a span its header does not hold is only never looked up, and a
# deferred read the facts lack is done by the checks themselves.
_SPAN = re.compile(
    rb'"dtype":"(I32|F16|F32)","shape":\[[0-9,]*\],"data_offsets":\[([0-9]{1,15}),([0-9]{1,15})\]'
)
_FACT_DTYPES = {b"I32": "I32", b"F16": "F16", b"F32": "F32"}
# native/spans.c: the match-and-filter loop of `fact_reads` in C (absent without a C compiler,
# unused with EXL3TOOL_PURE_SCAN=1).
_native_fact_spans: Callable[[bytes, int, int], tuple[list[tuple[int, int]], list[str]]] | None
_native_fact_spans = None
# native/spans.c: the indices of the vectors holding a NaN/Inf word (None: declined)
_native_special: Callable[[bytearray, list[Placed]], list[int] | None] | None = None
if native.ENABLED:
    with contextlib.suppress(ImportError):
        from exl3tool.io._spans import fact_spans as _native_fact_spans
        from exl3tool.io._spans import special as _native_special


@dataclass(frozen=True)
class FactReads:
    """What `read_facts` reads of one shard: spans [begin, end) relative to its data section,
    in header order, and each one's dtype. A 4-byte span is read as a marker, an F16/F32 one
    is scanned (a 4-byte F32 span is both, as the checks may defer it as either)."""

    shard: SafetensorsFile
    spans: list[tuple[int, int]]
    dtypes: list[str]

    def vector_bytes(self) -> int:
        return sum(e - b for (b, e), d in zip(self.spans, self.dtypes, strict=True) if d != "I32")


def fact_reads(path: Path, label: str) -> FactReads | None:
    """Every 4-byte tensor and every F16/F32 vector of at most FACTS_MAX_VECTOR bytes the header
    of the shard at `path` lists (None when it is not plain)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with open(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            return None
        head = fh.read(8)
        (n,) = struct.unpack("<Q", head) if len(head) == 8 else (0,)
        if not 0 < n <= MAX_HEADER or 8 + n > st.st_size:
            return None
        raw = fh.read(n)
    shard = SafetensorsFile(path, label, st.st_size, n, FileStamp.of(st))
    room = st.st_size - shard.data_start
    if _native_fact_spans is not None:  # the same spans, one pass in C
        spans, dtypes = _native_fact_spans(raw, room, FACTS_MAX_VECTOR)
        return FactReads(shard, spans, dtypes)
    spans = []
    dtypes = []
    for dtype, begin, end in _SPAN.findall(raw):
        b, e = int(begin), int(end)
        # not the trellis, inside the file; a marker or a vector
        if 0 < e - b <= FACTS_MAX_VECTOR and e <= room and (e - b == 4 or dtype != b"I32"):
            spans.append((b, e))
            dtypes.append(_FACT_DTYPES[dtype])
    return FactReads(shard, spans, dtypes)


def read_facts(reads: FactReads, reader: TensorReader, numpy: bool) -> ShardFacts:
    """The facts of `reads`, read as `run_deferred` reads them (one gather, the same scans;
    `numpy`: which of the two, whose results are the same)."""
    spans, dtypes = reads.spans, reads.dtypes
    values: dict[int, int] = {}
    keys: list[tuple[int, int, str]] = []
    bad: list[int] = []
    if spans:
        data, pos = reader.gather(reads.shard, spans)
        unpack = _I32.unpack_from
        values = {b: unpack(data, p)[0] for (b, e), p in zip(spans, pos, strict=True) if e - b == 4}
        placed = []
        for (b, e), dtype, p in zip(spans, dtypes, pos, strict=True):
            if dtype != "I32":
                keys.append((b, e, dtype))
                placed.append((dtype, e - b, p))
        bad = _scan(data, placed, numpy)
    return ShardFacts(reads.shard.stamp, values, frozenset(keys), frozenset(keys[i] for i in bad))


_BEGIN = itemgetter(3)  # of a TensorInfo
_KEY = itemgetter(3, 4, 1)  # (begin, end, dtype) of a TensorInfo


def _from_facts(
    facts: ShardFacts,
    m_items: list[tuple[TensorRef, int]],
    f_items: list[tuple[TensorRef, None]],
) -> tuple[list[tuple[TensorRef, int, int]], list[TensorRef]] | None:
    """What `check` of `run_deferred` finds in one shard, from read-ahead facts; None when the
    facts do not cover every deferred read. The usual shard (every marker right, no NaN/Inf)
    costs set and list operations only."""
    m_refs = list(map(_FIRST, m_items))
    got = list(map(facts.values.get, map(_BEGIN, map(_SECOND, m_refs))))
    if None in got:
        return None
    wants = list(map(_SECOND, m_items))
    wrong = []
    if got != wants:
        wrong = [(r, g, w) for r, g, w in zip(m_refs, got, wants, strict=True) if g != w]
    f_refs = list(map(_FIRST, f_items))
    keys = list(map(_KEY, map(_SECOND, f_refs)))
    if not facts.scanned.issuperset(keys):
        return None
    if facts.failed.isdisjoint(keys):
        return wrong, []
    hits = [k in facts.failed for k in keys]
    # the scans' report order: per dtype, payloads at an odd offset first, then aligned ones
    # (a packed position keeps its offset mod 16, so oddness is the offset's)
    failed: list[TensorRef] = []
    for dtype, (size, _) in _EXPONENT_BITS.items():
        for odd in (True, False):
            for ref, hit in zip(f_refs, hits, strict=True):
                if hit and ref.info.dtype == dtype and bool(ref.info.begin % size) is odd:
                    failed.append(ref)
    return wrong, failed


def run_deferred(
    reader: TensorReader,
    markers: MarkerCheck | None,
    finite: FiniteCheck,
    bad_marker: Callable[[TensorRef, int, int], None],
    nonfinite: Callable[[TensorRef], None],
    facts: dict[Path, ShardFacts] | None = None,
) -> None:
    """Read every deferred marker and vector with one gather per shard; report each marker
    whose value differs (bad_marker(ref, value, expected)), then each vector holding NaN/Inf.
    `facts`: shards read ahead (`read_facts`), used where their stamp still holds."""
    marked = _by_shard(markers.items if markers is not None else [])
    scanned = _by_shard(finite.items)
    results: dict[Path, tuple[list[tuple[TensorRef, int, int]], list[TensorRef]]] = {}
    left: list[Path] = []  # the shards read here, not from facts
    for path in {**marked, **scanned}:
        known = facts.get(path) if facts else None
        if known is not None:
            items = marked.get(path) or scanned[path]
            if known.stamp == items[0][0].shard.stamp:
                got = _from_facts(known, marked.get(path, []), scanned.get(path, []))
                if got is not None:
                    results[path] = got
                    continue
        left.append(path)
    # numpy only for what this process scans itself (facts read ahead need no scan)
    own = sum(r.info.nbytes for path in left for r, _ in scanned.get(path, ()))
    use_numpy = own >= NUMPY_MIN_BYTES

    def check(path: Path) -> tuple[list[tuple[TensorRef, int, int]], list[TensorRef]]:
        m_items, f_items = marked.get(path, []), scanned.get(path, [])
        items = m_items + f_items
        spans = [(r.info.begin, r.info.end) for r, _ in items]
        data, pos = reader.gather(items[0][0].shard, spans)
        unpack = _I32.unpack_from
        wrong = [
            (ref, got, want)
            for (ref, want), p in zip(m_items, pos, strict=False)
            if (got := unpack(data, p)[0]) != want
        ]
        if not f_items:
            return wrong, []
        refs = [r for r, _ in f_items]
        at = pos[len(m_items) :]
        placed = [(r.info.dtype, r.info.nbytes, p) for r, p in zip(refs, at, strict=True)]
        bad = _scan(data, placed, use_numpy)
        return wrong, [refs[i] for i in bad]

    for path in left:
        results[path] = check(path)
    wrong = {p: r[0] for p, r in results.items()}
    failed = {p: r[1] for p, r in results.items()}
    for path in marked:
        for args in wrong[path]:
            bad_marker(*args)
    for path in scanned:
        for ref in failed[path]:
            nonfinite(ref)


def _scan(data: bytearray, placed: list[Placed], numpy: bool) -> list[int]:
    """The indices of the NaN/Inf vectors of `placed`, in the scans' report order: per dtype,
    payloads at an odd offset first, then the aligned ones. In C where it is built, else with
    numpy (`numpy`) or Python integers."""
    hits = _native_special(data, placed) if _native_special is not None else None
    if hits is None:
        return (_scan_numpy if numpy else _scan_ints)(data, placed)
    return _in_report_order(hits, placed)


def _in_report_order(hits: list[int], placed: list[Placed]) -> list[int]:
    """The indices `hits` (ascending) in `_scan_words`' order: per dtype, payloads at an odd
    offset first, then the aligned ones."""
    bad: list[int] = []
    for dtype, (size, _) in _EXPONENT_BITS.items():
        for odd in (True, False):
            bad.extend(
                i for i in hits if placed[i][0] == dtype and bool(placed[i][2] % size) is odd
            )
    return bad


def _scan_ints(data: bytearray, placed: list[Placed]) -> list[int]:
    """The indices of the NaN/Inf vectors of `placed`, one Python-integer test each: word w
    fails when (w & mask) + lowest mask bit carries into the bit above the mask."""
    hits = [
        i
        for i, (d, n, p) in enumerate(placed)
        if d in _EXPONENT_BITS and _has_nonfinite(data, p, n, *_EXPONENT_BITS[d])
    ]
    return _in_report_order(hits, placed)


def _has_nonfinite(data: bytearray, p: int, nbytes: int, size: int, mask: int) -> bool:
    n = nbytes - nbytes % size
    if not n:
        return False
    low = mask & -mask
    reps = n // size
    word_m, word_c, word_h = (v.to_bytes(size, "little") * reps for v in (mask, low, mask + low))
    x = int.from_bytes(data[p : p + n], "little")
    m, c, h = (int.from_bytes(b, "little") for b in (word_m, word_c, word_h))
    return bool(((x & m) + c) & h)


def _scan_numpy(data: bytearray, placed: list[Placed]) -> list[int]:
    """The same over a zero-copy numpy view: the whole packed read is tested once, and a per-word
    index is built only when a NaN/Inf word is there at all."""
    import numpy as np

    arr = np.frombuffer(data, dtype=np.uint8)
    bad: list[int] = []
    for dtype, (size, mask) in _EXPONENT_BITS.items():
        sel = [(i, n, p) for i, (d, n, p) in enumerate(placed) if d == dtype]
        if sel:
            bad.extend(_scan_words(np, arr, sel, size, mask))
    return bad


SCAN_WORDS = 1 << 14  # words tested per step: temporaries of at most 64 KiB


def _any_special(np: Any, words: Any, mask: int) -> bool:
    """Whether any word has all `mask` bits set (a NaN/Inf exponent), tested in steps of
    SCAN_WORDS: whole-array temporaries (MBs a shard) were given back to the system after each
    shard and faulted in again for the next (3x the scan's time in the read-ahead worker)."""
    tmp = np.empty(min(words.size, SCAN_WORDS), words.dtype)
    hit = np.empty(tmp.size, bool)
    for at in range(0, words.size, SCAN_WORDS):
        part = words[at : at + SCAN_WORDS]
        n = part.size
        np.bitwise_and(part, mask, out=tmp[:n])
        np.equal(tmp[:n], mask, out=hit[:n])
        if hit[:n].any():
            return True
    return False


def _scan_words(
    np: Any, data: Any, sel: list[tuple[int, int, int]], size: int, mask: int
) -> list[int]:
    """The indices (the first of each `sel` triple) of the vectors with a NaN/Inf word."""
    view = _WORD_VIEW[size]
    bad: list[int] = []
    aligned = [(i, n, p) for i, n, p in sel if p % size == 0]
    for i, n, p in sel:  # an odd offset cannot be viewed as a word array: check it alone
        if p % size:
            words = data[p : p + n - n % size].copy().view(view)
            if ((words & mask) == mask).any():
                bad.append(i)
    if not aligned:
        return bad
    words = data[: data.size - data.size % size].view(view)
    if not _any_special(np, words, mask):
        return bad  # the usual case: no NaN/Inf word anywhere in the packed reads, not even in gaps
    starts = np.fromiter((p // size for _, _, p in aligned), np.int64, len(aligned))
    # words of each payload (its numel may disagree with its bytes: the header checks say so)
    counts = np.fromiter((n // size for _, n, _ in aligned), np.int64, len(aligned))
    # NaN/Inf words before each word (payloads may overlap, and gaps read along may hold
    # trellis words that look like NaN): a payload fails when its words add some
    before = np.zeros(words.size + 1, np.int64)
    np.cumsum((words & mask) == mask, out=before[1:])
    for j in np.flatnonzero(before[starts + counts] > before[starts]):
        bad.append(aligned[j][0])
    return bad


@dataclass(frozen=True)
class Scan:
    """Where one artifact's checks report, and how they read payload bytes (deferred reads)."""

    findings: Findings
    reader: TensorReader
    finite: FiniteCheck
