"""Human report: a summary table, then findings grouped by file (rich; plain text without
rich where report/plain.py writes the same bytes)."""

from __future__ import annotations

import io
import sys
from collections import defaultdict
from typing import TYPE_CHECKING

from exl3tool.report import plain
from exl3tool.report.model import Report
from exl3tool.rules.registry import Severity

if TYPE_CHECKING:
    from rich.console import Console

_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


def _render(report: Report, console: Console, quiet: bool = False) -> None:
    from rich.markup import escape
    from rich.table import Table

    s = report.summary()
    if not quiet:
        table = Table(title="exl3tool report", show_lines=False)
        table.add_column("artifact")
        table.add_column("kind")
        for key in ("errors", "warnings", "infos"):
            table.add_column(key, justify="right")
        for a in report.artifacts:
            mine = [
                f
                for f in report.findings
                if len(report.artifacts) == 1 or (f.location.file or "").startswith(a.path)
            ]
            counts = {sev: sum(1 for f in mine if f.level is sev) for sev in Severity}
            table.add_row(
                escape(a.path),
                a.kind,
                str(counts[Severity.ERROR]),
                str(counts[Severity.WARNING]),
                str(counts[Severity.INFO]),
            )
        console.print(table)
        for note in report.notes:
            console.print(f"[dim]note:[/dim] {escape(note)}")
    by_file: dict[str, list] = defaultdict(list)
    for f in report.findings:
        if quiet and f.level is not Severity.ERROR:
            continue
        by_file[f.location.file or "(artifact)"].append(f)
    for file, items in by_file.items():
        console.print(f"\n[bold]{escape(file)}[/bold]")
        for f in sorted(items, key=lambda f: (-f.level.rank, f.code)):
            where = " ".join(
                x
                for x in (
                    f.location.tensor and f"tensor {f.location.tensor}",
                    f.location.pointer and f"at {f.location.pointer}",
                )
                if x
            )
            style = _STYLE[f.level]
            console.print(
                f"  [{style}]{f.level.value:7}[/{style}] {f.code} {escape(f.message)}"
                + (f" [dim]({escape(where)})[/dim]" if where else "")
            )
            console.print(f"          [dim]fix: {escape(f.hint)}[/dim]")
    verdict = "FAILED" if s["errors"] else "OK"
    console.print(
        f"\n{verdict}: {s['errors']} errors, {s['warnings']} warnings, {s['infos']} infos"
    )


def to_text(report: Report, color: bool = False) -> str:
    text = None if color else plain.render(report, 80)
    if text is not None:
        return text
    from rich.console import Console

    buf = io.StringIO()
    _render(report, Console(file=buf, color_system=None, width=80, no_color=not color))
    return buf.getvalue()


def print_text(report: Report, quiet: bool = False) -> None:
    width = plain.plain_width(sys.stdout)
    text = None if width is None else plain.render(report, width, quiet)
    if text is not None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    from rich.console import Console

    _render(report, Console(), quiet=quiet)
