"""`exl3tool verify-swap` as text: the checks table and the quality ladder."""

from __future__ import annotations

import io
import sys
from typing import Any

_RESULT = {True: "[green]PASS[/]", False: "[red]FAIL[/]", None: "[yellow]SKIP[/]"}


def _f(v: float | None) -> str:
    return "" if v is None else f"{v:.3g}"


def _checks(report: Any) -> Any:
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=f"verify-swap: TP={report.tp}, device {report.device}, layers {report.layers}")
    for col in ("check", "result", "max_abs", "detail"):
        t.add_column(col, overflow="fold")
    for c in report.checks:
        detail = c.detail
        if c.first_difference:
            fd = c.first_difference
            detail += (
                f"\nfirst difference: {fd.get('where')} at {fd.get('index')}: "
                f"got {fd.get('got')}, want {fd.get('want')}"
            )
        t.add_row(c.name, _RESULT[c.passed], _f(c.max_abs), escape(detail))
    return t


def _quality(report: Any) -> Any:
    from rich.table import Table

    q = Table(title="quality ladder (max over experts and projections)")
    for col in ("layer", "stage", "K", "experts", "‖c_s‖/‖W_0‖", "vs next", "vs dense", "ok"):
        q.add_column(col)
    for r in report.quality:
        q.add_row(
            str(r["layer"]),
            r["label"],
            str(r["k"]),
            str(r["experts"]),
            _f(r["correction_ratio_max"]),
            _f(r["rel_to_next_max"]),
            _f(r["rel_to_dense_max"]),
            "yes" if r["passed"] else "[red]no[/]",
        )
    return q


def render_text(report: Any, width: int = 80) -> str:
    """The checks table (and the quality ladder), `width` columns wide."""
    from rich.console import Console
    from rich.markup import escape

    console = Console(record=True, width=width, file=io.StringIO())
    console.print(_checks(report))
    if report.quality:
        console.print(_quality(report))
    timings = ", ".join(f"{k} {v:.2f}s" for k, v in report.timings.items())
    console.print(f"time: {timings}")
    for n in report.notes:
        console.print(f"note: {escape(n)}")
    console.print("[green]all checks passed[/]" if report.passed else "[red]some checks FAILED[/]")
    return console.export_text(styles=sys.stdout.isatty())
