"""A corpus of malformed safetensors files, one defect each, and a probe of the reference library.

Used by test_strictness.py (our finding per defect, differential against `safetensors`) and by
make_strictness_doc.py (docs/safetensors-strictness.md). Every file is built from bytes here,
so the corpus is deterministic and needs no download.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

F32_4 = {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}
DATA16 = bytes(range(16))


def raw(header: bytes, data: bytes = b"", *, prefix: int | None = None, pad: bool = True) -> bytes:
    """A file from raw header bytes; padded with spaces to 8-byte alignment unless pad=False."""
    if pad:
        header += b" " * (-(8 + len(header)) % 8)
    n = len(header) if prefix is None else prefix
    return struct.pack("<Q", n) + header + data


def text(header: str, data: bytes = b"", **kw: object) -> bytes:
    return raw(header.encode("utf-8", "surrogatepass"), data, **kw)  # type: ignore[arg-type]


def obj(header: dict, data: bytes = b"", **kw: object) -> bytes:
    return text(json.dumps(header, separators=(",", ":")), data, **kw)


def one(entry: dict, data: bytes = DATA16, name: str = "w") -> bytes:
    return obj({name: entry}, data)


@dataclass(frozen=True)
class Defect:
    key: str
    title: str
    code: str  # the rule we must report
    build: Callable[[], bytes]


VALID: dict[str, Callable[[], bytes]] = {
    "one-tensor": lambda: one(F32_4),
    "two-tensors-metadata": lambda: obj(
        {
            "__metadata__": {"format": "pt"},
            "a": {"dtype": "I16", "shape": [2, 2], "data_offsets": [0, 8]},
            "b": {"dtype": "U8", "shape": [8], "data_offsets": [8, 16]},
        },
        DATA16,
    ),
    "zero-sized-tensor": lambda: obj(
        {
            "e": {"dtype": "F32", "shape": [0, 3], "data_offsets": [0, 0]},
            "w": F32_4,
        },
        DATA16,
    ),
}

_E = '{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}'

CORPUS: list[Defect] = [
    Defect("short-file", "file shorter than the 8-byte prefix", "ST001", lambda: b"\x10\x00\x00"),
    Defect("zero-prefix", "all-zero length prefix", "ST002", lambda: bytes(8) + DATA16),
    Defect(
        "huge-prefix",
        "length prefix above 100,000,000",
        "ST002",
        lambda: raw(_E.encode(), DATA16, prefix=200_000_000),
    ),
    Defect(
        "header-past-eof",
        "length prefix larger than the file",
        "ST002",
        lambda: raw(_E.encode(), b"", prefix=4096),
    ),
    Defect(
        "bom",
        "header starts with a UTF-8 BOM",
        "ST003",
        lambda: raw(b"\xef\xbb\xbf" + _E.encode(), DATA16),
    ),
    Defect(
        "invalid-utf8",
        "invalid UTF-8 byte in a tensor name",
        "ST003",
        lambda: raw(_E.replace('"w"', '"w\xff"').encode("latin-1"), DATA16),
    ),
    Defect("json-syntax", "truncated JSON", "ST004", lambda: text('{"w":{"dtype":"F32",', DATA16)),
    Defect("json-array", "header is a JSON array", "ST005", lambda: text("[]")),
    Defect(
        "nul-padding",
        "header padded with NUL bytes instead of spaces",
        "ST018",
        lambda: raw(_E.encode() + b"\x00" * 7, DATA16, pad=False),
    ),
    Defect(
        "garbage-after-json",
        "non-space bytes after the JSON object",
        "ST018",
        lambda: text(_E + "x", DATA16),
    ),
    Defect(
        "duplicate-identical",
        "the same tensor entry written twice",
        "ST006",
        lambda: text(_E[:-1] + "," + _E[1:-1] + "}", DATA16),
    ),
    Defect(
        "duplicate-different",
        "one name, two different entries",
        "ST006",
        lambda: text(
            '{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},'
            '"w":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}}',
            DATA16,
        ),
    ),
    Defect(
        "metadata-non-string",
        "__metadata__ value is a number",
        "ST007",
        lambda: obj({"__metadata__": {"step": 1}, "w": F32_4}, DATA16),
    ),
    Defect(
        "metadata-null",
        "__metadata__ is null",
        "ST007",
        lambda: obj({"__metadata__": None, "w": F32_4}, DATA16),
    ),
    Defect(
        "missing-field",
        "entry without shape",
        "ST008",
        lambda: one({"dtype": "F32", "data_offsets": [0, 16]}),
    ),
    Defect("entry-not-object", "entry is a list", "ST008", lambda: obj({"w": [1, 2]}, DATA16)),
    Defect("extra-field", "entry with an unknown field", "ST009", lambda: one({**F32_4, "x": 1})),
    Defect("unknown-dtype", "dtype Q8", "ST010", lambda: one({**F32_4, "dtype": "Q8"})),
    Defect(
        "lowercase-dtype",
        "dtype f32 (case matters)",
        "ST010",
        lambda: one({**F32_4, "dtype": "f32"}),
    ),
    Defect("bool-in-shape", "shape [true, 4]", "ST011", lambda: one({**F32_4, "shape": [True, 4]})),
    Defect("float-in-shape", "shape [4.0]", "ST011", lambda: one({**F32_4, "shape": [4.0]})),
    Defect("string-in-shape", 'shape ["4"]', "ST011", lambda: one({**F32_4, "shape": ["4"]})),
    Defect("negative-dim", "shape [-4]", "ST011", lambda: one({**F32_4, "shape": [-4]})),
    Defect(
        "negative-offset",
        "data_offsets [-16, 0]",
        "ST012",
        lambda: one({**F32_4, "data_offsets": [-16, 0]}),
    ),
    Defect(
        "begin-after-end",
        "data_offsets [16, 0]",
        "ST012",
        lambda: one({**F32_4, "data_offsets": [16, 0]}),
    ),
    Defect(
        "three-offsets",
        "data_offsets with three numbers",
        "ST012",
        lambda: one({**F32_4, "data_offsets": [0, 16, 16]}),
    ),
    Defect(
        "huge-int",
        "offset 2^70 (beyond 64 bits)",
        "ST012",
        lambda: text(_E.replace("[0,16]", f"[0,{2**70}]"), DATA16),
    ),
    Defect(
        "size-mismatch",
        "F32[3] with 16 payload bytes",
        "ST013",
        lambda: one({**F32_4, "shape": [3]}),
    ),
    Defect(
        "numel-overflow",
        "shape whose element count overflows 64 bits",
        "ST013",
        lambda: one({**F32_4, "shape": [2**40, 2**40]}),
    ),
    Defect(
        "numel-overflow-then-zero",
        "shape whose partial element count overflows 64 bits before a 0 dimension",
        "ST013",
        lambda: one({**F32_4, "shape": [2**40, 2**40, 0], "data_offsets": [0, 0]}, b""),
    ),
    Defect(
        "gap",
        "8 unused bytes between two tensors",
        "ST014",
        lambda: obj(
            {
                "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]},
            },
            bytes(24),
        ),
    ),
    Defect(
        "overlap",
        "two tensors share bytes",
        "ST015",
        lambda: obj(
            {
                "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]},
            },
            DATA16,
        ),
    ),
    Defect(
        "trailing-bytes",
        "8 bytes after the last payload",
        "ST016",
        lambda: one(F32_4, DATA16 + bytes(8)),
    ),
    Defect(
        "payload-past-eof",
        "payload runs past the end of file",
        "ST016",
        lambda: one(F32_4, DATA16[:8]),
    ),
    Defect("dotdot-name", "tensor name '../evil'", "ST017", lambda: one(F32_4, name="../evil")),
    Defect("slash-name", "tensor name 'a/b'", "ST017", lambda: one(F32_4, name="a/b")),
    Defect(
        "esc-name",
        "tensor name with an ESC character",
        "ST017",
        lambda: one(F32_4, name="a\x1b[31mb"),
    ),
    Defect(
        "nul-name", "tensor name with a NUL character", "ST017", lambda: one(F32_4, name="a\x00b")
    ),
    Defect(
        "lone-surrogate-name",
        "tensor name with a lone UTF-16 surrogate escape",
        "ST017",
        lambda: text(_E.replace('"w"', '"w\\ud800"'), DATA16),
    ),
    Defect(
        "lone-surrogate-metadata",
        "__metadata__ value with a lone UTF-16 surrogate escape",
        "ST003",
        lambda: text('{"__metadata__":{"a":"\\udc00"},' + _E[1:], DATA16),
    ),
    Defect(
        "leading-whitespace",
        "header starts with spaces before '{'",
        "ST019",
        lambda: text("  " + _E, DATA16),
    ),
    Defect(
        "unaligned", "data section not 8-byte aligned", "ST020", lambda: text(_E, DATA16, pad=False)
    ),
    Defect("nan", "NaN in the header", "ST021", lambda: text(_E.replace("[4]", "[NaN]"), DATA16)),
    Defect(
        "infinity",
        "1e999 (overflows to infinity) in the header",
        "ST021",
        lambda: text(_E.replace('"dtype"', '"x":1e999,"dtype"'), DATA16),
    ),
    Defect("empty", "header lists no tensors", "ST022", lambda: text("{}")),
    Defect(
        "deep-nesting",
        "an entry nested 200 levels deep",
        "ST024",
        lambda: text('{"w":' + "[" * 200 + "]" * 200 + "}"),
    ),
]


def write_all(root: Path) -> dict[str, Path]:
    """Write every corpus and valid file under root; returns key -> path."""
    out: dict[str, Path] = {}
    for d in CORPUS:
        out[d.key] = root / f"{d.key}.safetensors"
        out[d.key].write_bytes(d.build())
    for key, build in VALID.items():
        out[f"valid-{key}"] = root / f"valid-{key}.safetensors"
        out[f"valid-{key}"].write_bytes(build())
    return out


def library_verdict(path: Path) -> tuple[bool, str]:
    """(accepted, detail) from the `safetensors` library: open, list, and load every tensor.

    Accepted means `safe_open` and `safetensors.numpy.load_file` both succeeded; detail is the
    library's first error line otherwise.
    """
    from safetensors import safe_open
    from safetensors.numpy import load_file

    try:
        with safe_open(str(path), framework="np") as f:
            f.metadata()
            for k in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                f.get_tensor(k)
        load_file(str(path))
    except Exception as exc:  # the library raises SafetensorError, OSError, ValueError...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return False, f"{type(exc).__name__}: {first}"
    return True, "accepted"
