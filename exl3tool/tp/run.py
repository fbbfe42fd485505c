"""`exl3tool slice` as a library call: detect, plan, write (or dry-run), verify.

Cartridges go through the one `full` -> `rank-sharded` implementation in `tp/cartridge.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exl3tool.formats.checkpoint import load_checkpoint
from exl3tool.formats.detect import Kind, detect
from exl3tool.io.atomic import atomic_dir
from exl3tool.io.gcpause import paused_gc
from exl3tool.rules import tp as tp_rules
from exl3tool.rules.registry import Findings
from exl3tool.tp.plan import plan_slices
from exl3tool.tp.slices import PlanRefused, SlicePlan
from exl3tool.tp.writer import DEFAULT_MAX_SHARD, SliceFailed, write_plan


@dataclass(frozen=True)
class SliceOptions:
    tp: int
    mode: str = "tensor"
    layout: str = "per-rank"
    max_shard_size: int = DEFAULT_MAX_SHARD
    force: bool = False
    verify: bool = False
    threads: int | None = None
    sha256: bool = False  # per-file sha256 in the manifest, besides blake3


@dataclass
class SliceOutcome:
    kind: str
    plan: SlicePlan | None = None  # None for cartridges
    out: Path | None = None  # None for a dry run
    manifest: dict[str, Any] | None = None
    findings: Findings = field(default_factory=Findings)  # informational (TP003) + verification
    cartridge: dict[str, Any] | None = None  # dry-run summary / written adapter manifest


def _refused(findings: Findings, message: str) -> PlanRefused:
    out = Findings(findings.errors())
    out.add(tp_rules.TP_UNSUPPORTED, message)
    return PlanRefused(out)


def _cartridge(source: Path, out: Path | None, opts: SliceOptions, progress: Any) -> SliceOutcome:
    from exl3tool.tp.cartridge import shard_cartridge, verify_sharded

    root = source if source.is_dir() else source.parent
    if opts.mode != "tensor":
        raise _refused(Findings(), "cartridges are rank-sharded by tensor only (--mode tensor)")
    outcome = SliceOutcome(Kind.CARTRIDGE.value)
    if out is None:
        outcome.cartridge = cartridge_summary(root, opts.tp)
        return outcome
    with atomic_dir(out, force=opts.force, inputs=(source,)) as tmp:
        outcome.cartridge = shard_cartridge(root, opts.tp, tmp, progress=progress)
        if opts.verify:
            found = verify_sharded(root, tmp)
            if found.has_errors():
                raise SliceFailed(found, "verification of the sharded cartridge failed")
            outcome.findings.extend(found)
    outcome.out = Path(out)
    return outcome


def cartridge_summary(root: Path, tp: int) -> dict[str, Any]:
    """Dry-run figures of a cartridge split: trellises divided over the ranks, scales replicated."""
    f = Findings()
    ckpt = load_checkpoint(root, f, need_config=False)
    trellis = [r for n, r in ckpt.tensors.items() if ".trellis" in n]
    scales = [r for n, r in ckpt.tensors.items() if ".trellis" not in n]
    per = sum(r.info.nbytes for r in trellis) // tp + sum(r.info.nbytes for r in scales)
    return {
        "kind": "cartridge",
        "tp": tp,
        "ranks": [
            {
                "rank": r,
                "tensors": len(trellis) + len(scales),
                "bytes": per,
                "replicated_tensors": len(scales),
                "replicated_bytes": sum(x.info.nbytes for x in scales),
            }
            for r in range(tp)
        ],
        "reported": [],
    }


def slice_artifact(
    source: Path, out: Path | None, opts: SliceOptions, *, progress: Any = None
) -> SliceOutcome:
    """Plan and (unless `out` is None: dry run) write the slices of `source` into `out`.

    Raises PlanRefused for impossible splits or unusable inputs and SliceFailed when writing or
    verification finds errors; in both cases nothing is written at `out`.
    """
    source = Path(source)
    kind = detect(source)
    if kind is Kind.CARTRIDGE:
        return _cartridge(source, out, opts, progress)
    # the plan, the read plan and the manifest are ~10 acyclic objects per tensor slice
    with paused_gc():
        return _slice_checkpoint(source, kind, out, opts, progress)


def _slice_checkpoint(
    source: Path, kind: Kind, out: Path | None, opts: SliceOptions, progress: Any
) -> SliceOutcome:
    findings = Findings()
    ckpt = load_checkpoint(source, findings, need_config=False)
    if findings.has_errors():
        raise _refused(findings, "the input has container errors; run `exl3tool validate`")
    plan = plan_slices(ckpt, kind, opts.tp, opts.mode, layout=opts.layout)
    outcome = SliceOutcome(kind.value, plan, findings=plan.findings())
    if out is None:
        return outcome
    result = write_plan(
        plan,
        ckpt,
        source,
        out,
        max_shard_size=opts.max_shard_size,
        force=opts.force,
        verify=opts.verify,
        threads=opts.threads,
        progress=progress,
        sha256=opts.sha256,
    )
    outcome.out, outcome.manifest = result.out, result.manifest
    return outcome


def verify_output(out: Path, source: Path | None = None, threads: int | None = None) -> Findings:
    """`--verify-only`: prove an existing output (a slice output, or a sharded cartridge)."""
    out = Path(out)
    if (out / "adapter_config.json").is_file():
        from exl3tool.tp.cartridge import verify_sharded

        if source is None:
            f = Findings()
            f.add(
                tp_rules.TP_MANIFEST,
                "a sharded cartridge is verified against its source: pass PATH",
            )
            return f
        src = Path(source)
        return verify_sharded(src if src.is_dir() else src.parent, out)
    from exl3tool.tp.verify import verify_slices

    return verify_slices(out, source=source, threads=threads)
