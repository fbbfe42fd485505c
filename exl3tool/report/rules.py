"""`exl3tool rules` as a text table (rule text is printed literally: `[begin, end]` and
`exl3tool[hf]` are not rich markup)."""

from __future__ import annotations

from exl3tool.rules.registry import Rule


def print_rules(rules: list[Rule]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"{len(rules)} rules")
    table.add_column("code", no_wrap=True)
    table.add_column("severity", no_wrap=True)
    table.add_column("title", overflow="fold")
    table.add_column("fix", overflow="fold")
    family = None
    for r in rules:
        if r.family != family:  # a heading row per family, titled from rules/families.py
            family = r.family
            table.add_row(family, "", escape(r.family_title), "", style="bold")
        table.add_row(r.code, r.severity.value, escape(r.title), escape(r.hint))
    Console().print(table)
