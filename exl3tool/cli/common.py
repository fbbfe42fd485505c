"""What every command shares: the error -> exit code mapping and common options."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from exl3tool.rules.errors import Exl3ToolError, Interrupted

F = TypeVar("F", bound=Callable[..., Any])

# Exit codes (README): 0 clean, 1 findings/errors, 2 usage error, 3 input cannot be read.
EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_INPUT = 0, 1, 2, 3

FormatOpt = Annotated[
    str, typer.Option("--format", "-f", help="Output format: text, json, sarif or junit.")
]
OutputOpt = Annotated[
    Path | None, typer.Option("--output", help="Write the report to this file instead of stdout.")
]


def fail(message: str, code: int) -> None:
    sys.stderr.write(f"exl3tool: {message}\n")
    raise typer.Exit(code)


def handle_errors(fn: F) -> F:
    """Turn exl3tool's user-facing errors and signals into a one-line message and their exit
    code (the mapping is `actions.errors`, shared with the gate)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from exl3tool.actions import errors

        try:
            return fn(*args, **kwargs)
        except (Exl3ToolError, KeyboardInterrupt, Interrupted) as exc:
            fail(errors.message(exc), errors.exit_code(exc))
        except BrokenPipeError:
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


def check_format(fmt: str, allowed: tuple[str, ...] = ("text", "json", "sarif", "junit")) -> str:
    if fmt not in allowed:
        fail(f"unknown --format {fmt!r}; choose one of {', '.join(allowed)}", EXIT_USAGE)
    return fmt
