"""`exl3tool identity`: logical tensor/layer/root digests of an artifact, `--check` against a
record, and a `sha256sum -c` manifest of its files.

An artifact whose container is broken (unreadable headers, no shards, a config that is not
JSON) gets its findings and no digests: a confident answer about bytes that no loader reads
would certify nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from exl3tool.actions.counts import check_counts
from exl3tool.actions.inputs import anchor, check_readable, resolve_input
from exl3tool.formats.detect import Kind
from exl3tool.identity.fast import Identity
from exl3tool.report.model import ArtifactRef, Report
from exl3tool.rules.errors import UsageError
from exl3tool.rules.registry import Findings


@dataclass(frozen=True)
class Options:
    path: str
    algo: str | None = None  # blake3 (default) or sha256
    layers: str | None = None  # only these layers, e.g. 3-5,7 or other
    threads: int | None = None
    compat: bool = True  # the MSRT compatibility block when the experts have a uniform K
    sha256sum: Path | None = None  # also write a `sha256sum -c` manifest of the files
    check: Path | None = None  # recompute and compare with this identity record
    force: bool = False  # replace an existing --sha256sum manifest


@dataclass
class IdentityResult:
    path: Path
    kind: str
    identity: Identity | None  # None: the container is broken, no digests are given
    findings: Findings = field(default_factory=Findings)
    manifest_files: int | None = None  # files in the --sha256sum manifest, when written
    summary: str | None = None  # --check: the one-line verdict when everything matches

    def report(self) -> Report:
        return Report([ArtifactRef(str(self.path), self.kind)], self.findings)

    def exit_code(self) -> int:
        return 1 if self.findings.has_errors() else 0


@dataclass(frozen=True)
class Hashed:
    identity: Identity
    kind: Kind
    container: Findings  # container defects that matter for an identity
    ckpt: Any


def hash_artifact(
    path: Path, algo: str, spec: str | None, threads: int | None, compat: bool | None
) -> Hashed:
    """Open `path` and compute its identity (also when its container has errors: `diff` says
    such a comparison is not conclusive)."""
    from exl3tool.identity import early
    from exl3tool.identity.artifact import open_artifact
    from exl3tool.identity.engine import shard_stamps
    from exl3tool.identity.fast import compute_identity, parse_layers, planned_bytes, select
    from exl3tool.identity.logical import build_plan
    from exl3tool.io.progress import progress_bar

    ahead = headers = None
    names = _shard_names(path)
    if threads is None:  # one worker per core, less one for this process's per-tensor work
        from exl3tool.identity.engine import default_threads
        from exl3tool.identity.pool_size import hashing_workers

        shards = [path / n for n in names] if names is not None else [path]
        threads = hashing_workers(shards, default_threads())
    try:
        headers = _headers_ahead(path, names, threads)  # parse beside the configs and the index
        ahead = early.start(path, algo, threads) if spec is None else None  # hashes while we parse
        ckpt, kind, findings = open_artifact(path, headers.take if headers else None)
        if headers is not None:
            headers.stop()  # done with: its workers go before the hashing (again below: a no-op)
        plan = select(build_plan(ckpt), parse_layers(spec) if spec else None)
        if kind is Kind.MSRT_BASE and compat is not False:
            compat = True  # a base's identity is its point; keep it even when defective
        planned = partial(planned_bytes, plan, algo, compat)
        with progress_bar(planned, f"hashing ({algo})") as bar:
            ident = compute_identity(
                None,
                algo=algo,
                selection=spec,
                threads=threads,
                progress=bar,
                compat=compat,
                plan=plan,
                known=ahead,
                stamps=shard_stamps(ckpt.shards.values()),
            )
    finally:
        if headers is not None:
            headers.stop()
        if ahead is not None:
            ahead.stop()  # also when nothing was looked up
    return Hashed(ident, kind, findings, ckpt)


def _shard_names(path: Path) -> list[str] | None:
    """The `*.safetensors` files of the folder `path`; None for a file or an unreadable folder."""
    from exl3tool.formats.checkpoint import list_safetensors

    try:
        return list_safetensors(path) if path.is_dir() else None
    except OSError:
        return None


def _headers_ahead(path: Path, names: list[str] | None, threads: int | None) -> Any:
    """Workers parsing the headers of the shards `names` of the folder `path`
    (io/headers_ahead), or None."""
    from exl3tool.identity.engine import default_threads, fork_unsafe
    from exl3tool.io import headers_ahead

    workers = threads or default_threads()
    if names is None or workers < headers_ahead.MIN_WORKERS or fork_unsafe():
        return None
    return headers_ahead.start(path, names, workers)


def _check_selection(spec: str | None, h: Hashed, path: Path) -> None:
    """A usage error for `--layers` that selects no tensor of an artifact that has some,
    naming the layers it holds (e.g. `it holds layers 0-47 and other`)."""
    if not spec or h.identity.tensors or not h.ckpt.tensors:
        return
    from exl3tool.identity.fast import OTHER, layer_key
    from exl3tool.io.layer_spec import layers_text

    keys = set(map(layer_key, h.ckpt.tensors))
    numbers = sorted(int(k) for k in keys if k != OTHER)
    parts = [layers_text(numbers)] if numbers else []
    held = " and ".join([*parts, *([OTHER] if OTHER in keys else [])])
    raise UsageError(f"--layers {spec} selects no tensor of {path}: it holds {held}")


def identity_findings(h: Hashed, findings: Findings, label: str) -> None:
    """What the identity itself says is wrong: reassembly defects, an MSRT base's incomplete
    compatibility identity or one that differs from the published one."""
    if not h.identity.problems and h.kind is not Kind.MSRT_BASE:
        return  # the usual case: no need to load the comparison code
    from exl3tool.identity.compare import problem_findings, published_findings
    from exl3tool.rules import identity as ir

    problem_findings(h.identity, findings, label)
    if h.kind is Kind.MSRT_BASE:
        c = h.identity.compatibility
        for p in c.problems if c is not None else ():
            findings.add(ir.ID_COMPAT_INCOMPLETE, p.message, file=label, tensor=p.tensor)
        if c is None:
            findings.add(ir.ID_COMPAT_INCOMPLETE, "no uniform K in 2..6", file=label)
        if h.identity.selection is None:
            published_findings(h.ckpt.config, c, findings)


def _prepare(opts: Options) -> Path:
    from exl3tool.identity.engine import check_algo
    from exl3tool.identity.fast import parse_layers

    if opts.algo is not None:
        check_algo(opts.algo)
    if opts.layers:
        parse_layers(opts.layers)
    check_counts(None, opts.threads)
    path = resolve_input(opts.path)
    check_readable(path)
    return path


def run(opts: Options) -> IdentityResult:
    """The identity of `opts.path`, or (broken container) its findings and no digests."""
    from exl3tool.report.render import check_output

    if opts.check is not None:
        return check_record(opts)
    path = _prepare(opts)
    check_output(opts.sha256sum, opts.force, (path,))
    hashed = hash_artifact(
        path, opts.algo or "blake3", opts.layers, opts.threads, None if opts.compat else False
    )
    if hashed.container.has_errors():
        errors = anchor(path, Findings(hashed.container.errors()))
        return IdentityResult(path, hashed.kind.value, None, errors)
    _check_selection(opts.layers, hashed, path)
    result = IdentityResult(path, hashed.kind.value, hashed.identity)
    identity_findings(hashed, result.findings, str(path))
    if opts.sha256sum is not None:
        result.manifest_files = write_sha256sum(
            path, opts.sha256sum, opts.threads, opts.force, hashed.ckpt
        )
    return result


def check_record(opts: Options) -> IdentityResult:
    """`--check RECORD`: every tensor, layer, root and compatibility difference is a finding."""
    from exl3tool.identity.compare import check, load_record

    assert opts.check is not None
    path = _prepare(opts)
    result = IdentityResult(path, "unknown", None)
    rec = load_record(opts.check, result.findings)
    if rec is None:
        return result
    if opts.algo is not None and opts.algo != rec["algorithm"]:
        raise UsageError(f"--algo {opts.algo} but {opts.check} records {rec['algorithm']} digests")
    spec = opts.layers or rec.get("selection")
    want_compat: bool | None = None if rec.get("compatibility") and opts.compat else False
    hashed = hash_artifact(path, rec["algorithm"], spec, opts.threads, want_compat)
    result.kind = hashed.kind.value
    result.findings.extend(hashed.container)
    if hashed.container.has_errors():
        return result  # digests of a broken container match or differ by accident
    _check_selection(opts.layers, hashed, path)
    result.identity = hashed.identity
    identity_findings(hashed, result.findings, str(path))
    check(rec, hashed.identity, result.findings, str(path))
    if not result.findings:
        ident = hashed.identity
        result.summary = (
            f"identity OK: {path} matches {opts.check} ({len(ident.tensors)} tensors, "
            f"{len(ident.layers)} layers, {ident.algorithm} root {ident.root[:16]}…)"
        )
    return result


def _manifest_line(digest: str, rel: str) -> str:
    """One `sha256sum` line; names with a backslash or newline use its escaped form."""
    if "\\" in rel or "\n" in rel or "\r" in rel:
        esc = rel.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
        return f"\\{digest}  {esc}\n"
    return f"{digest}  {rel}\n"


def _artifact_files(path: Path, exclude: Path | None) -> tuple[Path, list[str]]:
    from exl3tool.io.outputs import real_location

    if path.is_file():
        return path.parent, [path.name]
    manifest = real_location(exclude) if exclude is not None else None
    files = []
    for dirpath, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for n in names:
            p = Path(dirpath) / n
            # a link to a file is that file (HF cache snapshots link every file into blobs/)
            if n.startswith(".") or not p.is_file():
                continue
            if manifest is not None and real_location(p) == manifest:
                continue  # the manifest itself (named through a link or `..` too)
            files.append(p.relative_to(path).as_posix())
    return path, sorted(files)


def write_sha256sum(
    path: Path, target: Path, threads: int | None, force: bool, ckpt: Any = None
) -> int:
    """Write a `sha256sum -c` manifest of the artifact's files (paths relative to it). Each
    shard of `ckpt` (the identity's) must still be the file its header was read from: one
    changed in between is InputChanged (exit 3), not a manifest of other bytes."""
    from exl3tool.identity.engine import hash_files
    from exl3tool.io.atomic import write_bytes_atomic
    from exl3tool.io.progress import progress_bar

    root, rels = _artifact_files(path, target)
    stamps = {os.path.abspath(st.path): st.stamp for st in ckpt.shards.values()} if ckpt else {}
    files = [root / r for r in rels]
    expected = {p: stamps[a] for p in files if (a := os.path.abspath(p)) in stamps}
    total = sum(p.stat().st_size for p in files)
    with progress_bar(total, "sha256 of files") as bar:
        digests = hash_files(files, "sha256", threads, bar, expected)
    text = "".join(_manifest_line(digests[root / r], r) for r in rels)
    write_bytes_atomic(target, text.encode(), force=force)
    return len(rels)
