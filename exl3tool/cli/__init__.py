"""Typer commands: parse arguments, call one action, render, exit."""

from __future__ import annotations

import gc
import sys


def _wants_help(args: list[str]) -> bool:
    """Whether typer will render help (no arguments, or -h/--help anywhere)."""
    return not args or "-h" in args or "--help" in args


def entry() -> None:
    """The console entry point: signal handlers first, then the (heavier) command line."""
    from exl3tool.cli import signals, streams

    signals.install()
    streams.prepare()
    try:
        gc.disable()  # the start-up imports make ~40k long-lived objects and no garbage
        try:
            command = None
            if sys.argv[1:2] in (
                ["identity"],
                ["validate"],
            ):  # hot commands: plain lines skip typer
                from exl3tool.cli.plain import plain_command

                command = plain_command(sys.argv[1:])
            if command is None:
                if _wants_help(sys.argv[1:]):
                    from exl3tool.cli.lean_rich import import_rich_utils

                    import_rich_utils()  # typer's help renderer, ~40 ms lighter (same output)
                from exl3tool.cli.main import app
        finally:
            gc.freeze()  # the command's collections need not walk them again
            gc.enable()
        if command is not None:
            code = command()
            streams.flush()
            raise SystemExit(code)
        try:
            app(prog_name="exl3tool")
        finally:
            streams.flush()
    except (KeyboardInterrupt, signals.Interrupted) as exc:
        raise SystemExit(signals.say(exc)) from None
    except BrokenPipeError:
        raise SystemExit(streams.reader_gone()) from None
    except SystemExit as exc:  # click and rich end with 1 when stdout's reader has gone
        if isinstance(exc.__context__, BrokenPipeError) and exc.code == 1:
            raise SystemExit(streams.reader_gone()) from None
        late = signals.received()  # a Ctrl-C the command went on past (signals.received)
        if late is not None and exc.code not in (128 + late, 130, 143):  # not yet said
            raise SystemExit(signals.say(signals.Interrupted(late))) from None
        raise
    finally:
        try:
            signals.finish()
        except signals.Interrupted as exc:  # received as the command ended: said, not a traceback
            signals.finish()  # ignored from here, as after a quiet finish
            raise SystemExit(signals.say(exc)) from None
        # The process ends here. Interpreter shutdown runs full collections that walk every
        # object the imports made (~15 ms of a short command); frozen ones are skipped.
        # Reference counting still frees them; stdout and stderr are flushed as always.
        gc.freeze()
