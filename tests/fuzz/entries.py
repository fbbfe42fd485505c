"""The library entry point each fuzz case calls on its mutated artifact, by entry name: one
small function per command, as the CLI would call it (`ENTRIES` in `targets` says which kinds
of seed each one gets). Each returns what it found (Findings, or a result holding them)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

# (the mutated artifact, the pristine seeds by kind, a fresh output directory, the seed's kind)
Call = Callable[[Path, dict[str, Path], Path, str], Any]


def _validate(**options: Any) -> Call:
    def call(art: Path, pristine: dict[str, Path], out: Path, kind: str) -> Any:
        from exl3tool.actions.validate import validate_path
        from exl3tool.checks.options import ValidateOptions

        opts = dict(options)
        if opts.pop("with_base", False):
            opts["base"] = pristine["base"]
        return validate_path(art, ValidateOptions(threads=1, **opts))[1]

    return call


def _validate_ahead(art: Path, pristine: dict[str, Path], out: Path, kind: str) -> Any:
    """validate of an R7 checkpoint with its read-ahead worker forked (io/forked; from 4 MiB of
    JSON, here at any size) must report what it reports alone (one thread): the same findings
    in the same order."""
    from exl3tool.actions import validate
    from exl3tool.checks.options import ValidateOptions
    from exl3tool.checks.rows import rows
    from exl3tool.io import views
    from exl3tool.rules.errors import Exl3ToolError

    def outcome(threads: int) -> tuple[Any, ...]:
        try:
            found = validate.validate_path(art, ValidateOptions(threads=threads))[1]
        except Exl3ToolError as exc:  # raised the same way alone, or it is a defect
            return (type(exc).__name__, str(exc))
        return rows(found), found

    # the artifact was just written: RACY_NS 0 or nothing read ahead would be used
    saved = validate.PREFETCH_MIN_BYTES, views.RACY_NS
    validate.PREFETCH_MIN_BYTES, views.RACY_NS = 0, 0
    try:
        ahead = outcome(2)
    finally:
        validate.PREFETCH_MIN_BYTES, views.RACY_NS = saved
    alone = outcome(1)
    assert ahead[0] == alone[0], f"read ahead: {ahead[0]!r:.300} alone: {alone[0]!r:.300}"
    return ahead[1] if type(ahead[1]) is not str else None


def _load_index(art: Path, pristine: dict[str, Path], out: Path, kind: str) -> Any:
    """The loader reading the index by its weight_map's groups (io/index_scan) must find what it
    finds parsing it: the same findings in the same order, the same tensors and rejections."""
    from exl3tool.checks.rows import rows
    from exl3tool.formats import checkpoint
    from exl3tool.rules.errors import Exl3ToolError
    from exl3tool.rules.registry import Findings

    def outcome(scan: Any) -> tuple[Any, Findings]:
        real, checkpoint.scan_index = checkpoint.scan_index, scan
        found = Findings()
        try:
            ckpt = checkpoint.load_checkpoint(art, found)
        except Exl3ToolError as exc:  # raised the same way both ways, or it is a defect
            return (type(exc).__name__, str(exc)), found
        finally:
            checkpoint.scan_index = real
        sets = (ckpt.rejected_files, ckpt.damaged_shards, ckpt.rejected_tensors)
        return (rows(found), list(ckpt.tensors), list(ckpt.shards), *map(sorted, sets)), found

    scanned = outcome(checkpoint.scan_index)
    parsed = outcome(lambda data: None)
    assert scanned[0] == parsed[0], f"scanned: {scanned[0]!r:.300} parsed: {parsed[0]!r:.300}"
    return scanned[1]


def identity_of(art: Path) -> Any:
    """The sha256 identity of a checkpoint, straight from the engine (one thread)."""
    from exl3tool.formats.checkpoint import load_checkpoint
    from exl3tool.identity.fast import compute_identity
    from exl3tool.rules.registry import Findings

    return compute_identity(load_checkpoint(art, Findings()), algo="sha256", threads=1)


def _identity_cli(art: Path, pristine: dict[str, Path], out: Path, kind: str) -> Any:
    """As `exl3tool identity` computes it: blake3, the compatibility block, two threads."""
    from exl3tool.actions.identity import Options, run

    return run(Options(str(art), threads=2)).findings


def _identity_forked(art: Path, pristine: dict[str, Path], out: Path, kind: str) -> Any:
    """The same, hashed by forked workers (the engine's path from 4 workers and 1 GiB, here
    at any size): a worker's error must reach the caller as the thread's would."""
    from exl3tool.actions.identity import Options, run
    from exl3tool.identity import engine

    saved = engine.FORK_MIN_THREADS, engine.FORK_MIN_BYTES, engine.FORK_BYTES_PER_RSS
    engine.FORK_MIN_THREADS, engine.FORK_MIN_BYTES, engine.FORK_BYTES_PER_RSS = 2, 0, 0
    try:
        return run(Options(str(art), threads=2)).findings
    finally:
        engine.FORK_MIN_THREADS, engine.FORK_MIN_BYTES, engine.FORK_BYTES_PER_RSS = saved


def _identity_early(art: Path, pristine: dict[str, Path], out: Path, kind: str) -> Any:
    """The identity with tensors hashed and shard headers parsed ahead by forked workers
    (identity/early at any size here, io/headers_ahead from 4 threads) must be the one computed
    without them: the same digests, the same findings, or the same error."""
    import os

    from exl3tool.actions.identity import Options, run
    from exl3tool.identity import early, engine
    from exl3tool.io import views
    from exl3tool.rules.errors import Exl3ToolError

    def outcome() -> tuple[Any, ...]:
        try:
            r = run(Options(str(art), threads=4))
        except Exl3ToolError as exc:
            return (type(exc).__name__,)
        ident = r.identity.to_json() if r.identity is not None else None
        return ident, sorted((f.code, f.message) for f in r.findings), r

    # the artifact was just written: RACY_NS 0 or nothing hashed ahead would be kept
    saved = early.EARLY_MIN_BYTES, early.CHUNK, engine.fork_unsafe, views.RACY_NS
    early.EARLY_MIN_BYTES, early.CHUNK, engine.fork_unsafe = 0, 4096, lambda: False
    views.RACY_NS = 0
    try:
        ahead = outcome()
        os.environ["EXL3TOOL_NO_EARLY"] = os.environ["EXL3TOOL_NO_AHEAD"] = "1"
        plain = outcome()
    finally:
        os.environ.pop("EXL3TOOL_NO_EARLY", None)
        os.environ.pop("EXL3TOOL_NO_AHEAD", None)
        early.EARLY_MIN_BYTES, early.CHUNK, engine.fork_unsafe, views.RACY_NS = saved
    assert ahead[:2] == plain[:2], f"hashed ahead: {ahead[:2]!r:.300} alone: {plain[:2]!r:.300}"
    return ahead[2].findings if len(ahead) > 2 else None


def _identity_manifest(art: Path, pristine: dict[str, Path], out: Path, kind: str) -> Any:
    """A layer selection, sha256, and a `sha256sum -c` manifest written beside."""
    from exl3tool.actions.identity import Options, run

    out.mkdir(parents=True, exist_ok=True)
    opts = Options(str(art), algo="sha256", layers="3,other", threads=1,
                   sha256sum=out / "SHA256SUMS")  # fmt: skip
    return run(opts).findings


def _identity_check(art: Path, pristine: dict[str, Path], out: Path, kind: str) -> Any:
    """`identity --check` of the pristine seed's record against the mutant."""
    from exl3tool.actions.identity import Options, run

    out.mkdir(parents=True, exist_ok=True)
    record = run(Options(str(pristine[kind]), threads=1)).identity
    assert record is not None
    (out / "record.json").write_text(json.dumps(record.to_json()))
    return run(Options(str(art), threads=2, check=out / "record.json")).findings


def _inspect(art: Path, pristine: dict[str, Path], out: Path, kind: str) -> Any:
    from exl3tool.actions.inspect import describe

    return describe(art).findings


def _plan(art: Path, pristine: dict[str, Path], out: Path, kind: str) -> Any:
    from exl3tool.actions.plan import PlanOptions, run

    return run(PlanOptions(str(art), tp=2, gpu_memory=1 << 30)).findings


def _diff(art: Path, pristine: dict[str, Path], out: Path, kind: str) -> Any:
    from exl3tool.actions.diff import Options, run

    return run(Options(str(art), str(pristine[kind]), threads=1))


def _check(art: Path, pristine: dict[str, Path], out: Path, kind: str) -> Any:
    from exl3tool.actions.check import Options, run

    return run(Options(config=art / "exl3tool.toml", quiet=True)).report.findings


def _slice(mode: str = "tensor", layout: str = "per-rank") -> Call:
    def call(art: Path, pristine: dict[str, Path], out: Path, kind: str) -> Any:
        from exl3tool.actions.slice import Options, run

        opts = Options(str(art), tp=2, mode=mode, layout=layout, max_shard_size="64KiB",
                       verify=True, output=out, threads=1)  # fmt: skip
        return run(opts).findings

    return call


def _slice_verify(with_source: bool) -> Call:
    def call(art: Path, pristine: dict[str, Path], out: Path, kind: str) -> Any:
        from exl3tool.tp.run import verify_output

        return verify_output(art, pristine["base"] if with_source else None, 1)

    return call


def _stage(role: str, tp: int | None = None) -> Call:
    def call(art: Path, pristine: dict[str, Path], out: Path, kind: str) -> Any:
        from exl3tool.staging.stage import stage_cartridge

        if role == "base":  # the mutant is the base the pristine cartridge is staged on
            adapter, base = pristine["cartridge"], art
        else:
            adapter, base = art, pristine["base"]
        return stage_cartridge(adapter, base, out=out, tp=tp, threads=1).findings

    return call


def _record_check(art: Path, pristine: dict[str, Path], out: Path, kind: str) -> Any:
    """`identity --check` and `diff` of a mutated record against its artifact."""
    from exl3tool.identity import compare
    from exl3tool.rules.errors import InputError
    from exl3tool.rules.registry import Findings

    findings = Findings()
    try:
        doc = compare.load_record(art / "record.json", findings)
    except InputError:
        return findings
    if doc is not None:
        ident = identity_of(pristine["base"])
        compare.check(doc, ident, findings, "base")
        compare.diff(doc, ident.to_json())
    return findings


def _record_scan(art: Path, pristine: dict[str, Path], out: Path, kind: str) -> Any:
    """The layout scan of records above 64 MiB: a value it gives must be the strict reader's."""
    from exl3tool.identity.compare import RECORD_MAX_BYTES
    from exl3tool.identity.record_scan import scan_record
    from exl3tool.io.fs import read_document
    from exl3tool.io.jsonfile import parse_json
    from exl3tool.rules.registry import Findings

    findings = Findings()
    try:
        data = read_document(art / "record.json", RECORD_MAX_BYTES)
        value = scan_record(data, lambda rest: parse_json(rest, findings, "r"))
    except (OSError, ValueError):  # NotARecord is a ValueError
        return findings
    if value is not None and value != parse_json(data, Findings(), "r"):
        raise AssertionError("the layout scan gave another value than the strict parse")
    return findings


CALLS: dict[str, Call] = {
    "validate": _validate(),
    "validate-hash": _validate(hash=True),
    "validate-tp2": _validate(tp=2),
    "validate-base": _validate(with_base=True),
    "validate-ahead": _validate_ahead,
    "load-index": _load_index,
    "identity": lambda art, pristine, out, kind: identity_of(art),
    "identity-cli": _identity_cli,
    "identity-forked": _identity_forked,
    "identity-early": _identity_early,
    "identity-manifest": _identity_manifest,
    "identity-check": _identity_check,
    "inspect": _inspect,
    "plan": _plan,
    "diff": _diff,
    "check": _check,
    "slice": _slice(),
    "slice-rank-sliced": _slice(layout="rank-sliced"),
    "slice-expert": _slice(mode="expert"),
    "slice-verify": _slice_verify(with_source=True),
    "slice-verify-alone": _slice_verify(with_source=False),
    "stage": _stage("cartridge"),
    "stage-tp2": _stage("cartridge", tp=2),
    "stage-base": _stage("base"),
    "record-check": _record_check,
    "record-scan": _record_scan,
}
