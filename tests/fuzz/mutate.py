"""Seeded, structure-aware mutations of an artifact held as a layout: {relative path: node}.

A node is `bytes` (a regular file) or a `Special` (FIFO, directory, symlink). Mutations know the
formats: safetensors headers (entries, shapes, offsets, names, the length prefix), JSON documents
(any node replaced by a hostile value: NaN, huge numbers, bools for ints, wrong types, duplicate
keys, deep nesting) and directory layouts (files removed, truncated, replaced by FIFOs,
directories or symlinks). Everything is a pure function of the `random.Random` given.
"""

from __future__ import annotations

import copy
import json
import math
import random
import struct
from dataclasses import dataclass
from typing import Any

Layout = dict[str, Any]


@dataclass(frozen=True)
class Special:
    kind: str  # "fifo", "dir", "symlink"
    target: str = ""


class Dup:
    """A JSON object written with a duplicated key (strict readers must flag it)."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        self.pairs = pairs


class Raw:
    """A JSON token written verbatim (1e999, -0, 1.0e5, NaN)."""

    def __init__(self, text: str) -> None:
        self.text = text


def dumps(value: Any) -> str:
    """JSON text that may hold what `json.dumps` refuses: duplicates and raw tokens (NaN and
    Infinity it writes itself; lone surrogates become `\\ud800` escapes)."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return _dumps(value)


def _dumps(value: Any) -> str:
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, Dup):
        return "{" + ",".join(f"{json.dumps(k)}:{_dumps(v)}" for k, v in value.pairs) + "}"
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{_dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_dumps(v) for v in value) + "]"
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return json.dumps(value)


LONG = "x" * 300
HOSTILE: list[Any] = [
    None, True, False, 0, 1, -1, 2, 3.0, 0.5, 2**31, 2**32 + 1, 2**53 + 1, 2**63, 2**64,
    10**30, -(10**30), 1e308, float("nan"), float("inf"), float("-inf"), Raw("1e999"),
    Raw("-0"), Raw("1.0e2"), "", LONG, "\ud800", "a\x00b", "../../x", "/abs/path", "rank9999",
    [], {}, [1, 2, 3], {"a": 1}, [[[[[[[[]]]]]]]], "1", "true", 1e-320, [None], [LONG],
    [2**40, 2**40], {"\ud800": 1}, {LONG: LONG},
]  # fmt: skip


def _hostile(rng: random.Random) -> Any:
    """A fresh copy: mutations edit values in place, and a shared one would grow case by case
    (the cases of a worker would then depend on the cases before them)."""
    return copy.deepcopy(rng.choice(HOSTILE))


INT_EDITS = (
    lambda v: v + 1, lambda v: v - 1, lambda v: -v, lambda v: v * 1000, lambda v: 0,
    lambda v: 10**9, lambda v: 2**31 - 1, lambda v: 2**62, lambda v: 10**18, lambda v: float(v),
    lambda v: str(v), lambda v: bool(v % 2), lambda v: float("nan"), lambda v: 10**400,
)  # fmt: skip
STR_EDITS = (
    lambda s: s + "x", lambda s: s[:-1], lambda s: "", lambda s: s * 40, lambda s: s + "\ud800",
    lambda s: s.upper(), lambda s: s.replace(".", ".."), lambda s: s + "/..", lambda s: "/" + s,
    lambda s: s.replace("0", "9999999"), lambda s: s.replace("rank0", "rank1000000000"),
    lambda s: s.replace("1", "18446744073709551617"), lambda s: s + "\x07",
)  # fmt: skip


def _nodes(value: Any, path: tuple = ()) -> list[tuple]:
    """Every path into a JSON value (dict keys and list indices), 32 levels deep at most."""
    out = [path]
    if len(path) >= 32:
        return out
    if isinstance(value, dict):
        for k, v in value.items():
            out.extend(_nodes(v, (*path, k)))
    elif isinstance(value, list):
        for i, v in enumerate(value[:64]):  # long lists: the first 64 elements are enough
            out.extend(_nodes(v, (*path, i)))
    return out


def _get(value: Any, path: tuple) -> Any:
    for p in path:
        value = value[p]
    return value


def _set(root: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    parent = _get(root, path[:-1])
    parent[path[-1]] = new
    return root


def _edit_value(rng: random.Random, v: Any) -> Any:
    r = rng.random()
    if r < 0.35:
        return _hostile(rng)
    if type(v) is int and r < 0.8:
        try:
            return rng.choice(INT_EDITS)(v)
        except (OverflowError, ValueError):
            return v
    if isinstance(v, str) and r < 0.8:
        return rng.choice(STR_EDITS)(v)
    if isinstance(v, list) and r < 0.8:
        return rng.choice((v + v, v[:1], v[::-1], [v], v * 50, [*v, _hostile(rng)]))
    if isinstance(v, dict) and r < 0.8 and v:
        k = rng.choice(list(v))
        return rng.choice((Dup([*v.items(), (k, _hostile(rng))]), [v], {**v, LONG: 1}))
    return _hostile(rng)


# Keys whose values size work (layer ranges, expert and rank counts): the budget's targets.
COUNT_KEYS = frozenset(
    (
        "moe_layers", "n_routed_experts", "num_experts", "num_local_experts", "experts_per_layer",
        "world_size", "num_hidden_layers", "tp", "moe_layer_coverage", "first_k_dense_replace",
        "selected_experts", "selected_layers", "ranks", "bits", "k", "k_values", "hidden_size",
        "intermediate_size", "moe_intermediate_size", "num_tensors", "size", "experts",
    )
)  # fmt: skip
HUGE = (10**6, 10**9, 10**12, 2**40, 2**63 - 1, 10**18)


def _huge(rng: random.Random, v: Any) -> Any:
    if isinstance(v, list) and len(v) == 2 and all(type(x) is int for x in v):
        return [v[0], rng.choice(HUGE)]  # a layer range
    if isinstance(v, list) and v:
        return [*v, rng.choice(HUGE)]
    return rng.choice(HUGE)


def mutate_json_value(rng: random.Random, doc: Any, edits: int = 1) -> tuple[Any, str]:
    what = []
    for _ in range(edits):
        nodes = _nodes(doc)
        counts = [p for p in nodes if p and p[-1] in COUNT_KEYS]
        if counts and rng.random() < 0.3:
            path = rng.choice(counts)
            doc = _set(doc, path, _huge(rng, _get(doc, path)))
            what.append(f"huge {path!r}"[:120])
            continue
        path = rng.choice(nodes)
        op = rng.random()
        try:
            if op < 0.12 and path:
                parent = _get(doc, path[:-1])
                del parent[path[-1]]
                what.append(f"del {path!r}"[:120])
                continue
            old = _get(doc, path)
            new = _edit_value(rng, old)
            doc = _set(doc, path, new)
            what.append(f"set {path!r}"[:120])
        except (KeyError, IndexError, TypeError):
            continue
    return doc, "; ".join(what)


def mutate_json_bytes(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        doc = None
    r = rng.random()
    if doc is None or r < 0.1:
        return _raw_bytes(rng, data)
    doc, what = mutate_json_value(rng, doc, rng.choice((1, 1, 2, 3)))
    try:
        return dumps(doc).encode("utf-8", "surrogatepass"), "json " + what
    except (TypeError, ValueError, RecursionError):
        return data, "json unchanged"


def _raw_bytes(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    r = rng.random()
    n = len(data)
    if r < 0.3 and n:
        cut = rng.randrange(n)
        return data[:cut], f"raw cut {cut}"
    if r < 0.6 and n:
        b = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(n)] = rng.randrange(256)
        return bytes(b), "raw flip"
    if r < 0.8:
        at = rng.randrange(n + 1)
        ins = rng.choice((b"NaN", b"{", b"[" * 5000, b"\xff\xfe", b'"\\ud800"', b",", b"\x00"))
        return data[:at] + ins + data[at:], "raw insert"
    return rng.choice((b"", b"null", b"[]", b"\xef\xbb\xbf" + data, data + data)), "raw whole"


# --- TOML (the gate's exl3tool.toml) ---------------------------------------------------------

# values TOML can spell that a config must refuse or survive (no absolute path: the gate writes
# temporary slices where tmp_dir points)
TOML_VALUES = (
    "inf", "nan", "-0.0", "1e999", "2.0", "9223372036854775807", "-1", "0", "true", '""',
    '"../.."', '"x" ', '"\\u0000"', '"' + "a" * 5000 + '"', "[]", "[[1]]", "[1, 2.5, true]",
    "[2, 2, 2]", "{}", '{ path = "." }', '"org/name@main"', '"ALL"', '["R7", "ZZ999"]',
    "1979-05-27T07:32:00Z",
)  # fmt: skip


def mutate_toml_bytes(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    """One line edited: a value replaced by a hostile one, a line doubled (a duplicate key or
    table), a line dropped; else a raw byte mutation."""
    lines = data.split(b"\n")
    keyed = [
        i for i, line in enumerate(lines) if b"=" in line and not line.lstrip().startswith(b"#")
    ]
    r = rng.random()
    if keyed and r < 0.6:
        i = rng.choice(keyed)
        value = rng.choice(TOML_VALUES)
        lines[i] = lines[i].split(b"=", 1)[0] + b"= " + value.encode()
        return b"\n".join(lines), f"toml set line {i} = {value[:20]}"
    if lines and r < 0.75:
        i = rng.randrange(len(lines))
        lines.insert(i, lines[i])
        return b"\n".join(lines), f"toml double line {i}"
    if lines and r < 0.85:
        i = rng.randrange(len(lines))
        del lines[i]
        return b"\n".join(lines), f"toml drop line {i}"
    return _raw_bytes(rng, data)


# --- safetensors ----------------------------------------------------------------------------


def split_safetensors(data: bytes) -> tuple[dict, bytes] | None:
    if len(data) < 8:
        return None
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        return None
    try:
        header = json.loads(data[8 : 8 + n])
    except (ValueError, RecursionError):
        return None
    return (header, data[8 + n :]) if isinstance(header, dict) else None


def join_safetensors(header: Any, payload: bytes, pad: bool = True) -> bytes:
    text = dumps(header).encode("utf-8", "surrogatepass")
    if pad:
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + payload


DTYPES = ["F16", "BF16", "F32", "I32", "I16", "U8", "F8_E4M3", "F64", "I64", "BOOL", "Q4", ""]


def _doubled(x):
    """x * 2 where Python defines it (what earlier campaigns drew); other values as they are (an
    earlier mutation may have left a null or an object in a shape)."""
    return x * 2 if isinstance(x, (int, float, str, list)) else x


def _reshaped(rng: random.Random, shape: Any) -> Any:
    """The same number of elements in another rank (the span stays valid, so the tensor passes
    the container checks): flattened, merged last axes, a leading 1, or a scalar for one
    element."""
    if not (isinstance(shape, list) and all(type(x) is int and x >= 0 for x in shape)):
        return [1]
    n = math.prod(shape)
    return rng.choice(
        (
            [n],
            [*shape[:-2], shape[-2] * shape[-1]] if len(shape) >= 2 else [1, n],
            [1, *shape],
            [] if n == 1 else [n, 1],
        )
    )


def _edit_entry(rng: random.Random, entry: dict, payload_len: int) -> str:
    field = rng.choice(("dtype", "shape", "data_offsets", "extra", "reshape"))
    if field == "reshape":
        entry["shape"] = _reshaped(rng, entry.get("shape"))
    elif field == "dtype":
        entry["dtype"] = rng.choice([*DTYPES, 1, None])
    elif field == "shape":
        shape = entry.get("shape")
        entry["shape"] = rng.choice(
            (
                [],
                [0],
                [2**62, 2**62],
                [10**18] * 40,
                [-1],
                [1.5],
                [True],
                ["3"],
                [2**64],
                [*shape, 1] if isinstance(shape, list) else [1],
                (shape or [1])[:-1] if isinstance(shape or [1], (list, str)) else [],
                [_doubled(x) for x in shape] if isinstance(shape, list) else None,
                [2**16] * 8,
                [[2]],
            )
        )
    elif field == "data_offsets":
        a, b = rng.randrange(payload_len + 2), rng.randrange(payload_len + 2)
        entry["data_offsets"] = rng.choice(
            ([a, b], [b, a], [0, payload_len * 4], [-1, 3], [2**64, 2**64 + 4], [a], [a, b, 0],
             [float(a), float(b)], None, [a, 2**53])
        )  # fmt: skip
    else:
        entry[rng.choice(("extra", "dtype2", LONG))] = _hostile(rng)
    return field


def _rename(rng: random.Random, name: str) -> str:
    return rng.choice(
        (name + "x" * 300, name.replace("0", "1000000000"), name + "\ud800", name + "\x01",
         name.replace(".", ".."), name.replace("layers.", "layers.-"), name + "/..", "",
         name.replace("rank0", "rank999999999"), name.replace("experts.", "experts.99999999"),
         name.upper(), name.replace(".", "/"))
    )  # fmt: skip


def mutate_safetensors(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    parts = split_safetensors(data)
    r = rng.random()
    if parts is None or r < 0.08:
        return _raw_bytes(rng, data)
    header, payload = parts
    names = [k for k in header if k != "__metadata__"]
    if r < 0.16:  # the length prefix
        n = rng.choice((0, 1, 7, len(data), 2**63, 100_000_001, len(data) - 9))
        return struct.pack("<Q", n % 2**64) + data[8:], f"st length {n}"
    if r < 0.24:  # payload bytes: markers, scales, NaN patterns
        b = bytearray(payload)
        for _ in range(rng.randint(1, 16)):
            if b:
                b[rng.randrange(len(b))] = rng.choice((0xFF, 0x7F, 0x80, 0x00, rng.randrange(256)))
        return join_safetensors(header, bytes(b)), "st payload flip"
    if r < 0.3:
        cut = rng.randrange(len(payload) + 1)
        return join_safetensors(header, payload[:cut]), f"st payload cut {cut}"
    if r < 0.36:
        hdr, what = mutate_json_value(rng, header, 1)
        return join_safetensors(hdr, payload, pad=rng.random() < 0.5), "st json " + what
    if not names:
        return join_safetensors(
            {"t": {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]}}, payload
        ), "st add"
    name = rng.choice(names)
    if r < 0.6 and isinstance(header[name], dict):
        what = _edit_entry(rng, header[name], len(payload))
        return join_safetensors(header, payload), f"st entry {name[:60]} {what}"
    if r < 0.75:
        new = _rename(rng, name)
        header = {(new if k == name else k): v for k, v in header.items()}
        return join_safetensors(header, payload), f"st rename {name[:60]}"
    if r < 0.82:
        del header[name]
        return join_safetensors(header, payload), f"st drop {name[:60]}"
    if r < 0.9:
        dup = Dup([*header.items(), (name, header[name])])
        return join_safetensors(dup, payload), f"st duplicate {name[:60]}"
    meta = rng.choice(({"format": 1}, [1], "x", {"a": {"b": 1}}, None, {LONG: LONG}))
    header["__metadata__"] = meta
    return join_safetensors(header, payload), "st metadata"


# --- layouts ----------------------------------------------------------------------------------


def mutate_layout(rng: random.Random, layout: Layout) -> str:
    """Mutate one node of `layout` in place; returns what was done."""
    files = sorted(layout)
    if not files:  # everything was removed: start again from an empty config
        layout["config.json"] = b"{}"
        return "config.json: layout create"
    rel = rng.choice(files)
    node = layout[rel]
    r = rng.random()
    if isinstance(node, bytes) and r < 0.8:
        if rel.endswith(".safetensors"):
            layout[rel], what = mutate_safetensors(rng, node)
        elif rel.endswith(".json"):
            layout[rel], what = mutate_json_bytes(rng, node)
        elif rel.endswith(".toml"):
            layout[rel], what = mutate_toml_bytes(rng, node)
        else:
            layout[rel], what = _raw_bytes(rng, node)
        return f"{rel}: {what}"
    op = rng.choice(("remove", "fifo", "dir", "symlink", "dangling", "loop", "empty", "copy"))
    if op == "remove":
        del layout[rel]
    elif op == "fifo":
        layout[rel] = Special("fifo")
    elif op == "dir":
        layout[rel] = Special("dir")
    elif op == "symlink":
        layout[rel] = Special("symlink", rng.choice(files))
    elif op == "dangling":
        layout[rel] = Special("symlink", "missing-target")
    elif op == "loop":
        layout[rel] = Special("symlink", rel.rsplit("/", 1)[-1])
    elif op == "empty":
        layout[rel] = b""
    else:
        stem = rel.rsplit(".", 1)
        layout[stem[0] + "-extra." + (stem[1] if len(stem) > 1 else "bin")] = layout[rel]
    return f"{rel}: layout {op}"


def mutate(rng: random.Random, layout: Layout) -> str:
    """1-3 mutations of `layout` (in place)."""
    return " | ".join(mutate_layout(rng, layout) for _ in range(rng.choice((1, 1, 1, 2, 3))))
