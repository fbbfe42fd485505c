"""One function per check `exl3tool check` can run; each calls the library of its command.

Every action takes the step `Context` and returns a `StepResult`. Heavy modules (torch for
verify-swap, the slicers) are imported inside the action that needs them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from exl3tool.actions.gate.context import Context, StepResult, temp_dir
from exl3tool.rules.check import (
    GT_IDENTITY_FILE,
    GT_SKIPPED,
    GT_SLICE_VERIFY,
    GT_STEP_FAILED,
    GT_VERIFY_SWAP,
)
from exl3tool.rules.registry import Severity


def _path(ctx: Context) -> Path:
    assert ctx.target.path is not None  # plan() gives no step to an unresolved artifact
    return ctx.target.path


def validate(ctx: Context, *, hash: bool, tp: int | None = None) -> StepResult:
    """`exl3tool validate PATH [--hash] [--tp N] [--base BASE]`."""
    from exl3tool.actions.validate import validate_path
    from exl3tool.checks.options import ValidateOptions

    options = ValidateOptions(tp=tp, hash=hash, base=ctx.target.base, threads=ctx.threads)
    ref, found = validate_path(_path(ctx), options)
    res = StepResult(findings=found)
    if ref.kind and ref.kind != "unknown":
        res.extra["kind"] = ref.kind
    return res


def _identity(
    ctx: Context, algo: str, selection: str | None, compat: bool | None, broken_ok: bool = True
) -> Any:
    from exl3tool.identity.artifact import open_artifact
    from exl3tool.identity.fast import compute_identity, parse_layers

    # Container defects (broken headers, missing shards) are validate's findings; here only
    # what changes the identity counts.
    ckpt, _kind, container = open_artifact(_path(ctx))
    if not broken_ok and container.has_errors():
        return None
    return compute_identity(
        ckpt,
        algo=algo,
        layers=parse_layers(selection) if selection else None,
        selection=selection,
        threads=ctx.threads,
        compat=compat,
    )


def _identity_extra(ident: Any) -> dict[str, Any]:
    extra: dict[str, Any] = {"identity_root": ident.root, "identity_algorithm": ident.algorithm}
    if ident.compatibility is not None:
        extra["compatibility_root"] = ident.compatibility.root
    return extra


def identity_root(ctx: Context) -> StepResult:
    """`exl3tool identity PATH`: the fast (blake3) logical identity root, for the summary."""
    from exl3tool.identity.compare import problem_findings

    ident = _identity(ctx, "blake3", None, None, broken_ok=False)
    if ident is None:  # validate reports the errors; a root of unreadable bytes means nothing
        res = StepResult(status="skipped")
        res.notes.append(f"{ctx.target.label}: identity root skipped: the container has errors")
        return res
    res = StepResult(extra=_identity_extra(ident))
    problem_findings(ident, res.findings, str(_path(ctx)))
    return res


def identity_match(ctx: Context, *, file: Path) -> StepResult:
    """`exl3tool identity --check FILE PATH`: every differing tensor, layer and root."""
    from exl3tool.identity.compare import check, load_record, problem_findings

    res = StepResult()
    if not file.is_file():
        res.findings.add(GT_IDENTITY_FILE, f"{file}: no such file", file=str(file))
        return res
    rec = load_record(file, res.findings)
    if rec is None:
        return res
    compat = None if rec.get("compatibility") else False
    ident = _identity(ctx, rec["algorithm"], rec.get("selection"), compat)
    label = str(_path(ctx))
    problem_findings(ident, res.findings, label)
    check(rec, ident, res.findings, label)
    res.extra.update(_identity_extra(ident))
    res.extra["identity_file"] = str(file)
    return res


def _failed(res: StepResult, exc: Any, rule: Any, what: str, ctx: Context) -> StepResult:
    """An exception that carries findings: keep them, and say which step they stopped."""
    res.findings.extend(exc.findings)
    res.findings.add(rule, f"{what}: {exc}", file=str(_path(ctx)))
    return res


def slice_verify(ctx: Context, *, tp: int) -> StepResult:
    """`exl3tool slice PATH --tp N --dry-run`, then `slice --verify` into a removed temp dir."""
    from exl3tool.tp.run import SliceOptions, slice_artifact
    from exl3tool.tp.slices import PlanRefused
    from exl3tool.tp.writer import SliceFailed

    res = StepResult()
    what = f"slice --tp {tp}"
    opts = SliceOptions(tp, verify=True, threads=ctx.threads)
    try:
        planned = slice_artifact(_path(ctx), None, opts)  # the plan alone refuses bad splits
        res.findings.extend(planned.findings)
        with temp_dir(ctx, f"slice-tp{tp}") as work:
            done = slice_artifact(_path(ctx), Path(work) / "slices", opts)
            res.findings.extend(done.findings)
    except (PlanRefused, SliceFailed) as exc:
        return _failed(res, exc, GT_SLICE_VERIFY, what, ctx)
    return res


def stage(ctx: Context, *, tp: int) -> StepResult:
    """`exl3tool stage-cartridge ADAPTER --base BASE --tp N -o TMP` (removed afterwards)."""
    from exl3tool.staging.stage import StageError, stage_cartridge

    assert ctx.target.base is not None  # plan() stages only a matched cartridge
    res = StepResult()
    try:
        with temp_dir(ctx, f"stage-tp{tp}") as work:
            done = stage_cartridge(
                _path(ctx), ctx.target.base, out=Path(work) / "staged", tp=tp, threads=ctx.threads
            )
            res.findings.extend(done.findings)
    except StageError as exc:
        return _failed(res, exc, GT_STEP_FAILED, f"stage-cartridge --tp {tp}", ctx)
    return res


def _skip(res: StepResult, ctx: Context, what: str, why: str) -> StepResult:
    msg = f"{ctx.target.label}: {what} skipped: {why}"
    # a whole declared check not run is a warning (the gate did not check what its config asks
    # for; --strict fails it); a sub-check skipped inside a run stays the rule's info
    res.findings.add(GT_SKIPPED, msg, file=str(_path(ctx)), severity=Severity.WARNING)
    res.notes.append(msg)
    res.status = "skipped"
    return res


def swap_unavailable(device: str, tp: int) -> str | None:
    """Why verify-swap cannot run here (None when it can): torch, torch.distributed, CUDA."""
    try:
        import torch
    except ImportError:
        return "torch is not installed (pip install 'exl3tool[runtime]')"
    if device == "cuda":
        if not torch.cuda.is_available():
            return "CUDA is not available on this machine"
        if torch.cuda.device_count() < tp:
            return (
                f"--tp {tp} needs {tp} CUDA devices, this machine has {torch.cuda.device_count()}"
            )
    if tp > 1:
        import torch.distributed as dist

        if not dist.is_available():
            return "torch.distributed is not available in this torch build"
        if device == "cpu" and not dist.is_gloo_available():
            return "torch.distributed has no gloo backend in this torch build"
        if device == "cuda" and not dist.is_nccl_available():
            return "torch.distributed has no NCCL backend in this torch build"
    return None


def verify_swap(ctx: Context, *, tp: int) -> StepResult:
    """`exl3tool verify-swap BASE ADAPTER --tp N --device D`; every failed check is a GT011."""
    res = StepResult()
    what = f"verify-swap --tp {tp} --device {ctx.device}"
    why = swap_unavailable(ctx.device, tp)
    if why is not None:
        return _skip(res, ctx, what, why)
    from exl3tool.runtime.verify import VerifyOptions, run_verify

    assert ctx.target.base is not None  # plan() runs verify-swap only for a matched cartridge
    with temp_dir(ctx, "swap") as work:
        rep = run_verify(
            VerifyOptions(
                base=ctx.target.base,
                adapter=_path(ctx),
                tp=tp,
                device=ctx.device,
                work_dir=Path(work),
            )
        )
    label = str(_path(ctx))
    skipped = []
    for c in rep.checks:
        if c.passed is False:
            where = f"; first difference {c.first_difference}" if c.first_difference else ""
            size = f" (max |diff| {c.max_abs:g})" if c.max_abs is not None else ""
            res.findings.add(
                GT_VERIFY_SWAP, f"{what}: {c.name}: {c.detail}{size}{where}", file=label
            )
        elif c.passed is None:
            skipped.append(f"{c.name} ({c.detail})")
    if skipped:
        msg = f"{ctx.target.label}: {what}: checks skipped: {'; '.join(skipped)}"
        res.findings.add(GT_SKIPPED, msg, file=label)
        res.notes.append(msg)
    res.extra.setdefault("verify_swap", {})[str(tp)] = {
        "passed": rep.passed,
        "checks": len(rep.checks),
        "seconds": round(rep.timings.get("total", 0.0), 3),
    }
    return res


ACTIONS: dict[str, Callable[..., StepResult]] = {
    "validate": validate,
    "identity_root": identity_root,
    "identity_match": identity_match,
    "slice_verify": slice_verify,
    "stage": stage,
    "verify_swap": verify_swap,
}
