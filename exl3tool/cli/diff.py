"""`exl3tool diff A B`: which layers, tensors and K values differ between two artifacts (or
identity records written by `exl3tool identity --format json`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from exl3tool.cli.common import check_format, handle_errors
from exl3tool.identity.engine import ALGORITHMS, check_algo
from exl3tool.identity.fast import SCHEMA
from exl3tool.io.atomic import write_bytes_atomic
from exl3tool.rules.errors import InputError, UsageError
from exl3tool.rules.registry import Findings


def _record_or_none(path: Path) -> dict[str, Any] | None:
    """An identity document when `path` is one; None for an artifact."""
    if not (path.is_file() and path.suffix == ".json"):
        return None
    if path.name in ("adapter_config.json", "config.json", "quantization_config.json"):
        return None
    from exl3tool.identity.compare import load_record

    findings = Findings()
    doc = load_record(path, findings)
    if doc is None:
        raise InputError(f"{path}: not an {SCHEMA} document ({next(iter(findings)).message})")
    return doc


def _identity_doc(path: Path, algo: str, threads: int | None) -> tuple[dict[str, Any], int]:
    """The identity of `path` and how many errors its container had (then it is not trusted)."""
    from exl3tool.cli.identity import _hash

    ident, _kind, findings, _ckpt = _hash(path, algo, None, threads, None)
    errors = findings.errors()
    for f in errors:
        sys.stderr.write(f"exl3tool: {path}: {f.code} {f.message}\n")
    return ident.to_json(), len(errors)


def _text(d: Any, a: Path, b: Path) -> str:
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


@handle_errors
def diff(
    a: Annotated[Path, typer.Argument(help="Artifact A (or an identity JSON record).")],
    b: Annotated[Path, typer.Argument(help="Artifact B (or an identity JSON record).")],
    fmt: Annotated[str, typer.Option("--format", "-f", help="text or json.")] = "text",
    algo: Annotated[
        str | None,
        typer.Option("--algo", help=f"{' or '.join(ALGORITHMS)} (default: the record's, blake3)."),
    ] = None,
    threads: Annotated[int | None, typer.Option("--threads", min=1)] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write here.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --output.")] = False,
) -> None:
    """Compare two artifacts by logical identity; exit 0 when identical, 1 when they differ."""
    from exl3tool.identity.compare import diff as diff_docs

    check_format(fmt, ("text", "json"))
    if algo is not None:
        check_algo(algo)
    ra, rb = _record_or_none(a), _record_or_none(b)
    algos = {r["algorithm"] for r in (ra, rb) if r is not None}
    if algo is not None:
        algos.add(algo)
    if len(algos) > 1:
        raise UsageError(f"cannot compare digests of different algorithms: {sorted(algos)}")
    use = algos.pop() if algos else "blake3"
    da, errs_a = (ra, 0) if ra is not None else _identity_doc(a, use, threads)
    db, errs_b = (rb, 0) if rb is not None else _identity_doc(b, use, threads)
    d = diff_docs(da, db)
    if fmt == "json":
        doc = {"a": str(a), "b": str(b), **d.to_json(), "conclusive": not (errs_a or errs_b)}
        text = json.dumps(doc, indent=2) + "\n"
    elif errs_a or errs_b:
        text = f"not conclusive: {errs_a + errs_b} container errors in {a} / {b}\n"
    else:
        text = _text(d, a, b)
    if output is not None:
        write_bytes_atomic(output, text.encode(), force=force)
    else:
        sys.stdout.write(text)
    if errs_a or errs_b:
        # An artifact with container errors has no trustworthy identity: never report "identical".
        sys.stderr.write("exl3tool: diff is not conclusive: fix the errors above first\n")
        raise typer.Exit(1)
    raise typer.Exit(0 if d.identical else 1)
