"""`run_check`: every check a release declares, in one process, into one report.

Planning is pure (`plan`: which checks run on which artifact, from the config and the detected
kinds); `run_check` then runs the plan, step by step, through the library functions of the other
commands (`gate/steps.py`), and records a per-artifact summary in `ArtifactRef.extra`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exl3tool.actions.errors import message
from exl3tool.actions.gate import hf
from exl3tool.actions.gate import steps as gate_steps
from exl3tool.actions.gate.config import ArtifactSpec, GateConfig
from exl3tool.actions.gate.context import Context, StepResult, Target
from exl3tool.actions.gate.infer import artifact_dir, default_role, sliced_tp
from exl3tool.formats.detect import detect
from exl3tool.io.fs import exists
from exl3tool.report.model import ArtifactRef, Report
from exl3tool.rules.check import (
    GT_ARTIFACT_MISSING,
    GT_BASE_UNKNOWN,
    GT_KIND_MISMATCH,
    GT_NO_BASE,
    GT_NOT_APPLICABLE,
    GT_STEP_FAILED,
)
from exl3tool.rules.registry import Finding, Findings, Severity


def resolve_arg(arg: str, root: Path, findings: Findings) -> Path | None:
    """A local path for `arg`: itself when it exists, else a cached HF snapshot, else None."""
    ref = hf.parse_hf_id(arg) if not Path(arg).is_absolute() else None
    local = _display(Path(arg).expanduser(), root)
    if exists(local) or ref is None:
        if not exists(local):
            findings.add(GT_ARTIFACT_MISSING, f"{arg}: no such file or directory", file=arg)
            return None
        return artifact_dir(local) if local.name != "adapter_config.json" else local.parent
    looked_up = Findings()
    found = hf.resolve(ref, looked_up)
    if found is None and local.parent != Path(".") and local.parent.is_dir():
        # `models/x` beside a local models/: a path with a typo, not an uncached Hub id
        findings.add(
            GT_ARTIFACT_MISSING,
            f"{arg}: no such file or directory (nor a cached Hugging Face snapshot)",
            file=arg,
        )
        return None
    findings.extend(looked_up)
    return found


def _display(path: Path, root: Path) -> Path:
    """`path` (relative to `root`) as the user sees it: relative to the cwd when inside it, so
    that reports and SARIF locations stay repository-relative."""
    if not path.is_absolute():
        path = root / path
    try:
        return (
            Path(os.path.relpath(path))
            if path.resolve().is_relative_to(Path.cwd().resolve())
            else path
        )
    except (OSError, ValueError):
        return path


@dataclass(frozen=True)
class Step:
    name: str
    action: str  # key into steps.ACTIONS
    args: dict[str, Any] = field(default_factory=dict)


def _swap_sizes(value: bool | tuple[int, ...] | None) -> tuple[int, ...]:
    if value is None or value is False:
        return ()
    return (1,) if value is True else tuple(value)


def resolve_targets(cfg: GateConfig, findings: Findings) -> list[Target]:
    """Resolve paths, kinds, roles and cartridge bases; problems become findings."""
    paths: dict[str, Path | None] = {}
    kinds: dict[str, str] = {}
    for spec in cfg.artifacts:
        here = Findings()
        p = resolve_arg(spec.path, cfg.root, here)
        for f in here:
            findings.extend([_relabel(f, spec)])
        paths[spec.label] = p
        kinds[spec.label] = detect(p).value if p is not None else "unknown"
    out: list[Target] = []
    for spec in cfg.artifacts:
        kind = kinds[spec.label]
        path = paths[spec.label]
        if path is not None and spec.kind and spec.kind != kind:
            findings.add(
                GT_KIND_MISMATCH,
                f"{spec.label} is declared {spec.kind} but the files say {kind}",
                file=str(path),
            )
        role = spec.role or default_role(spec.kind or kind)
        base_path, base_label = None, None
        if role == "cartridge" and path is not None:
            if spec.base:
                if spec.base in paths:
                    base_path, base_label = paths[spec.base], spec.base
                else:
                    here = Findings()
                    base_path = resolve_arg(spec.base, cfg.root, here)
                    base_label = spec.base
                    if base_path is None:
                        findings.add(
                            GT_BASE_UNKNOWN,
                            f"{spec.label}: base {spec.base!r} is neither a declared artifact "
                            f"nor a path ({'; '.join(f.message for f in here)})",
                            file=str(path),
                        )
            else:
                findings.add(
                    GT_NO_BASE,
                    f"{spec.label}: cartridge checked without a base; base matching and "
                    "verify-swap did not run",
                    file=str(path),
                )
        swap = _swap_sizes(spec.verify_swap if spec.verify_swap is not None else cfg.verify_swap)
        if swap and role != "cartridge" and spec.verify_swap is not None and path is not None:
            findings.add(
                GT_NOT_APPLICABLE,
                f"{spec.label}: verify_swap asked of a {kind}; it applies to cartridges only",
                file=str(path),
            )
        out.append(
            Target(
                label=spec.label,
                source=spec.path,
                path=path,
                kind=kind,
                role=role,
                base=base_path,
                base_label=base_label,
                hash=cfg.hash if spec.hash is None else spec.hash,
                identity=cfg.resolve(spec.identity) if spec.identity else None,
                tp=spec.tp if spec.tp is not None else cfg.tp,
                verify_swap=swap if role == "cartridge" and base_path is not None else (),
                sliced_for=sliced_tp(path, kind) if path is not None else None,
            )
        )
    return out


def _relabel(f: Finding, spec: ArtifactSpec) -> Finding:
    """Point a resolution finding at the config's artifact name when it has none."""
    from dataclasses import replace

    from exl3tool.rules.registry import Location

    loc = f.location if f.location.file else Location(spec.label, None, None)
    return replace(f, location=loc)


def plan(t: Target) -> list[Step]:
    """Which checks run on `t`, in order (pure)."""
    if t.path is None:
        return []
    steps = [Step("validate --hash" if t.hash else "validate", "validate", {"hash": t.hash})]
    if t.identity is not None:
        steps.append(Step("identity --check", "identity_match", {"file": t.identity}))
    elif t.hash:
        steps.append(Step("identity root", "identity_root"))
    for n in t.tp:
        steps.append(Step(f"validate --tp {n}", "validate", {"hash": False, "tp": n}))
        if t.sliced_for is None:  # an artifact sliced already is checked at its size only
            steps.append(Step(f"slice-verify --tp {n}", "slice_verify", {"tp": n}))
    if t.role == "cartridge" and t.base is not None:
        for n in t.tp or (1,):
            steps.append(Step(f"stage --tp {n}", "stage", {"tp": n}))
        for n in t.verify_swap:
            steps.append(Step(f"verify-swap --tp {n}", "verify_swap", {"tp": n}))
    return steps


def _run_step(step: Step, ctx: Context) -> StepResult:
    fn: Callable[..., StepResult] = gate_steps.ACTIONS[step.action]
    try:
        return fn(ctx, **step.args)
    except Exception as exc:  # a bug in a step must fail the gate, not pass it or crash it
        res = StepResult()
        res.findings.add(GT_STEP_FAILED, f"{step.name}: {message(exc)}", file=str(ctx.target.path))
        return res


def _key(f: Finding) -> tuple[Any, ...]:
    loc = f.location
    return (f.code, f.message, loc.file, loc.tensor, loc.pointer, f.level)


def _selected(cfg: GateConfig, findings: Iterable[Finding]) -> Findings:
    """The findings the config's (and the command line's) rule selection reports."""
    rules = getattr(cfg, "rules", None)
    if rules is None or rules.is_default:
        return Findings(findings)
    return rules.apply(findings)


ProgressFn = Callable[[str], None]


def run_check(
    cfg: GateConfig,
    findings: Findings | None = None,
    notes: list[str] | None = None,
    *,
    on_step: ProgressFn | None = None,
) -> Report:
    """Run every declared check; `findings`/`notes` carry what config loading produced."""
    report = Report(findings=Findings(findings or ()), notes=list(notes or ()))
    if any(f.code == "GT001" for f in report.findings):
        report.notes.append("exl3tool.toml is invalid: no artifact was checked")
        return report
    resolution = Findings()
    targets = resolve_targets(cfg, resolution)
    tmp_root = cfg.resolve(cfg.tmp_dir) if cfg.tmp_dir else None
    consumed: list[Finding] = []
    for t in targets:
        started = time.perf_counter()
        mine = [f for f in resolution if f.location.file in (t.label, t.source, str(t.path))]
        consumed.extend(mine)
        own = _selected(cfg, mine)
        seen = {_key(f) for f in own}
        checks: list[dict[str, Any]] = []
        extra: dict[str, Any] = {"name": t.label, "role": t.role, "kind": t.kind}
        if t.source != str(t.path):
            extra["source"] = t.source
        if t.base_label:
            extra["base"] = t.base_label
        ctx = Context(t, cfg.threads, tmp_root, cfg.device)
        for step in plan(t):
            if on_step:
                on_step(f"{t.label}: {step.name}")
            t0 = time.perf_counter()
            res = _run_step(step, ctx)
            res.findings = _selected(cfg, res.findings)
            for f in res.findings:
                if _key(f) not in seen:  # validate runs again per TP size
                    seen.add(_key(f))
                    own.extend([f])
            status = res.status or ("fail" if res.findings.has_errors() else "pass")
            checks.append(
                {"name": step.name, "status": status, "seconds": round(time.perf_counter() - t0, 3)}
            )
            extra.update(res.extra)
            report.notes.extend(res.notes)
        extra["checks"] = checks
        extra["errors"] = own.count(Severity.ERROR)
        extra["warnings"] = own.count(Severity.WARNING)
        extra["seconds"] = round(time.perf_counter() - started, 3)
        extra.setdefault("identity_root", None)
        report.artifacts.append(ArtifactRef(str(t.path) if t.path else t.source, t.kind, extra))
        report.add_findings(own)
    leftover = [f for f in resolution if not any(f is g for g in consumed)]
    report.add_findings(_selected(cfg, leftover))
    return report
