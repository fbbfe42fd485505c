"""`exl3tool check`: the pre-publish gate, every declared check in one report.

The checks come from an exl3tool.toml (or a pyproject.toml `[tool.exl3tool]`), or are inferred
from each PATH's kind; the gate itself is `actions/gate` (plan, run, steps).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exl3tool.io.fs import exists
from exl3tool.report.model import Report
from exl3tool.rules.errors import InputError, UsageError
from exl3tool.rules.registry import Findings


@dataclass(frozen=True)
class Options:
    paths: tuple[str, ...] = ()  # directories, files inside one, or org/name[@revision]
    config: Path | None = None  # default: ./exl3tool.toml (or ./pyproject.toml) without PATHs
    quiet: bool = False
    selection: Any = None  # a rules.selection.RuleSelection on top of the config's


@dataclass(frozen=True)
class CheckResult:
    report: Report
    strict: bool  # the config asks for warnings to fail too


def _dedup(pairs: list[tuple[str, Path | None]]) -> list[tuple[str, Path | None]]:
    """One entry per artifact directory (pre-commit passes several files of one artifact)."""
    seen: set[Path] = set()
    out = []
    for arg, path in pairs:
        key = path.resolve() if path is not None else None
        if key is not None and key in seen:
            continue
        if key is not None:
            seen.add(key)
        out.append((arg, path))
    return out


def _config(opts: Options, findings: Findings, notes: list[str]) -> tuple[Any, Path | None]:
    """The gate config: loaded, with PATH arguments inferred into it."""
    from exl3tool.actions.gate import config as gate_config
    from exl3tool.actions.gate.infer import infer
    from exl3tool.actions.gate.run import resolve_arg
    from exl3tool.io.hf_cache import parse_hf_id

    source = opts.config
    if source is None and not opts.paths:
        source = gate_config.discover(Path("."))
        if source is None:
            raise UsageError(
                "nothing to check: give PATH arguments or --config, or put an exl3tool.toml here"
            )
    cfg = gate_config.load_config(source, findings) if source is not None else None
    if opts.paths:
        resolved = []
        for arg in opts.paths:
            if not exists(Path(arg).expanduser()) and parse_hf_id(arg) is None:
                raise InputError(f"{arg}: no such file or directory")
            resolved.append((arg, resolve_arg(arg, Path.cwd(), Findings())))
        inferred = infer(_dedup(resolved), cfg)
        cfg = inferred.config
        notes += inferred.notes
    assert cfg is not None
    if not cfg.artifacts and not findings:
        raise UsageError(f"{source}: no artifacts declared and no PATH given")
    if source is not None:
        notes.insert(0, f"config: {source}")
    return cfg, source


def run(opts: Options, on_step: Callable[[str], None] | None = None) -> CheckResult:
    """Run every check into one report; `on_step` hears the name of each step as it starts."""
    from exl3tool.actions.gate.run import run_check
    from exl3tool.io import progress

    progress.set_quiet(opts.quiet)
    findings = Findings()
    notes: list[str] = []
    cfg, _source = _config(opts, findings, notes)
    if opts.selection is not None and hasattr(cfg, "rules"):
        cfg = dataclasses.replace(cfg, rules=cfg.rules.overridden_by(opts.selection))
    report = run_check(cfg, findings, notes, on_step=on_step)
    return CheckResult(report, cfg.strict)


def progress_enabled() -> bool:
    """Whether a status line would be drawn (a TTY, not --quiet, not EXL3TOOL_NO_PROGRESS)."""
    from exl3tool.io import progress

    return progress.enabled()
