"""`exl3tool identity`: logical tensor/layer/root digests, `--check` against a record, and a
`sha256sum -c` manifest of the files."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from exl3tool.cli.common import check_format, fail, handle_errors
from exl3tool.formats.detect import Kind
from exl3tool.identity.artifact import open_artifact
from exl3tool.identity.engine import ALGORITHMS, check_algo, hash_files
from exl3tool.identity.fast import (
    Identity,
    compute_identity,
    parse_layers,
    planned_bytes,
    select,
)
from exl3tool.identity.logical import build_plan
from exl3tool.io.atomic import atomic_file
from exl3tool.rules.errors import UsageError
from exl3tool.rules.registry import Findings

AlgoOpt = Annotated[
    str | None,
    typer.Option("--algo", help=f"Tensor hash: {' or '.join(ALGORITHMS)} (default blake3)."),
]


def _hash(
    path: Path,
    algo: str,
    spec: str | None,
    threads: int | None,
    compat: bool | None,
) -> tuple[Identity, Kind, Findings, Any]:
    from exl3tool.io.progress import progress_bar

    ckpt, kind, findings = open_artifact(path)
    plan = select(build_plan(ckpt), parse_layers(spec) if spec else None)
    if kind is Kind.MSRT_BASE and compat is not False:
        compat = True  # a base's identity is its point; keep it even when defective
    with progress_bar(planned_bytes(plan, algo, compat), f"hashing ({algo})") as bar:
        ident = compute_identity(
            None, algo=algo, selection=spec, threads=threads, progress=bar, compat=compat, plan=plan
        )
    return ident, kind, findings, ckpt


def _artifact_findings(
    ident: Identity, kind: Kind, findings: Findings, ckpt: Any, label: str
) -> None:
    from exl3tool.identity.compare import problem_findings, published_findings
    from exl3tool.rules import identity as ir

    problem_findings(ident, findings, label)
    if kind is Kind.MSRT_BASE:
        c = ident.compatibility
        for p in c.problems if c is not None else ():
            findings.add(ir.ID_COMPAT_INCOMPLETE, p.message, file=label, tensor=p.tensor)
        if c is None:
            findings.add(ir.ID_COMPAT_INCOMPLETE, "no uniform K in 2..6", file=label)
        if ident.selection is None:
            published_findings(ckpt.config, c, findings)


def _text(ident: Identity, path: Path) -> str:
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


def _write(target: Path | None, text: str, force: bool) -> None:
    if target is None:
        sys.stdout.write(text)
        return
    with atomic_file(target, force=force, mode="w") as fh:
        fh.write(text)


def _manifest_line(digest: str, rel: str) -> str:
    """One `sha256sum` line; names with a backslash or newline use its escaped form."""
    if "\\" in rel or "\n" in rel or "\r" in rel:
        esc = rel.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
        return f"\\{digest}  {esc}\n"
    return f"{digest}  {rel}\n"


def _artifact_files(path: Path, exclude: Path | None) -> tuple[Path, list[str]]:
    if path.is_file():
        return path.parent, [path.name]
    files = []
    for dirpath, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for n in names:
            p = Path(dirpath) / n
            if n.startswith(".") or p.is_symlink() or not p.is_file():
                continue
            if exclude is not None and p.absolute() == exclude.absolute():
                continue
            files.append(p.relative_to(path).as_posix())
    return path, sorted(files)


def write_sha256sum(path: Path, target: Path, threads: int | None, force: bool) -> int:
    """Write a `sha256sum -c` manifest of the artifact's files (paths relative to it)."""
    from exl3tool.io.progress import progress_bar

    root, rels = _artifact_files(path, target)
    total = sum((root / r).stat().st_size for r in rels)
    with progress_bar(total, "sha256 of files") as bar:
        digests = hash_files([root / r for r in rels], "sha256", threads, bar)
    text = "".join(_manifest_line(digests[root / r], r) for r in rels)
    _write(target, text, force)
    return len(rels)


def _check(
    record: Path, path: Path, algo: str | None, spec: str | None, threads: int | None,
    fmt: str, output: Path | None, compat: bool,
) -> None:  # fmt: skip
    from exl3tool.identity.compare import check, load_record
    from exl3tool.report.model import ArtifactRef, Report
    from exl3tool.report.render import emit

    findings = Findings()
    rec = load_record(record, findings)
    report = Report([ArtifactRef(str(path), "unknown")], findings)
    if rec is None:
        emit(report, fmt, output)
        raise typer.Exit(1)
    if algo is not None and algo != rec["algorithm"]:
        raise UsageError(f"--algo {algo} but {record} records {rec['algorithm']} digests")
    spec = spec or rec.get("selection")
    want_compat: bool | None = None if rec.get("compatibility") and compat else False
    ident, kind, lf, ckpt = _hash(path, rec["algorithm"], spec, threads, want_compat)
    report.artifacts[0].kind = kind.value
    findings.extend(lf)
    _artifact_findings(ident, kind, findings, ckpt, str(path))
    check(rec, ident, findings, str(path))
    if findings:
        emit(report, fmt, output)
        raise typer.Exit(report.exit_code())
    summary = (
        f"identity OK: {path} matches {record} ({len(ident.tensors)} tensors, "
        f"{len(ident.layers)} layers, {ident.algorithm} root {ident.root[:16]}…)"
    )
    if fmt == "json":
        report.notes.append(summary)
        line = json.dumps(report.to_json(), separators=(",", ":"))
    else:
        line = summary
    _write(output, line + "\n", True)


@handle_errors
def identity(
    path: Annotated[Path, typer.Argument(help="Checkpoint, base, cartridge or shard file.")],
    algo: AlgoOpt = None,
    layers: Annotated[
        str | None, typer.Option("--layers", help="Only these layers, e.g. 3-5,7 or other.")
    ] = None,
    threads: Annotated[
        int | None, typer.Option("--threads", min=1, help="Hashing threads (default: cores).")
    ] = None,
    fmt: Annotated[
        str, typer.Option("--format", "-f", help="text or json (--check: also sarif, junit).")
    ] = "text",
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write to this file (atomically).")
    ] = None,
    sha256sum: Annotated[
        Path | None,
        typer.Option("--sha256sum", help="Also write a `sha256sum -c` manifest of the files."),
    ] = None,
    check_file: Annotated[
        Path | None,
        typer.Option("--check", help="Recompute and compare with this identity JSON."),
    ] = None,
    compat: Annotated[
        bool,
        typer.Option(
            "--compat/--no-compat",
            help="Add the MSRT compatibility block when the experts have a uniform K.",
        ),
    ] = True,
    force: Annotated[bool, typer.Option("--force", help="Replace existing output files.")] = False,
) -> None:
    """Per-tensor, per-layer and root digests of an artifact's logical tensors.

    Shard boundaries, file names and TP rank slicing do not change them."""
    if algo is not None:
        check_algo(algo)
    if layers:
        parse_layers(layers)
    if check_file is not None:
        check_format(fmt)
        _check(check_file, path, algo, layers, threads, fmt, output, compat)
        return
    check_format(fmt, ("text", "json"))
    algo = algo or "blake3"
    for target in (output, sha256sum):
        if target is not None and target.exists() and not force:
            fail(f"{target} exists; pass --force to replace it", 1)
    ident, kind, findings, ckpt = _hash(path, algo, layers, threads, None if compat else False)
    _artifact_findings(ident, kind, findings, ckpt, str(path))
    if sha256sum is not None:
        write_sha256sum(path, sha256sum, threads, force)
    text = json.dumps(ident.to_json(), indent=2) + "\n" if fmt == "json" else _text(ident, path)
    _write(output, text, force)
    for f in findings:
        where = f" ({f.location.tensor})" if f.location.tensor else ""
        file = f"{f.location.file}: " if f.location.file else ""
        sys.stderr.write(f"{file}{f.level.value} {f.code} {f.message}{where}\n")
    if findings.has_errors():
        raise typer.Exit(1)
