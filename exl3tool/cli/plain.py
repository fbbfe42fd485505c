"""Plain invocations of the hot commands, run without typer.

typer and its vendored click take ~25 ms to import and build a command, about half of a
short command's fixed cost. `plain_command(argv)` recognises the common plain forms of
`exl3tool identity PATH [options]` and `exl3tool validate PATH... [options]` (each option at
most once, as separate words, every value one that typer would accept unchanged) and returns
the command to run; for anything else
(help, `--opt=value`, a value typer would reject or convert, an unknown option, a repeated
one, `--`, shell completion) it returns None and typer parses the line as always, with its
own messages and exit codes. A plain run calls the same body as the typer command (`identity_body`,
`validate_body`) and maps errors
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
    except BrokenPipeError:
        raise  # stdout's reader has gone: the entry point's exit 141 (cli/streams)
    except (Exl3ToolError, KeyboardInterrupt, Interrupted, OSError) as exc:
        return error_code(exc)


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
    from exl3tool.report.identity import finding_lines, identity_json_chunks, identity_text
    from exl3tool.report.render import check_output, write_output

    fmt = _format(fmt, output, check_file is not None)
    check_output(output, force, (path,) if check_file is None else (path, check_file))
    opts = action.Options(
        path, algo, layers, threads, compat, sha256sum, check=check_file, force=force
    )
    result = action.run(opts)
    if check_file is not None:
        return _render_check(result, fmt, output, force)
    if result.identity is not None:
        ident = result.identity
        text = identity_json_chunks(ident) if fmt == "json" else identity_text(ident, result.path)
        try:
            write_output(output, text, force=force)
        except Exception:
            # -o and --sha256sum go together: a record that could not be written takes back
            # the manifest the action published (stdout's failures leave it: both were asked)
            if output is not None and result.manifest_files is not None and sha256sum:
                Path(sha256sum).unlink(missing_ok=True)
            raise
    sys.stderr.write(finding_lines(result.findings))
    if result.identity is None:
        sys.stderr.write(f"exl3tool: {result.path}: container errors; no identity given\n")
        if fmt == "json" and output is None:  # a JSON reader still gets JSON: the findings
            from exl3tool.report.render import emit

            emit(result.report(), "json", None, force=False)
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


# option word -> (keyword of the body, converter: None where typer must handle it)
_REPORT_VALUES: dict[str, tuple[str, Callable[[str], Any]]] = {
    "--format": ("fmt", _choice("text", "json", "sarif", "junit")),
    "-f": ("fmt", _choice("text", "json", "sarif", "junit")),
    "--output": ("output", _path_value),
    "-o": ("output", _path_value),
}
_IDENTITY_VALUES: dict[str, tuple[str, Callable[[str], Any]]] = {
    "--algo": ("algo", _choice("blake3", "sha256")),
    "--layers": ("layers", str),
    "--threads": ("threads", _threads_value),
    **_REPORT_VALUES,
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
    return _parse(args, _IDENTITY_FLAGS, _IDENTITY_VALUES, many=False)


# ---- validate ----------------------------------------------------------------------------


def validate_body(
    paths: list[str],
    tp: int | None = None,
    hash_: bool = False,
    strict: bool = False,
    base: str | None = None,
    threads: int | None = None,
    runtime: str = "auto",
    fmt: str = "text",
    output: Path | None = None,
    force: bool = False,
    quiet: bool = False,
    selection: Any = None,
) -> int:
    """`exl3tool validate`'s work once its arguments are parsed; the exit code."""
    from exl3tool.actions import validate as action
    from exl3tool.report.render import check_output, emit

    check_output(output, force, (*paths, *((base,) if base else ())))
    opts = action.Options(
        paths=tuple(paths),
        tp=tp,
        hash=hash_,
        base=base,
        threads=threads,
        runtime=runtime,
        quiet=quiet,
        selection=selection,
    )
    report = action.run(opts)
    emit(report, fmt, output, quiet=quiet, force=force)
    return report.exit_code(strict)


_VALIDATE_VALUES: dict[str, tuple[str, Callable[[str], Any]]] = {
    "--tp": ("tp", _threads_value),
    "--base": ("base", str),
    "--threads": ("threads", _threads_value),
    "--runtime": ("runtime", _choice("auto", "public", "cartridge")),
    **_REPORT_VALUES,
}
_VALIDATE_FLAGS: dict[str, tuple[str, bool]] = {
    "--hash": ("hash_", True),
    "--no-hash": ("hash_", False),
    "--strict": ("strict", True),
    "--quiet": ("quiet", True),
    "-q": ("quiet", True),
    "--force": ("force", True),
}


def _validate_args(args: list[str]) -> dict[str, Any] | None:
    """validate_body's keywords for a plain `validate` line; None: typer parses it
    (--select, --ignore and --severity always go through typer)."""
    return _parse(args, _VALIDATE_FLAGS, _VALIDATE_VALUES, many=True)


def _parse(
    args: list[str],
    flags: dict[str, tuple[str, bool]],
    values: dict[str, tuple[str, Callable[[str], Any]]],
    many: bool,
) -> dict[str, Any] | None:
    """Keywords of a plain line: positional words (one PATH, or with `many` one or more), each
    option at most once; None for anything typer must parse."""
    kwargs: dict[str, Any] = {}
    positional: list[str] = []
    words = iter(args)
    for word in words:
        if not word.startswith("-"):
            if positional and not many:
                return None  # typer's "Got unexpected extra argument"
            positional.append(word)
        elif word in flags:
            key, flag = flags[word]
            if key in kwargs:
                return None
            kwargs[key] = flag
        elif word in values:
            key, convert = values[word]
            value = next(words, None)
            if key in kwargs or not value or value.startswith("-"):
                return None
            kwargs[key] = convert(value)
            if kwargs[key] is None:
                return None
        else:
            return None  # help, --opt=value, --, an unknown or misspelt option
    if not positional:
        return None
    if many:
        kwargs["paths"] = positional
    else:
        kwargs["path"] = positional[0]
    return kwargs


def plain_command(argv: list[str]) -> Callable[[], int] | None:
    """The command for a plain `argv` (the words after `exl3tool`), or None: typer parses
    it. The command's modules are imported here, its work and exit code come from the call."""
    if len(argv) < 2 or "_EXL3TOOL_COMPLETE" in os.environ:
        return None  # (click answers shell completion when that variable is set)
    import importlib

    command, parse, modules = _PLAIN.get(argv[0], (None, None, ()))
    kwargs = parse(argv[1:]) if parse is not None else None
    if command is None or kwargs is None:
        return None
    for name in modules:  # imported here, with the caller's gc off
        importlib.import_module(name)
    return lambda: guarded(command, **kwargs)


# command word -> (body, argument parser, modules its run imports)
_PLAIN: dict[str, tuple[Callable[..., int], Callable[[list[str]], Any], tuple[str, ...]]] = {
    "identity": (
        identity_body,
        _identity_args,
        ("exl3tool.actions.identity", "exl3tool.report.identity", "exl3tool.report.render"),
    ),
    "validate": (
        validate_body,
        _validate_args,
        ("exl3tool.actions.validate", "exl3tool.report.render"),
    ),
}
