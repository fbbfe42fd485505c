"""`exl3tool identity` and `exl3tool diff` as text."""

from __future__ import annotations

import json
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


def identity_json(ident: Any) -> str:
    return json.dumps(ident.to_json(), indent=2) + "\n"


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
