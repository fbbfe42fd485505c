"""`exl3tool validate`: detect what each path is and run its family's checks.

`run(Options)` is the command; `validate_path` the library API of one artifact (the gate, the
pre-commit hook and the benchmarks call it)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exl3tool.actions.counts import check_counts
from exl3tool.actions.inputs import (
    anchor,
    artifact_root,
    check_readable,
    resolve_input,
    resolve_optional,
)
from exl3tool.actions.validate_checkpoint import check_checkpoint
from exl3tool.checks.boundary import crash_rule, family_boundary
from exl3tool.checks.options import ValidateOptions
from exl3tool.checks.slices import rank_of_folder
from exl3tool.formats.checkpoint import load_checkpoint
from exl3tool.formats.detect import Kind, detect, report_unusable_configs
from exl3tool.io.gcpause import paused_gc
from exl3tool.report.model import ArtifactRef, Report
from exl3tool.rules import checkpoint as ck
from exl3tool.rules.errors import InputError
from exl3tool.rules.registry import Findings

CHECKPOINT_KINDS = (Kind.EXL3, Kind.R7, Kind.RANK_SLICED, Kind.SAFETENSORS, Kind.MSRT_BASE)


def _dispatch(path: Path, kind: Kind, findings: Findings, options: ValidateOptions) -> dict:
    if kind is Kind.CARTRIDGE:
        from exl3tool.checks.cartridge import check_cartridge

        check_cartridge(path, findings, options)
        return {}
    if kind is Kind.TP_SLICES:
        from exl3tool.actions.validate_slices import check_slices_dir

        return check_slices_dir(path, findings, options)
    if kind not in CHECKPOINT_KINDS:
        if report_unusable_configs(path, findings):
            return {}  # a config that does not parse is the root cause, not an unknown kind
        has_config = path.is_dir() and (path / "config.json").is_file()
        findings.add(
            ck.CK_UNKNOWN_KIND,
            "no tensor_storage, r7_routed_experts, hybrid_tr3_tail, exl3-msrt-base/1 profile "
            "or adapter_config.json found",
            file="config.json" if has_config else ".",
            pointer="/quantization_config" if has_config else None,
        )
        return {}
    rank = rank_of_folder(path) if path.is_dir() else None
    if rank is not None:  # a rank folder of a slice output: checked as that rank's slice
        from exl3tool.actions.validate_slices import check_rank

        ckpt = load_checkpoint(path, findings)
        return check_rank(ckpt, kind, rank, findings, options)
    if kind is Kind.R7 and not options.hash:
        from exl3tool.checks.r7 import prefetch_r7
        from exl3tool.io.forked import Forked, can_fork

        # The layer shards' small payloads and the per-layer manifests need only the files: a
        # worker forked now (while this process is small: few pages to copy on write) reads
        # them while the checkpoint loads.
        parallel = can_fork(options.threads) and _json_bytes(path) >= PREFETCH_MIN_BYTES
        with Forked(lambda: prefetch_r7(path), parallel) as work:
            ckpt = load_checkpoint(path, findings)
            pre = work if work.started else None
            return check_checkpoint(ckpt, kind, findings, options, prefetched=pre)
    return check_checkpoint(load_checkpoint(path, findings), kind, findings, options)


# JSON beside the shards (manifests, index) from which an R7 read-ahead worker pays for its fork
# (GLM-5.2: 68 MB; a tiny checkpoint is done before the worker would be)
PREFETCH_MIN_BYTES = 4 << 20


def _json_bytes(root: Path) -> int:
    try:
        with os.scandir(root) as entries:
            return sum(
                e.stat().st_size for e in entries if e.name.endswith(".json") and e.is_file()
            )
    except OSError:
        return 0


def validate_path(path: Path, options: ValidateOptions) -> tuple[ArtifactRef, Findings]:
    """Detect the artifact kind of `path` and run its checks. Raises InputError (exit 3) when
    the path cannot be read at all; every defect of a readable artifact is a finding."""
    path = artifact_root(Path(path))
    check_readable(path)
    start = time.perf_counter()
    kind = detect(path)
    findings = Findings()
    try:
        extra: dict = {}
        with paused_gc(), family_boundary(findings, crash_rule(kind.value)):
            extra = _dispatch(path, kind, findings, options)
    except (PermissionError, IsADirectoryError) as exc:
        raise InputError(f"{exc.filename or path}: {exc.strerror or exc}") from exc
    extra["seconds"] = round(time.perf_counter() - start, 3)
    return ArtifactRef(str(path), kind.value, extra), anchor(path, findings)


@dataclass(frozen=True)
class Options:
    """What `exl3tool validate` was asked (paths may be `org/name[@revision]`)."""

    paths: tuple[str, ...]
    tp: int | None = None
    hash: bool = False
    base: str | None = None
    threads: int | None = None
    runtime: str = "auto"  # checks/conformance.RUNTIMES
    quiet: bool = False
    selection: Any = None  # a rules.selection.RuleSelection, applied to every finding


def run(opts: Options) -> Report:
    """Validate every path into one report; InputError (exit 3) before any work when one path
    cannot be read."""
    from exl3tool.io.progress import set_quiet

    check_counts(opts.tp, opts.threads)
    set_quiet(opts.quiet)
    paths = [resolve_input(p) for p in opts.paths]
    options = ValidateOptions(
        tp=opts.tp,
        hash=opts.hash,
        base=resolve_optional(opts.base),
        threads=opts.threads,
        runtime=opts.runtime,
    )
    for path in paths:
        check_readable(path)
    report = Report()
    for path in paths:
        ref, findings = validate_path(path, options)
        report.artifacts.append(ref)
        report.add_findings(opts.selection.apply(findings) if opts.selection else findings)
    return report
