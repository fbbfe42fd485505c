"""The `exl3tool` command line. Each command lives in its own module of this package; heavy
imports (torch, the trellis codec) happen inside the commands that need them."""

from __future__ import annotations

import typer

from exl3tool import __version__
from exl3tool.cli import rules_cmd

app = typer.Typer(
    name="exl3tool",
    help="Validate, identify, slice, stage and verify EXL3 checkpoints and MSRT cartridges.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"exl3tool {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """exl3tool: checks and tools for EXL3 / R7 checkpoints and MSRT cartridges."""


app.command("rules")(rules_cmd.rules)
# Commands register below, one line each.


def main() -> None:
    app()
