"""The `exl3tool` command line. Each command lives in its own module of this package; heavy
imports (torch, the trellis codec) happen inside the commands that need them."""

from __future__ import annotations

import typer

from exl3tool import __version__
from exl3tool.cli import check as check_cmd
from exl3tool.cli import decode as decode_cmd
from exl3tool.cli import diff as diff_cmd
from exl3tool.cli import identity as identity_cmd
from exl3tool.cli import inspect as inspect_cmd
from exl3tool.cli import plan as plan_cmd
from exl3tool.cli import rules_cmd
from exl3tool.cli import slice as slice_cmd
from exl3tool.cli import stage as stage_cmd
from exl3tool.cli import validate as validate_cmd
from exl3tool.cli import verify_swap as verify_swap_cmd
from exl3tool.cli.common import EXIT_HELP

app = typer.Typer(
    name="exl3tool",
    help="Validate, identify, slice, stage and verify EXL3 checkpoints and MSRT cartridges.",
    epilog=EXIT_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
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


# In the order a publisher meets them.
app.command("validate")(validate_cmd.validate)
app.command("inspect")(inspect_cmd.inspect)
app.command("plan")(plan_cmd.plan)
app.command("identity")(identity_cmd.identity)
app.command("diff")(diff_cmd.diff)
app.command("stage-cartridge")(stage_cmd.stage_cartridge)
app.command("slice")(slice_cmd.slice_cmd)
app.command("verify-swap")(verify_swap_cmd.verify_swap)
app.command("decode")(decode_cmd.decode)
app.command("check")(check_cmd.check)
app.command("rules")(rules_cmd.rules)


def main() -> None:
    """Kept for the `exl3tool.cli.main:main` entry point of older installs."""
    from exl3tool.cli import entry

    entry()
