"""What every command shares: the error -> exit code handling and the common options.

The CLI imports only `exl3tool.actions`, `exl3tool.report`, `exl3tool.rules` and the version;
heavier modules are imported inside the commands, so `exl3tool --help` stays fast.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import typer

from exl3tool.rules.errors import Exl3ToolError, Interrupted

F = TypeVar("F", bound=Callable[..., Any])

# The exit codes of README "Exit codes" (their numbers: exl3tool.actions.errors).
EXIT_HELP = (
    "Exit codes: 0 clean, 1 findings, 2 usage error or missing extra, 3 unreadable input, "
    "130 interrupted (Ctrl-C), 143 terminated (SIGTERM), 141 stdout's reader has gone."
)

REPORT_FORMATS = ("text", "json", "sarif", "junit")
ARTIFACT_HELP = "a path, or org/name\\[@revision] in the local Hugging Face cache"


def _format_help(choices: tuple[str, ...], what: str = "Output format") -> Any:
    return typer.Option("--format", "-f", help=f"{what}: {', '.join(choices)}.")


# Literal choices: typer lists them in --help and in the error for a wrong one (exit 2).
FormatOpt = Annotated[Literal["text", "json", "sarif", "junit"], _format_help(REPORT_FORMATS)]
TextJsonOpt = Annotated[Literal["text", "json"], _format_help(("text", "json"))]
OutputOpt = Annotated[
    Path | None,
    typer.Option(
        "--output", "-o", help="Write the report to this file (atomically) instead of stdout."
    ),
]
ForceOpt = Annotated[bool, typer.Option("--force", help="Replace an existing output.")]


def fail(message: str, code: int) -> None:
    sys.stderr.write(f"exl3tool: {message}\n")
    raise typer.Exit(code)


def handle_errors(fn: F) -> F:
    """Turn exl3tool's user-facing errors, signals and a file that could not be read (OSError:
    exit 3) into a one-line message and their exit code (the mapping is `actions.errors`,
    shared with the gate)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except BrokenPipeError:
            raise  # stdout's reader has gone: the entry point's exit 141 (cli/streams)
        except (Exl3ToolError, KeyboardInterrupt, Interrupted, OSError) as exc:
            from exl3tool.actions import errors

            fail(errors.message(exc), errors.exit_code(exc))

    return wrapper  # type: ignore[return-value]


SelectOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--select",
        metavar="CODE[,CODE...]",
        help="Report only these rules: codes or families (R7, CA) or ALL; repeatable.",
        show_default=False,
    ),
]
IgnoreOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--ignore",
        metavar="CODE[,CODE...]",
        help="Do not report these rules (codes or families); repeatable.",
        show_default=False,
    ),
]
SeverityOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--severity",
        metavar="CODE=LEVEL",
        help="Report a rule (or family) at error, warning or info; repeatable.",
        show_default=False,
    ),
]


def rule_selection(
    select: list[str] | None, ignore: list[str] | None, severity: list[str] | None
) -> Any:
    """The RuleSelection of --select/--ignore/--severity (None when none is given)."""
    if not (select or ignore or severity):
        return None
    from exl3tool.rules.selection import RuleSelection

    return RuleSelection.from_options(select or (), ignore or (), severity or ())
