"""`exl3tool check`: the pre-publish gate, every declared check in one report."""

from __future__ import annotations

import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated

import typer

from exl3tool.cli.common import FormatOpt, OutputOpt, check_format, handle_errors
from exl3tool.rules.errors import InputError, UsageError


@handle_errors
def check(
    paths: Annotated[
        list[str] | None,
        typer.Argument(
            help="Artifact directories (or a config.json / adapter_config.json inside one), or "
            "org/name\\[@revision] from the local Hugging Face cache. Without --config, the checks "
            "are inferred from each artifact's kind.",
            show_default=False,
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="exl3tool.toml or a pyproject.toml with \\[tool.exl3tool]. Default: ./exl3tool.toml "
            "(or ./pyproject.toml) when no PATH is given.",
        ),
    ] = None,
    fmt: FormatOpt = "text",
    output: OutputOpt = None,
    strict: Annotated[bool, typer.Option("--strict", help="Warnings fail too (exit 1).")] = False,
    quiet: Annotated[
        bool,
        typer.Option("--quiet", "-q", help="Only errors and the verdict; no notes, no progress."),
    ] = False,
) -> None:
    """Run a release's pre-publish checks in one process and one report.

    validate --hash, identity match, TP slicing, staging and verify-swap, as exl3tool.toml
    declares or as inferred from each artifact's kind. Exit 0 clean, 1 findings, 2 usage
    error, 3 unreadable PATH."""
    from exl3tool.actions.gate import config as gate_config
    from exl3tool.actions.gate.infer import infer
    from exl3tool.actions.gate.run import resolve_arg, run_check
    from exl3tool.io import progress
    from exl3tool.report.render import emit, render_string
    from exl3tool.rules.registry import Findings

    check_format(fmt)
    progress.set_quiet(quiet)
    args = list(paths or [])
    findings = Findings()
    notes: list[str] = []
    source = config
    if source is None and not args:
        source = gate_config.discover(Path("."))
        if source is None:
            raise UsageError(
                "nothing to check: give PATH arguments or --config, or put an exl3tool.toml here"
            )
    cfg = gate_config.load_config(source, findings) if source is not None else None
    if args:
        resolved = []
        root = Path.cwd()
        for arg in args:
            local = Path(arg).expanduser()
            if not local.exists() and _hf_ref(arg) is None:
                raise InputError(f"{arg}: no such file or directory")
            resolved.append((arg, resolve_arg(arg, root, Findings())))
        inferred = infer(_dedup(resolved), cfg)
        cfg = inferred.config
        notes += inferred.notes
    assert cfg is not None
    if not cfg.artifacts and not findings:
        raise UsageError(f"{source}: no artifacts declared and no PATH given")
    if source is not None:
        notes.insert(0, f"config: {source}")

    status = _status(quiet)
    with status as bar:
        report = run_check(cfg, findings, notes, on_step=bar.update if bar else None)

    if fmt == "text":
        from exl3tool.actions.gate import summary

        if output is not None:
            from exl3tool.io.atomic import write_bytes_atomic

            text = render_string(report, "text") + "\n" + summary.to_text(report)
            write_bytes_atomic(Path(output), text.encode(), force=True)
        else:
            emit(report, "text", None, quiet=quiet)
            if not quiet:
                summary.print_table(report)
    else:
        if not quiet:  # human notes go to stderr: stdout carries only the machine format
            for note in report.notes:
                sys.stderr.write(f"note: {note}\n")
        emit(report, fmt, output, quiet=quiet)
    raise typer.Exit(report.exit_code(strict or cfg.strict))


def _hf_ref(arg: str) -> object | None:
    from exl3tool.actions.gate.hf import parse_hf_id

    return parse_hf_id(arg)


def _dedup(pairs: list[tuple[str, Path | None]]) -> list[tuple[str, Path | None]]:
    """One entry per artifact directory (pre-commit passes several files of one artifact)."""
    seen: set[Path] = set()
    out = []
    for arg, path in pairs:
        key = path.resolve() if path is not None else None
        if key is not None and key in seen:
            continue
        if key is not None:
            seen.add(key)
        out.append((arg, path))
    return out


class _Status:
    """A one-line status on stderr naming the running step (only on a TTY)."""

    def __init__(self) -> None:
        from rich.console import Console

        self._status = Console(stderr=True).status("exl3tool check")

    def __enter__(self) -> _Status:
        self._status.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._status.__exit__(*exc)

    def update(self, text: str) -> None:
        self._status.update(f"exl3tool check: {text}")


def _status(quiet: bool) -> _Status | nullcontext[None]:
    from exl3tool.io import progress

    return _Status() if not quiet and progress.enabled() else nullcontext(None)
