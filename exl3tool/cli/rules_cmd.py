"""`exl3tool rules`: print the rule catalogue."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from exl3tool.cli.common import check_format, handle_errors
from exl3tool.rules.registry import all_rules


@handle_errors
def rules(
    fmt: Annotated[str, typer.Option("--format", "-f", help="text or json")] = "text",
    family: Annotated[
        str | None, typer.Option(help="Only codes starting with this prefix.")
    ] = None,
) -> None:
    """List every validation rule: code, severity, title, why and fix hint."""
    check_format(fmt, ("text", "json"))
    items = [r for r in all_rules() if not family or r.code.startswith(family.upper())]
    if fmt == "json":
        typer.echo(
            json.dumps(
                [
                    {
                        "code": r.code,
                        "name": r.name,
                        "severity": r.severity.value,
                        "title": r.title,
                        "why": r.why,
                        "hint": r.hint,
                    }
                    for r in items
                ],
                indent=2,
            )
        )
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{len(items)} rules")
    for col in ("code", "severity", "title", "fix"):
        table.add_column(col)
    for r in items:
        table.add_row(r.code, r.severity.value, r.title, r.hint)
    Console().print(table)
