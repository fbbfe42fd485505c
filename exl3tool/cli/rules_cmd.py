"""`exl3tool rules`: print the rule catalogue."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from exl3tool.cli.common import TextJsonOpt, handle_errors


@handle_errors
def rules(
    fmt: TextJsonOpt = "text",
    family: Annotated[
        str | None,
        typer.Option(help="Only this family (R7, CA ...) or code prefix; unknown: exit 2."),
    ] = None,
) -> None:
    """List every validation rule: code, severity, title, why and fix hint."""
    from exl3tool.actions import rules as action

    items = action.run(action.Options(family))
    if fmt == "json":
        typer.echo(json.dumps(action.to_json(items), indent=2))
        return
    from exl3tool.report.rules import print_rules

    print_rules(items)
