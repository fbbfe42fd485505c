"""The per-artifact summary table `exl3tool check` prints after its text report."""

from __future__ import annotations

import io
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from exl3tool.report.model import Report


def checks_count(checks: list[dict[str, Any]]) -> str:
    """`4 ok`, `3 ok, 1 FAIL`, `2 ok, 1 skipped`."""
    n = {k: sum(1 for c in checks if c["status"] == k) for k in ("pass", "fail", "skipped")}
    parts = [f"{n['pass']} ok"] + [
        f"{n[k]} {w}" for k, w in (("fail", "FAIL"), ("skipped", "skipped")) if n[k]
    ]
    return ", ".join(parts) if checks else "none"


def checks_line(label: str, checks: list[dict[str, Any]]) -> str:
    """`k3k4: validate --hash ok · stage --tp 2 FAIL · ...` (every check run, in order)."""
    mark = {"pass": "ok", "fail": "FAIL", "skipped": "skipped"}
    return f"{label}: " + (
        " · ".join(f"{c['name']} {mark.get(c['status'], c['status'])}" for c in checks)
        or "no checks"
    )


def table(report: Report) -> Table:
    t = Table(title="exl3tool check: summary", box=box.SIMPLE_HEAD)
    for col, just in (
        ("artifact", "left"),
        ("kind", "left"),
        ("errors", "right"),
        ("warnings", "right"),
        ("identity root", "left"),
        ("checks run", "left"),
        ("time", "right"),
    ):
        t.add_column(col, justify=just, no_wrap=col != "artifact")  # type: ignore[arg-type]
    for a in report.artifacts:
        x = a.extra
        root = x.get("identity_root")
        t.add_row(
            escape(str(x.get("name", a.path))),
            a.kind,
            str(x.get("errors", "-")),
            str(x.get("warnings", "-")),
            f"{root[:12]}…" if root else "-",
            checks_count(x.get("checks", [])),
            f"{x['seconds']:.2f} s" if "seconds" in x else "-",
        )
    return t


def _render(report: Report, console: Console) -> None:
    console.print(table(report))
    for a in report.artifacts:
        label = str(a.extra.get("name", a.path))
        console.print(escape(checks_line(label, a.extra.get("checks", []))), highlight=False)


def to_text(report: Report) -> str:
    buf = io.StringIO()
    _render(report, Console(file=buf, color_system=None, width=80, no_color=True))
    return buf.getvalue()


def print_table(report: Report) -> None:
    _render(report, Console())  # rich honours NO_COLOR and plain pipes
