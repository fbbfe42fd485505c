"""`exl3tool stage-cartridge ADAPTER --base BASE [--tp N] -o OUT`: a verified, TP-ready copy
of a cartridge, published atomically (the core is `exl3tool.staging`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from exl3tool.actions.counts import check_counts
from exl3tool.actions.inputs import resolve_input
from exl3tool.report.model import ArtifactRef, Report


@dataclass(frozen=True)
class Options:
    adapter: str
    base: str
    out: Path
    tp: int | None = None  # runtime TP size; a full adapter becomes rank-sharded for N > 1
    force: bool = False
    threads: int | None = None


@dataclass(frozen=True)
class StageResult:
    out: Path
    staging: dict[str, Any] | None  # the staging record; None when the adapter was refused
    report: Report  # the refusal's findings (empty when staged)

    def exit_code(self) -> int:
        return 0 if self.staging is not None else 1


def _total_bytes(adapter: Path) -> int:
    """Bytes to copy, for the progress bar (0 when unknown)."""
    path = Path(adapter) / "adapter_config.json"
    try:
        if not path.is_file():  # a FIFO would block; the loader reports it
            return 0
        manifest = json.loads(path.read_bytes())
        return sum(s["size"] for s in manifest["shards"] if type(s.get("size")) is int)
    except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return 0


def run(opts: Options) -> StageResult:
    from exl3tool.io.progress import progress_bar
    from exl3tool.staging.stage import StageError, stage_cartridge

    check_counts(opts.tp, opts.threads)
    adapter, base = resolve_input(opts.adapter), resolve_input(opts.base)
    try:
        with progress_bar(partial(_total_bytes, adapter), "staging") as bar:
            result = stage_cartridge(
                adapter,
                base,
                out=opts.out,
                tp=opts.tp,
                force=opts.force,
                threads=opts.threads,
                progress=bar,
            )
    except StageError as exc:
        changed = [f for f in exc.findings if f.code == "ST023"]
        if changed:  # an input that changed while it was read: exit 3 naming it, as elsewhere
            from exl3tool.io.views import InputChanged

            where = changed[0].location.file or str(adapter)
            raise InputChanged(
                f"{where}: {changed[0].message}; {opts.out} was not created or changed"
            ) from None
        report = Report([ArtifactRef(str(adapter), "cartridge")], exc.findings)
        report.notes.append(f"{exc}; {opts.out} was not created or changed")
        return StageResult(opts.out, None, report)
    return StageResult(result.out, result.staging, Report([ArtifactRef(str(adapter), "cartridge")]))
