"""The R7 read-ahead's per-span loops in C (native/spans.c) against the Python code they
replace: `fact_spans` finds exactly the spans `checks.payload.fact_reads` keeps, and `gather`
packs exactly the bytes and positions of `io.views.TensorReader.gather`, or declines (None)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from native_build import check_built

from exl3tool.checks import payload
from exl3tool.formats.checkpoint import load_checkpoint
from exl3tool.io import views
from exl3tool.io.st_writer import write_arrays
from exl3tool.io.views import GATHER_GAP, InputChanged, TensorReader
from exl3tool.rules.registry import Findings

try:
    from exl3tool.io import _spans as native
except ImportError:  # the test below says whether that is a fault; the rest skip
    native = None


def test_the_native_spans_module_is_built() -> None:
    """`make install` compiles it (setup.py) wherever a C compiler is; without one the Python
    loops run (the same results, slower)."""
    check_built(native, "_spans", "the Python loops run")


needs_native = pytest.mark.skipif(native is None, reason="not built (the test above fails)")
# The tests that reach C through the package (views.gather, payload.fact_reads) need its hooks:
# EXL3TOOL_PURE_SCAN=1 in the environment leaves them unset (the test below checks that).
HOOKED = native is not None and (views._native_gather, payload._native_fact_spans) == (
    native.gather,
    native.fact_spans,
)
needs_hooks = pytest.mark.skipif(
    not HOOKED, reason="not built, or EXL3TOOL_PURE_SCAN set: the package runs Python"
)


@pytest.mark.parametrize("pure", [True, False])
def test_the_package_uses_the_compiled_loops_unless_told_not_to(pure: bool) -> None:
    code = (
        "import exl3tool.io.views as v, exl3tool.checks.payload as p, exl3tool.io.safetensors as s\n"
        "import exl3tool.io.index_scan as i\n"
        "hooks = v._native_gather, p._native_fact_spans, p._native_special, s._native_scan\n"
        "print(*(f is None for f in (*hooks, i._native_index_scan)))"
    )
    env = {k: v for k, v in os.environ.items() if k != "EXL3TOOL_PURE_SCAN"}
    if pure:
        env["EXL3TOOL_PURE_SCAN"] = "1"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    unused = pure or native is None
    assert out == [str(unused)] * 5


# ---- fact_spans ------------------------------------------------------------------------------

ROOM = 10**6


def _python_spans(raw: bytes, room: int, max_vector: int) -> tuple[list, list]:
    spans, dtypes = [], []
    for dtype, begin, end in payload._SPAN.findall(raw):
        b, e = int(begin), int(end)
        if 0 < e - b <= max_vector and e <= room and (e - b == 4 or dtype != b"I32"):
            spans.append((b, e))
            dtypes.append(payload._FACT_DTYPES[dtype])
    return spans, dtypes


def _entry(name: str, dtype: str, shape: str, b: str, e: str) -> bytes:
    return (f'"{name}":{{"dtype":"{dtype}","shape":[{shape}],"data_offsets":[{b},{e}]}}').encode()


@needs_native
@needs_hooks
def test_fact_spans_of_a_written_header(tmp_path: Path) -> None:
    """A real shard: its markers and vectors, not its trellis or its wide ints."""
    arrays = {
        "a.trellis": np.zeros((4, 4, 48), np.uint16),
        "a.mcg": np.array([0x3F8C], np.int32),
        "a.suh": np.ones(256, np.float16),
        "a.svh": np.ones(64, np.float32),
        "a.wide": np.zeros(2, np.int32),  # 8 bytes of I32: not a marker
        "a.bf": np.zeros(8, np.uint16),
    }
    path = tmp_path / "s.safetensors"
    with open(path, "wb") as fh:
        write_arrays(fh, arrays, dtypes={"a.bf": "BF16"})
    got = payload.fact_reads(path, "s")
    assert got is not None
    shard = load_checkpoint(path, Findings()).shards[path.name]
    want = {
        (shard.tensors[n].begin, shard.tensors[n].end): d
        for n, d in (("a.mcg", "I32"), ("a.suh", "F16"), ("a.svh", "F32"))
    }
    assert dict(zip(got.spans, got.dtypes, strict=True)) == want
    raw = path.read_bytes()[8 : shard.data_start]
    assert native.fact_spans(raw, ROOM, payload.FACTS_MAX_VECTOR) == _python_spans(
        raw, ROOM, payload.FACTS_MAX_VECTOR
    )


@needs_native
@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b'"dtype":"',
        _entry("x", "I32", "1", "0", "4"),
        _entry("x", "I32", "2", "0", "8"),  # an 8-byte I32: not a marker
        _entry("x", "F16", "", "000", "0016"),  # leading zeros, as the pattern allows
        _entry("x", "F16", "8", "1" * 15, "1" * 15),  # empty
        _entry("x", "F16", "8", "0", "1" * 16),  # 16 digits: no match
        _entry("x", "F16", "8", "0", "9" * 15),  # past the room
        _entry("x", "F32", "1,2,,3,", "16", "20"),  # the shape's grammar is [0-9,]*
        _entry("x", "F64", "2", "0", "16"),
        _entry("x", "F16", "2 ", "0", "4"),
        b'"dtype":"F16","shape":[],"data_offsets":[0,4]',  # cut after the match: still one
        b'"dtype":"F16","shape":[],"data_offsets":[0,4',
        b'"dtype":"dtype":"F16","shape":[],"data_offsets":[0,4]',  # a match after a failed start
        b'""dtype":"I32","shape":[1],"data_offsets":[4,8]"dtype":"F16","shape":[2],"data_offsets":[8,12]',
        b"\x00\xff" + _entry("x", "F16", "2", "0", "4") + b"\x00",
        _entry("x", "F16", "2", "4", "0"),  # end before begin
    ],
)
def test_fact_spans_cases(raw: bytes) -> None:
    limits = (
        (ROOM, payload.FACTS_MAX_VECTOR),
        (10, 4),
        (0, 1 << 20),
        (2**63, 2**70),
        (-(2**64), 4),
    )
    for room, most in limits:
        assert native.fact_spans(raw, room, most) == _python_spans(raw, room, most)


_FRAGMENTS = st.sampled_from(
    [
        b'"dtype":"', b"I32", b"F16", b"F32", b"BF16", b'","shape":[', b"],", b'"data_offsets":[',
        b'],"data_offsets":[', b",", b"]", b"}", b"{", b'"', b"0", b"4", b"16", b"007",
        b"999999999999999", b"1000000000000000", b"12", b"x", b"\\", b"\x00", b"\xe9",
    ]
)  # fmt: skip


@needs_native
@settings(max_examples=600, deadline=None)
@given(
    parts=st.lists(_FRAGMENTS | st.binary(max_size=6), max_size=60),
    room=st.integers(-5, 2**40),
    most=st.integers(0, 2**20),
)
def test_fact_spans_agree_on_any_text(parts: list[bytes], room: int, most: int) -> None:
    raw = b"".join(parts)
    assert native.fact_spans(raw, room, most) == _python_spans(raw, room, most)


@needs_native
@settings(max_examples=200, deadline=None)
@given(
    entries=st.lists(
        st.tuples(
            st.sampled_from(["I32", "F16", "F32", "U8", "BF16"]),
            st.integers(0, 5000),
            st.integers(0, 300),
        ),
        max_size=30,
    ),
    room=st.integers(0, 6000),
)
def test_fact_spans_find_every_kept_entry(entries: list, room: int) -> None:
    """A header of well-formed entries: every span the filter keeps is found, in order."""
    raw = (
        b"{"
        + b",".join(
            _entry(f"t{i}", d, "1", str(b), str(b + n)) for i, (d, b, n) in enumerate(entries)
        )
        + b"}"
    )
    spans, dtypes = native.fact_spans(raw, room, 256)
    want = [
        ((b, b + n), d)
        for d, b, n in entries
        if d in ("I32", "F16", "F32") and 0 < n <= 256 and b + n <= room and (n == 4 or d != "I32")
    ]
    assert list(zip(spans, dtypes, strict=True)) == want


# ---- gather ----------------------------------------------------------------------------------

SIZE = 300_000


@pytest.fixture(scope="module")
def shard(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("g") / "m.safetensors"
    rng = np.random.default_rng(11)
    with open(path, "wb") as fh:
        write_arrays(fh, {"t": rng.integers(0, 255, SIZE, dtype=np.uint8)})
    return load_checkpoint(path, Findings()).shards[path.name]


def _python_gather(st_, spans: list) -> tuple[bytearray, list[int]]:
    real = views._native_gather
    views._native_gather = None
    try:
        with TensorReader() as rd:
            return rd.gather(st_, spans)
    finally:
        views._native_gather = real


_SPANS = st.lists(
    st.integers(0, SIZE).flatmap(
        lambda b: st.tuples(st.just(b), st.integers(b, min(SIZE, b + 3 * GATHER_GAP)))
    ),
    max_size=40,
)


@needs_native
@needs_hooks
@settings(max_examples=300, deadline=None)
@given(spans=_SPANS)
def test_gather_packs_like_python(shard, spans: list) -> None:
    """The same zero-filled buffer (pads included) and the same positions, for any spans:
    unsorted, overlapping, repeated, empty, near and far."""
    with TensorReader() as rd:
        data, pos = rd.gather(shard, spans)
    py_data, py_pos = _python_gather(shard, spans)
    assert pos == py_pos
    assert data == py_data
    raw = shard.path.read_bytes()[shard.data_start :]
    for (b, e), p in zip(spans, pos, strict=True):
        assert bytes(data[p : p + e - b]) == raw[b:e]
        assert p % 16 == b % 16


@needs_native
@needs_hooks
@pytest.mark.parametrize("apart", [GATHER_GAP - 1, GATHER_GAP, GATHER_GAP + 1])
def test_gather_merges_spans_up_to_the_gap(shard, apart: int) -> None:
    spans = [(3, 9), (9 + apart, 20 + apart), (0, 2)]
    fd = os.open(shard.path, os.O_RDONLY)
    try:
        pos = native.gather(fd, 0, spans, GATHER_GAP)[1]
        runs = len({p - b for (b, _), p in zip(spans, pos, strict=True)})
    finally:
        os.close(fd)
    assert runs == (1 if apart <= GATHER_GAP else 2)
    with TensorReader() as rd:
        assert rd.gather(shard, spans) == _python_gather(shard, spans)


@needs_native
def test_gather_declines_what_python_reads_its_own_way(shard) -> None:
    fd = os.open(shard.path, os.O_RDONLY)
    try:
        for spans in ([(-1, 4)], [(8, 4)], [(True, 4)], [[0, 4]], [(0, 4.0)], [(0, 2**63)]):
            assert native.gather(fd, shard.data_start, spans, GATHER_GAP) is None
        assert native.gather(fd, -1, [(0, 4)], GATHER_GAP) is None
        assert native.gather(fd, shard.data_start, [(0, 2**41)], GATHER_GAP) is None  # too big

        class Spans(list):  # indexed by Python, iterated by C: read as Python reads it
            def __getitem__(self, i):  # type: ignore[no-untyped-def]
                return (0, 8)

        for odd in (((0, 4) for _ in range(1)), {(0, 4)}, {(0, 4): 1}, Spans([(100, 104)])):
            assert native.gather(fd, shard.data_start, odd, GATHER_GAP) is None
        data, pos, short = native.gather(fd, shard.data_start, [], GATHER_GAP)
        assert (data, pos, short) == (bytearray(), [], [])
    finally:
        os.close(fd)


@needs_native
@needs_hooks
def test_gather_reports_the_runs_a_file_does_not_fill(tmp_path: Path, shard) -> None:
    """Past the end of the file: the run is listed as short (zero-filled), and the reader
    then reads it again and says the input changed, as the Python code does."""
    fd = os.open(shard.path, os.O_RDONLY)
    try:
        end = os.fstat(fd).st_size - shard.data_start
        data, pos, short = native.gather(fd, shard.data_start, [(0, 4), (end - 2, end + 6)], 0)
        assert short == [(shard.data_start + end - 2, 8, pos[1])]
        assert bytes(data[pos[1] : pos[1] + 8]) == bytes(8)
    finally:
        os.close(fd)
    with TensorReader() as rd, pytest.raises(InputChanged):
        rd.gather(shard, [(0, 4), (end - 2, end + 6)])
    with pytest.raises(InputChanged):
        _python_gather(shard, [(0, 4), (end - 2, end + 6)])


@needs_native
@needs_hooks
def test_the_read_ahead_gives_the_same_facts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`prefetch_r7` of a small R7 checkpoint: the same facts with and without the C loops."""
    from exl3tool.checks.r7 import prefetch_r7
    from exl3tool.synth.r7 import build_r7

    root = build_r7(tmp_path / "r7", num_hidden_layers=3, first_moe_layer=1, n_experts=4)
    monkeypatch.setattr(views, "RACY_NS", 0)  # the shards were written just now
    got = prefetch_r7(root)
    monkeypatch.setattr(payload, "_native_fact_spans", None)
    monkeypatch.setattr(views, "_native_gather", None)
    want = prefetch_r7(root)
    assert got is not None and want is not None
    assert got.facts and got.facts == want.facts


# ---- special ---------------------------------------------------------------------------------

_PLACED = st.lists(
    st.tuples(st.sampled_from(["F16", "F32"]), st.integers(0, 40), st.integers(0, 200)),
    max_size=12,
)


def _special_data(seed: int, size: int, density: float) -> bytearray:
    """Random words, `density` of them with every exponent bit set (F16 or F32 alike)."""
    rng = np.random.default_rng(seed)
    data = bytearray(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    for at in range(0, size - 3):  # clear one exponent bit of most words: finite
        if rng.random() >= density:
            data[at] &= 0x3F
    return data


@needs_native
@settings(max_examples=400, deadline=None)
@given(placed=_PLACED, seed=st.integers(0, 2**32 - 1), density=st.sampled_from([0.0, 0.01, 0.2]))
def test_special_finds_the_vectors_python_finds(placed: list, seed: int, density: float) -> None:
    """The same NaN/Inf vectors as the Python-integer scan, in the same report order (any
    alignment, partial trailing words, overlaps), wherever every payload lies inside the data."""
    data = _special_data(seed, 256, density)
    placed = [(d, n, p) for d, n, p in placed if p + n <= len(data)]
    hits = native.special(data, placed)
    want = payload._scan_ints(data, placed)
    assert hits == sorted(want)
    assert payload._scan(data, placed, False) == want


@needs_native
def test_special_reads_each_dtypes_exponent_bits() -> None:
    """One word each: F16 0x7C00 and F32 0x7F800000 set (NaN/Inf), one bit short (finite)."""
    words = [
        ("F16", (0x7C00).to_bytes(2, "little")),
        ("F16", (0x7BFF | 0x8000).to_bytes(2, "little")),
        ("F32", (0x7F800000).to_bytes(4, "little")),
        ("F32", (0x7F7FFFFF | 0x80000000).to_bytes(4, "little")),
    ]
    data = bytearray(b"".join(w for _, w in words))
    placed, at = [], 0
    for dtype, w in words:
        placed.append((dtype, len(w), at))
        at += len(w)
    assert native.special(data, placed) == [0, 2]


@needs_native
@pytest.mark.parametrize(
    "placed",
    [
        [("F16", 4, 7)],  # past the end
        [("F16", -2, 0)],
        [("F16", 2, -1)],
        [("BF16", 2, 0)],
        [("F16", 2.0, 0)],
        [("F16", 2, 0, 0)],
        [["F16", 2, 0]],
        [("F16", 2, 2**70)],
        (t for t in [("F16", 2, 0)]),
    ],
)
def test_special_declines_what_python_reads_its_own_way(placed: object) -> None:
    assert native.special(bytearray(8), placed) is None
