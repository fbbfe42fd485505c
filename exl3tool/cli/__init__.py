"""Typer commands: parse arguments, call one action, render, exit."""

from __future__ import annotations


def entry() -> None:
    """The console entry point: signal handlers first, then the (heavier) command line."""
    from exl3tool.cli import signals

    signals.install()
    try:
        from exl3tool.cli.main import app

        app(prog_name="exl3tool")
    except (KeyboardInterrupt, signals.Interrupted) as exc:
        raise SystemExit(signals.say(exc)) from None
