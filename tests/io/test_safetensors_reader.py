"""The strict header reader beyond the corpus: properties, differential on valid files, ST023."""

from __future__ import annotations

import io
import json
import os
import struct
import tempfile
from pathlib import Path

import corpus
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from exl3tool.io import safetensors as stmod
from exl3tool.io.safetensors import escape_name, is_unsafe_name, read_header
from exl3tool.io.st_writer import write_arrays
from exl3tool.io.views import TensorReader
from exl3tool.rules import io as rules
from exl3tool.rules.registry import Findings

_TMP = Path(tempfile.mkdtemp(prefix="exl3tool-st-"))


def _parse(
    data: bytes, name: str = "h.safetensors"
) -> tuple[stmod.SafetensorsFile | None, Findings]:
    p = _TMP / name
    p.write_bytes(data)
    fs = Findings()
    return read_header(p, fs, name), fs


def test_every_st_rule_is_covered_by_the_corpus_or_here() -> None:
    st_codes = {r.code for r in vars(rules).values() if isinstance(r, type(rules.ST_SHORT))}
    st_codes = {c for c in st_codes if c.startswith("ST")}
    covered = {d.code for d in corpus.CORPUS} | {"ST023"}  # ST023: test_file_changed_*
    assert st_codes == covered


def test_file_changed_while_reading(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    data = corpus.one(corpus.F32_4)
    p = _TMP / "shrinks.safetensors"
    p.write_bytes(data)
    real_open = open

    class Shrinking(io.BufferedReader):
        def read(self, n: int = -1) -> bytes:  # type: ignore[override]
            out = super().read(n)
            return out if n == 8 else out[: len(out) // 2]

    def fake_open(path, mode="r", *a, **kw):  # type: ignore[no-untyped-def]
        return Shrinking(real_open(path, "rb", buffering=0))

    monkeypatch.setattr(stmod, "open", fake_open, raising=False)
    fs = Findings()
    assert read_header(p, fs, "x") is None
    assert fs.codes() == {"ST023"}


def test_valid_file_model() -> None:
    sf, fs = _parse(corpus.VALID["two-tensors-metadata"]())
    assert sf is not None and not fs
    assert sf.metadata == {"format": "pt"}
    a = sf.tensors["a"]
    assert (a.dtype, a.shape, a.begin, a.end, a.nbytes, a.numel) == ("I16", (2, 2), 0, 8, 8, 4)
    assert sf.span("b") == (sf.data_start + 8, sf.data_start + 16)
    assert sf.data_start % 8 == 0
    assert sf.stamp.size == sf.file_size == sf.data_start + 16


def test_duplicate_inside_an_entry_points_at_the_tensor() -> None:
    hdr = '{"w":{"dtype":"F32","dtype":"F32","shape":[4],"data_offsets":[0,16]}}'
    _, fs = _parse(corpus.text(hdr, corpus.DATA16))
    (dup,) = [f for f in fs if f.code == "ST006"]
    assert dup.location.tensor == "w" and dup.location.pointer == "/w/dtype"
    hdr = '{"__metadata__":{"a":"1","a":"2"},' + corpus._E[1:]
    _, fs = _parse(corpus.text(hdr, corpus.DATA16))
    (dup,) = [f for f in fs if f.code == "ST006"]
    assert dup.location.tensor is None and dup.location.pointer == "/__metadata__/a"


def test_malformed_entry_does_not_cascade_into_layout_findings() -> None:
    data = corpus.obj(
        {
            "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "Q8", "shape": [2], "data_offsets": [8, 16]},
        },
        corpus.DATA16,
    )
    sf, fs = _parse(data)
    assert fs.codes() == {"ST010"} and sf is not None and list(sf.tensors) == ["a"]
    assert sf.invalid_entries == 1


def test_huge_int_reported_once_under_its_field() -> None:
    _, fs = _parse(corpus.text(corpus._E.replace("[4]", f"[{2**70}]"), corpus.DATA16))
    assert [f.code for f in fs] == ["ST011"]


def test_names() -> None:
    for bad in ("..", "../x", "a/b", "a\\b", "x/..", "a\x00", "a\x1b[0m", "a\x7f", "\ud800"):
        assert is_unsafe_name(bad), bad
    for ok in ("model.layers.0.mlp.experts.3.gate_proj.trellis", "a..b", "w", "ünïcode"):
        assert not is_unsafe_name(ok), ok
    assert escape_name("a\x1b[31m") == "a\\x1b[31m"
    _, fs = _parse(corpus.one(corpus.F32_4, name="a\x1b[31mb"))
    (f,) = list(fs)
    assert f.location.tensor == "a\\x1b[31mb" and "\x1b" not in f.message


@settings(
    max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(st.binary(max_size=200))
def test_read_header_never_raises_on_arbitrary_bytes(data: bytes) -> None:
    _rejected_like_the_reference(data)


def _rejected_like_the_reference(data: bytes) -> None:
    """No exception; a file the reference library refuses to open is an error finding here
    (ours is the stricter reader), and a header we cannot use says why."""
    sf, fs = _parse(data)
    if sf is None:
        assert fs.has_errors()
    try:
        with safe_open(str(_TMP / "h.safetensors"), framework="np") as lib:
            list(lib.keys())
    except Exception:  # the reference's own error types (SafetensorError, OSError, ...)
        assert fs.has_errors(), data


_JSONISH = st.text(alphabet='{}[]":,0123456789-.eE tnrufalsNIy\\dtypeshapdaofF32', max_size=120)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(_JSONISH, st.binary(max_size=40), st.booleans())
def test_read_header_never_raises_on_jsonish_headers(h: str, data: bytes, pad: bool) -> None:
    _rejected_like_the_reference(corpus.text(h, data, pad=pad))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_read_header_never_raises_on_mutated_valid_files(d: st.DataObject) -> None:
    blob = bytearray(corpus.VALID["two-tensors-metadata"]())
    for _ in range(d.draw(st.integers(1, 4))):
        i = d.draw(st.integers(0, len(blob) - 1))
        blob[i] = d.draw(st.integers(0, 255))
    _, fs = _parse(bytes(blob))
    assert all(f.location.file == "h.safetensors" for f in fs)


_DTYPES = ["float32", "float16", "int16", "int32", "uint8", "int8", "int64", "float64", "bool"]
_NAME = st.text(alphabet="abcdefghij_.0123456789", min_size=1, max_size=12).filter(
    lambda s: not is_unsafe_name(s) and s != "__metadata__"
)


@st.composite
def tensor_sets(draw: st.DrawFn) -> dict[str, np.ndarray]:
    names = draw(st.lists(_NAME, min_size=0, max_size=5, unique=True))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    out = {}
    for n in names:
        shape = tuple(draw(st.lists(st.integers(0, 5), max_size=3)))
        dt = np.dtype(draw(st.sampled_from(_DTYPES)))
        raw = rng.integers(0, 256, size=int(np.prod(shape)) * dt.itemsize, dtype=np.uint8)
        arr = raw.view(dt) if dt != np.bool_ else raw.astype(bool)
        out[n] = arr.reshape(shape)
    return out


@settings(max_examples=60, deadline=None)
@given(tensor_sets(), st.dictionaries(_NAME, st.text(max_size=8), max_size=3))
def test_differential_against_safetensors_on_valid_files(
    tensors: dict[str, np.ndarray], metadata: dict[str, str]
) -> None:
    p = _TMP / "valid.safetensors"
    with open(p, "wb") as fh:
        write_arrays(fh, tensors, metadata or None)
    fs = Findings()
    sf = read_header(p, fs, "valid")
    assert sf is not None
    assert {f.code for f in fs} <= ({"ST022"} if not tensors else set())
    with safe_open(str(p), framework="np") as lib, TensorReader() as reader:
        assert set(lib.keys()) == set(sf.tensors)
        assert (lib.metadata() or None) == (sf.metadata or None)
        for name, info in sf.tensors.items():
            sl = lib.get_slice(name)
            assert sl.get_dtype() == info.dtype
            assert tuple(sl.get_shape()) == info.shape
            theirs = lib.get_tensor(name)
            assert bytes(reader.payload(sf, info)) == theirs.tobytes()
            ours = reader.array(sf, info)
            assert ours.shape == theirs.shape and ours.dtype.itemsize == theirs.dtype.itemsize
            assert ours.tobytes() == theirs.tobytes()  # bitwise: NaN payloads compare equal
            del theirs


def test_header_length_limits() -> None:
    _, fs = _parse(struct.pack("<Q", stmod.MAX_HEADER + 1) + b"{}")
    assert fs.codes() == {"ST002"}
    assert os.path.getsize(_TMP / "h.safetensors") == 10


def _both_paths(data: bytes) -> tuple[tuple, tuple]:
    """(tensors, metadata, findings) of read_header with its one-pass fast path, then with the
    full checks only."""

    def snap() -> tuple:
        st_, fs = _parse(data)
        tensors = None if st_ is None else dict(st_.tensors)
        meta = None if st_ is None else st_.metadata
        return tensors, meta, [(f.code, f.message, f.location) for f in fs]

    fast = snap()
    real = stmod._fast_entries
    stmod._fast_entries = lambda header: None
    try:
        full = snap()
    finally:
        stmod._fast_entries = real
    return fast, full


_ODD_NAMES = ["a..b", "..", "a/b", "a\\\\b", "x\\u0001", "__metadata__", "a|b", "é.ü", "a..", ".a"]


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_fast_path_agrees_with_the_full_checks(d: st.DataObject) -> None:
    """Whatever the header (valid, mutated bytes, odd names, odd values), the one-pass path
    returns exactly what the full checks return: same tensors, metadata and findings."""
    kind = d.draw(st.sampled_from(["valid", "mutated", "name", "value"]))
    blob = bytearray(corpus.VALID["two-tensors-metadata"]())
    if kind == "mutated":
        for _ in range(d.draw(st.integers(1, 3))):
            i = d.draw(st.integers(8, len(blob) - 1))
            blob[i] = d.draw(st.integers(0, 255))
    elif kind in ("name", "value"):
        (n,) = struct.unpack("<Q", blob[:8])
        text = blob[8 : 8 + n].decode()
        if kind == "name":
            new = d.draw(st.sampled_from(_ODD_NAMES))
            text = text.replace('"a"', f'"{new}"', 1) if '"a"' in text else text
        else:
            old = d.draw(st.sampled_from(['"F32"', "[", "]", ",", ":"]))
            new = d.draw(st.sampled_from(['"F16"', '"X"', "1.0", "true", "[[1]]", "-1", "{}", ""]))
            text = text.replace(old, new, 1)
        raw = text.encode()
        blob = bytearray(struct.pack("<Q", len(raw)) + raw + bytes(blob[8 + n :]))
    fast, full = _both_paths(bytes(blob))
    assert fast == full


@settings(max_examples=60, deadline=None)
@given(tensor_sets())
def test_fast_path_takes_every_valid_file(tensors: dict[str, np.ndarray]) -> None:
    buf = io.BytesIO()
    write_arrays(buf, tensors, metadata={"k": "v"})
    fast, full = _both_paths(buf.getvalue())
    assert fast == full and (not fast[2] or not tensors)  # an empty header is ST022


@pytest.mark.parametrize(
    "meta", ["null", "[]", "1", '{"a": 1}', '{"a": "b", "a": "c"}', '{"a": "b"}', '"x"', "{}"]
)
def test_fast_path_agrees_on_metadata(meta: str) -> None:
    body = (
        f'{{"__metadata__": {meta}, "t": {{"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}}}}'
    )
    raw = body.encode().ljust(-(-len(body) // 8) * 8)
    fast, full = _both_paths(struct.pack("<Q", len(raw)) + raw + bytes(8))
    assert fast == full


@settings(max_examples=80, deadline=None)
@given(tensor_sets(), st.dictionaries(_NAME, st.text(max_size=8), max_size=3))
def test_compact_scan_takes_writer_headers(tensors: dict[str, np.ndarray], meta: dict) -> None:
    """The compact scans (C, and the regex scan without it; no JSON objects built) take every
    compact header whose names and metadata need no escapes, and return what the JSON
    round-trip path returns."""
    import json

    buf = io.BytesIO()
    write_arrays(buf, tensors, metadata=meta or None)
    raw = buf.getvalue()
    (n,) = struct.unpack("<Q", raw[:8])
    text = raw[8 : 8 + n].decode()
    native = stmod._native_scan
    got = stmod._scan_compact(text)
    stmod._native_scan = None
    try:
        py = stmod._scan_compact(text)
    finally:
        stmod._native_scan = native
    body = text.rstrip(" ")
    plain = body == json.dumps(json.loads(body), separators=(",", ":"), ensure_ascii=False)
    for scan in (got, py):
        if tensors and plain and "\\" not in body and ".." not in body:
            assert scan is not None and not any(is_unsafe_name(k) for k in scan[0])
        if scan is not None:
            assert scan == stmod._round_trip(text)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.sampled_from(["a", "b.c", "]},", "x]}", ']},"', "w"]), min_size=1, max_size=12),
    st.sampled_from([1, 5, 40, 1 << 20]),
    st.data(),
)
def test_compact_scan_in_chunks(parts: list[str], chunk: int, d: st.DataObject) -> None:
    """Scanned in chunks of any size (cut after an entry's `]},`, also inside a name that holds
    one), the compact scan gives what the round-trip path gives or leaves the header to it; a
    chunk with anything between its entries never passes."""
    names = sorted({f"t{i}.{p}" for i, p in enumerate(parts) if '"' not in p})
    entries = [f'"{n}":{{"dtype":"U8","shape":[2],"data_offsets":[{2 * i},{2 * i + 2}]}}'
               for i, n in enumerate(names)]  # fmt: skip
    text = "{" + ",".join(entries) + "}"
    if d.draw(st.booleans()) and len(entries) > 1:  # a stray byte between two entries
        at = 1 + len(entries[0]) + 1  # after the comma that ends the first entry
        text = text[:at] + d.draw(st.sampled_from([" ", "x", ","])) + text[at:]
    real, native = stmod._CHUNK, stmod._native_scan
    stmod._CHUNK, stmod._native_scan = chunk, None  # the chunks are the Python scan's
    try:
        got = stmod._scan_compact(text)
    finally:
        stmod._CHUNK, stmod._native_scan = real, native
    assert got is None or got == stmod._round_trip(text)
    if got is not None:
        assert list(got[0]) == names
    if stmod._round_trip(text) is None:
        assert got is None
    elif not any("]}," in n for n in names):  # no name a cut can fall in
        assert got is not None


def test_a_shape_of_many_huge_dimensions_is_refused_without_a_huge_product() -> None:
    # the reference reader multiplies with checked 64-bit products, left to right; a product
    # of 10^5 dimensions of 2^48 would have millions of digits (minutes of work)
    dims = [2**48 - 1] * 100_000 + [0]
    assert stmod.shape_numel(dims) is None
    assert stmod.shape_numel([2**32, 2**32 - 1, 0]) == 0
    header = f'{{"w":{{"dtype":"U8","shape":{json.dumps(dims)},"data_offsets":[0,0]}}}}'
    raw = header.encode().ljust(-(-len(header) // 8) * 8)
    _, fs = _parse(struct.pack("<Q", len(raw)) + raw)
    assert fs.codes() == {"ST013"} and "passes 2^64 - 1" in next(iter(fs)).message
