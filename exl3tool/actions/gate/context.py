"""What a gate step gets (`Context`: the resolved artifact and settings) and gives back
(`StepResult`). Shared by the planner/runner (`run.py`) and the steps (`steps.py`)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from exl3tool.rules.errors import interrupts_deferred
from exl3tool.rules.registry import Findings


@dataclass(frozen=True)
class Target:
    """A resolved artifact and the checks asked of it."""

    label: str
    source: str  # what the config or command line wrote
    path: Path | None
    kind: str
    role: str
    base: Path | None = None
    base_label: str | None = None
    hash: bool = True
    identity: Path | None = None
    tp: tuple[int, ...] = ()
    verify_swap: tuple[int, ...] = ()
    sliced_for: int | None = None  # already rank-sliced / rank-sharded for this TP size


@dataclass
class StepResult:
    """What one step gives back; `status` is pass, fail or skipped."""

    findings: Findings = field(default_factory=Findings)
    status: str | None = None  # None: pass/fail from the findings
    extra: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Context:
    target: Target
    threads: int | None
    tmp_dir: Path | None
    device: str = "cpu"


class _Scratch(tempfile.TemporaryDirectory):  # type: ignore[type-arg]
    """A TemporaryDirectory whose removal an interrupt does not cut short (it is raised once
    the tree is gone)."""

    def cleanup(self) -> None:
        with interrupts_deferred():
            super().cleanup()


def temp_dir(ctx: Context, prefix: str) -> tempfile.TemporaryDirectory[str]:
    """A scratch directory for slices and staged copies, removed when the step ends."""
    return _Scratch(prefix=f"exl3tool-check-{prefix}-", dir=ctx.tmp_dir)
