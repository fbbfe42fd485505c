"""The `exl3tool` command line. Each command lives in its own module of this package, imported
only when that command is looked up; heavy imports (torch, the trellis codec) happen inside the
commands that need them."""

from __future__ import annotations

from typing import ClassVar

import typer

from exl3tool import __version__
from exl3tool.cli.common import EXIT_HELP
from exl3tool.cli.lazy import LazyGroup


class Commands(LazyGroup):
    """The commands, in the order a publisher meets them; each module is imported when its
    command is looked up (run, its --help, or `exl3tool --help`)."""

    table: ClassVar[dict[str, str]] = {
        "validate": "exl3tool.cli.validate:validate",
        "inspect": "exl3tool.cli.inspect:inspect",
        "plan": "exl3tool.cli.plan:plan",
        "identity": "exl3tool.cli.identity:identity",
        "diff": "exl3tool.cli.diff:diff",
        "stage-cartridge": "exl3tool.cli.stage:stage_cartridge",
        "slice": "exl3tool.cli.slice:slice_cmd",
        "verify-swap": "exl3tool.cli.verify_swap:verify_swap",
        "decode": "exl3tool.cli.decode:decode",
        "check": "exl3tool.cli.check:check",
        "rules": "exl3tool.cli.rules_cmd:rules",
    }


app = typer.Typer(
    name="exl3tool",
    help="Validate, identify, slice, stage and verify EXL3 checkpoints and MSRT cartridges.",
    epilog=EXIT_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=Commands,
    context_settings={"help_option_names": ["-h", "--help"]},  # subcommands inherit it
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


def main() -> None:
    """Kept for the `exl3tool.cli.main:main` entry point of older installs."""
    from exl3tool.cli import entry

    entry()
