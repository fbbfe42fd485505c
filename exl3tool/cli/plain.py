"""Plain invocations of the hot commands, run without typer.

typer and its vendored click take ~25 ms to import and build a command, about half of a
short command's fixed cost. `plain_command(argv)` recognises the common plain forms of
`exl3tool identity PATH [options]` (each option at most once, as separate words, every value
one that typer would accept unchanged) and returns the command to run; for anything else
(help, `--opt=value`, a value typer would reject or convert, an unknown option, a repeated
one, `--`, shell completion) it returns None and typer parses the line as always, with its
own messages and exit codes. A plain run calls the same body as the typer command (`identity_body`) and maps errors
to the same one-line messages and exit codes (`handle_errors` in cli/common.py), so outputs,
files and exit codes are the same both ways (tests/cli/test_plain_lines.py runs both).

This module imports neither typer nor rich.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from exl3tool.rules.errors import Exl3ToolError, Interrupted


def error_code(exc: BaseException) -> int:
    """`handle_errors`' mapping: write the one line for `exc`, return its exit code."""
    from exl3tool.actions import errors

    sys.stderr.write(f"exl3tool: {errors.message(exc)}\n")
    return errors.exit_code(exc)


def guarded(fn: Callable[..., int], /, *args: Any, **kwargs: Any) -> int:
    """`fn`'s exit code, or that of the user-facing error or signal it raised."""
    try:
        return fn(*args, **kwargs)
    except (Exl3ToolError, KeyboardInterrupt, Interrupted) as exc:
        return error_code(exc)
    except BrokenPipeError:
        return 1


# ---- identity ----------------------------------------------------------------------------


def _format(fmt: str | None, output: Path | None, checking: bool) -> str:
    """--format, or json for an -o file named *.json (what --check, diff and check read)."""
    if fmt is None:
        return "json" if output is not None and output.suffix == ".json" else "text"
    if not checking and fmt not in ("text", "json"):
        from exl3tool.rules.errors import UsageError

        raise UsageError(f"--format {fmt}: identity writes text or json (sarif, junit: --check)")
    return fmt


def identity_body(
    path: str,
    algo: str | None = None,
    layers: str | None = None,
    threads: int | None = None,
    fmt: str | None = None,
    output: Path | None = None,
    sha256sum: Path | None = None,
    check_file: Path | None = None,
    compat: bool = True,
    force: bool = False,
) -> int:
    """`exl3tool identity`'s work once its arguments are parsed; the exit code."""
    from exl3tool.actions import identity as action
    from exl3tool.report.identity import finding_lines, identity_json, identity_text
    from exl3tool.report.render import check_output, write_output

    fmt = _format(fmt, output, check_file is not None)
    check_output(output, force)
    opts = action.Options(
        path, algo, layers, threads, compat, sha256sum, check=check_file, force=force
    )
    result = action.run(opts)
    if check_file is not None:
        return _render_check(result, fmt, output, force)
    if result.identity is not None:
        ident = result.identity
        text = identity_json(ident) if fmt == "json" else identity_text(ident, result.path)
        write_output(output, text, force=force)
    sys.stderr.write(finding_lines(result.findings))
    if result.identity is None:
        sys.stderr.write(f"exl3tool: {result.path}: container errors; no identity given\n")
    return result.exit_code()


def _render_check(result: Any, fmt: str, output: Path | None, force: bool) -> int:
    """`--check`: the findings as a report, or the one-line verdict (text or JSON)."""
    from exl3tool.report.render import emit, write_output

    if result.summary is None:
        emit(result.report(), fmt, output, force=force)
        return result.exit_code() or 1
    if fmt == "text":
        write_output(output, result.summary + "\n", force=force)
        return 0
    import json

    report = result.report()
    report.notes.append(result.summary)
    write_output(output, json.dumps(report.to_json(), separators=(",", ":")) + "\n", force=force)
    return 0


def _path_value(value: str) -> Path | None:
    """A Path option's value as typer converts it; None where typer would reject it (an
    existing path that is not readable)."""
    try:
        os.stat(value)
    except (OSError, ValueError):
        return Path(value)
    return Path(value) if os.access(value, os.R_OK) else None


def _threads_value(value: str) -> int | None:
    """A plain positive decimal (typer also takes "+3", " 3", "3_0": those go through it)."""
    if value.isascii() and value.isdigit() and value[0] != "0":
        return int(value)
    return None


def _choice(*choices: str) -> Callable[[str], str | None]:
    return lambda value: value if value in choices else None


# option word -> (keyword of identity_body, converter: None where typer must handle it)
_IDENTITY_VALUES: dict[str, tuple[str, Callable[[str], Any]]] = {
    "--algo": ("algo", _choice("blake3", "sha256")),
    "--layers": ("layers", str),
    "--threads": ("threads", _threads_value),
    "--format": ("fmt", _choice("text", "json", "sarif", "junit")),
    "-f": ("fmt", _choice("text", "json", "sarif", "junit")),
    "--output": ("output", _path_value),
    "-o": ("output", _path_value),
    "--sha256sum": ("sha256sum", _path_value),
    "--check": ("check_file", _path_value),
}
_IDENTITY_FLAGS: dict[str, tuple[str, bool]] = {
    "--compat": ("compat", True),
    "--no-compat": ("compat", False),
    "--force": ("force", True),
}


def _identity_args(args: list[str]) -> dict[str, Any] | None:
    """identity_body's keywords for a plain `identity` line; None: typer parses it."""
    kwargs: dict[str, Any] = {}
    words = iter(args)
    for word in words:
        if not word.startswith("-"):
            if "path" in kwargs:
                return None  # typer's "Got unexpected extra argument"
            kwargs["path"] = word
        elif word in _IDENTITY_FLAGS:
            key, flag = _IDENTITY_FLAGS[word]
            if key in kwargs:
                return None
            kwargs[key] = flag
        elif word in _IDENTITY_VALUES:
            key, convert = _IDENTITY_VALUES[word]
            value = next(words, None)
            if key in kwargs or not value or value.startswith("-"):
                return None
            kwargs[key] = convert(value)
            if kwargs[key] is None:
                return None
        else:
            return None  # help, --opt=value, --, an unknown or misspelt option
    return kwargs if "path" in kwargs else None


def plain_command(argv: list[str]) -> Callable[[], int] | None:
    """The command for a plain `argv` (the words after `exl3tool`), or None: typer parses
    it. The command's modules are imported here, its work and exit code come from the call."""
    if len(argv) < 2 or argv[0] != "identity" or "_EXL3TOOL_COMPLETE" in os.environ:
        return None  # (click answers shell completion when that variable is set)
    kwargs = _identity_args(argv[1:])
    if kwargs is None:
        return None
    from exl3tool.actions import identity  # noqa: F401  (imported with the caller's gc off)
    from exl3tool.report import identity as _report  # noqa: F401
    from exl3tool.report import render  # noqa: F401

    return lambda: guarded(identity_body, **kwargs)
