"""`exl3tool slice`: tensor-parallel slices of a checkpoint, an MSRT base or a cartridge (the
planner and writers are `exl3tool.tp`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from fractions import Fraction
from functools import partial
from pathlib import Path
from typing import Any

from exl3tool.actions.counts import check_counts
from exl3tool.actions.inputs import resolve_input, resolve_optional
from exl3tool.report.model import ArtifactRef, Report
from exl3tool.rules.errors import UsageError
from exl3tool.rules.registry import Findings

MAX_BYTES = 2**63 - 1  # what a file offset holds
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6,
          "mib": 2**20, "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12,
          "tib": 2**40}  # fmt: skip


def parse_size(text: str) -> int:
    """`5GiB`, `500MB`, `1048576` -> bytes (decimal and binary units)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(f"cannot read size {text!r} (e.g. 5GiB, 500MB, 1048576)")
    try:
        n = int(Fraction(m.group(1)) * _UNITS[unit])  # exact: a float of 400 digits is infinite
    except ValueError:  # more digits than Python converts
        raise ValueError(f"size {text[:40]!r}…: too many digits") from None
    if n < 1:
        raise ValueError(f"size {text!r} must be at least one byte")
    if n > MAX_BYTES:
        raise ValueError(f"size {text!r} is beyond {MAX_BYTES} bytes")
    return n


@dataclass(frozen=True)
class Options:
    path: str | None  # None only with verify_only
    tp: int | None = None
    mode: str = "tensor"  # tensor (split experts) or expert (whole experts)
    layout: str = "per-rank"  # per-rank (rank-{r}/ directories) or rank-sliced
    max_shard_size: str = "5GiB"
    dry_run: bool = False
    verify: bool = False
    verify_only: Path | None = None  # only verify this existing slice output
    output: Path | None = None
    force: bool = False
    threads: int | None = None
    sha256: bool = False


@dataclass
class SliceResult:
    path: str  # the artifact (or, --verify-only, the output) the findings are about
    kind: str
    findings: Findings = field(default_factory=Findings)
    summary: dict[str, Any] | None = None  # the plan (None: refused, or --verify-only)
    out: Path | None = None
    refused: bool = False

    def report(self) -> Report:
        extra = {"plan": self.summary} if self.summary else {}
        return Report([ArtifactRef(self.path, self.kind, extra)], self.findings)

    def exit_code(self) -> int:
        return 1 if self.refused or self.findings.has_errors() else 0


def _progress_total(path: Path) -> int:
    """Bytes the progress bar expects; dangling links or loops are the slicer's to report."""
    try:
        return sum(p.lstat().st_size for p in path.rglob("*.safetensors")) if path.is_dir() else 0
    except OSError:
        return 0


def _check(opts: Options) -> int:
    """The shard size in bytes; UsageError for an impossible combination."""
    from exl3tool.tp.slices import LAYOUTS, MODES

    if opts.path is None or opts.tp is None:
        raise UsageError("slice needs PATH and --tp N (or --verify-only OUT)")
    check_counts(opts.tp, opts.threads)
    if opts.mode not in MODES or opts.layout not in LAYOUTS:
        raise UsageError(f"--mode is one of {MODES}, --layout one of {LAYOUTS}")
    try:
        shard = parse_size(opts.max_shard_size)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not opts.dry_run and opts.output is None:
        raise UsageError("slice needs -o OUT (or --dry-run)")
    return shard


def run(opts: Options) -> SliceResult:
    from exl3tool.formats.detect import detect
    from exl3tool.io.progress import progress_bar
    from exl3tool.tp.run import SliceOptions, slice_artifact, verify_output
    from exl3tool.tp.slices import PlanRefused
    from exl3tool.tp.writer import SliceFailed

    if opts.verify_only is not None:
        source = resolve_optional(opts.path)
        findings = verify_output(opts.verify_only, source, opts.threads)
        return SliceResult(str(opts.verify_only), "slices", findings)
    shard = _check(opts)
    assert opts.tp is not None and opts.path is not None
    path = resolve_input(opts.path)
    if not opts.dry_run:  # before any work: an output that may not be written (io/outputs)
        from exl3tool.io.outputs import check_output_place

        check_output_place(Path(opts.output).absolute(), opts.force, (path,), directory=True)
    tp_opts = SliceOptions(
        opts.tp, opts.mode, opts.layout, shard, opts.force, opts.verify, opts.threads, opts.sha256
    )
    try:
        with progress_bar(partial(_progress_total, path), "slicing") as bar:
            out = None if opts.dry_run else opts.output
            outcome = slice_artifact(path, out, tp_opts, progress=bar)
    except (PlanRefused, SliceFailed) as exc:
        return SliceResult(str(path), detect(path).value, exc.findings, refused=True)
    summary = outcome.plan.summary() if outcome.plan is not None else outcome.cartridge
    if outcome.plan is None and not opts.dry_run:
        summary = {"kind": "cartridge", "tp": opts.tp, "ranks": [], "reported": []}
    return SliceResult(str(path), outcome.kind, outcome.findings, summary, outcome.out)
