"""`exl3tool identity` and `exl3tool diff` as text."""

from __future__ import annotations

import json
from collections.abc import Iterator
from itertools import islice
from json.encoder import encode_basestring_ascii  # type: ignore[attr-defined]
from pathlib import Path
from typing import Any

from exl3tool.rules.registry import Findings


def identity_text(ident: Any, path: Path | str) -> str:
    lines = [
        f"{path}: {len(ident.tensors)} tensors, {len(ident.layers)} layers ({ident.algorithm})",
        f"root   {ident.root}",
    ]
    lines += [f"layer  {key:>6}  {d}" for key, d in ident.layers.items()]
    c = ident.compatibility
    if c is not None:
        lines.append(f"compatibility (fq-msrt-base-compatibility/2, k={c.k})")
        lines.append(f"root   {c.root}")
        lines += [f"layer  {key:>6}  {d}" for key, d in c.layers.items()]
    return "\n".join(lines) + "\n"


def identity_json_chunks(ident: Any, lines: int = 20_000) -> Iterator[str]:
    """`json.dumps(ident.to_json(), indent=2) + "\n"`, byte for byte, in pieces of about
    `lines` tensors: the per-tensor maps are rendered from the digests without the two dicts
    per tensor and the pure-Python indenting encoder (10^6 tensors: 16 s and 1.9 GB before).
    Everything else is json's own rendering of the record without those maps."""
    head = json.dumps(ident.to_json(per_tensor=False), indent=2)
    tensors = ident.tensors
    if not tensors:
        yield head + "\n"
        return
    # at the top level, with the maps empty: `\n  "tensors": {},\n  "types": {},\n`
    before, _, rest = head.partition('\n  "tensors": {},\n  "types": {},\n')
    assert rest, "the record's keys moved"  # to_json's order: schema, algorithm, tensors, types
    keys = list(map(encode_basestring_ascii, tensors))
    digests = (encode_basestring_ascii(t.digest) for t in tensors.values())
    yield before + '\n  "tensors": {'
    yield from _joined(map("\n    {}: {}".format, keys, digests), lines)
    yield '\n  },\n  "types": {'
    kinds: dict[tuple[str, tuple[int, ...]], str] = {}
    types = []
    for t in tensors.values():
        kind = kinds.get((t.dtype, t.shape))
        if kind is None:
            kind = kinds[(t.dtype, t.shape)] = _type_entry(t.dtype, t.shape)
        types.append(kind)
    yield from _joined(map("\n    {}: {}".format, keys, types), lines)
    yield "\n  },\n" + rest + "\n"


def _joined(rows: Iterator[str], lines: int) -> Iterator[str]:
    """`",".join(rows)` in pieces of `lines` rows."""
    first = True
    while piece := list(islice(rows, lines)):
        yield ("" if first else ",") + ",".join(piece)
        first = False


def _type_entry(dtype: str, shape: tuple[int, ...]) -> str:
    """One "types" value as json renders it two levels deep with indent=2."""
    text = json.dumps({"dtype": dtype, "shape": list(shape)}, indent=2)
    return text.replace("\n", "\n    ")


def finding_lines(findings: Findings) -> str:
    """One line per finding (`file: level CODE message (tensor)`), for stderr."""
    out = []
    for f in findings:
        where = f" ({f.location.tensor})" if f.location.tensor else ""
        file = f"{f.location.file}: " if f.location.file else ""
        out.append(f"{file}{f.level.value} {f.code} {f.message}{where}\n")
    return "".join(out)


def diff_text(d: Any, a: Any, b: Any) -> str:
    if d.identical:
        return f"identical: {a} and {b} ({d.algorithm} root {d.roots[0][:16]}…)\n"
    out = [f"differ: {a} (A) and {b} (B), {d.algorithm}"]
    groups = (
        ("layers changed", d.layers_changed),
        ("layers only in A", d.layers_only_a),
        ("layers only in B", d.layers_only_b),
        ("tensors changed", d.tensors_changed),
        ("tensors only in A", d.tensors_only_a),
        ("tensors only in B", d.tensors_only_b),
    )
    for title, items in groups:
        if items:
            out.append(f"{title} ({len(items)}):")
            out += [f"  {x}" for x in items]
    if d.types_changed:
        out.append(f"dtype/shape changed ({len(d.types_changed)}):")
        out += [f"  {n}: {x} -> {y}" for n, (x, y) in d.types_changed.items()]
    if d.k_changed:
        out.append(f"K changed ({len(d.k_changed)}):")
        out += [f"  {n}: {x} -> {y}" for n, (x, y) in d.k_changed.items()]
    if d.compat[0] != d.compat[1]:
        out.append(f"compatibility (k, root): {d.compat[0]} -> {d.compat[1]}")
    return "\n".join(out) + "\n"
