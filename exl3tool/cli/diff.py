"""`exl3tool diff A B`: which layers, tensors and K values differ between two artifacts (or
identity records written by `exl3tool identity -o record.json`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Literal

import typer

from exl3tool.cli.common import ARTIFACT_HELP, ForceOpt, TextJsonOpt, handle_errors


@handle_errors
def diff(
    a: Annotated[
        str,
        typer.Argument(help=f"Artifact A ({ARTIFACT_HELP}) or an identity record.", metavar="A"),
    ],
    b: Annotated[
        str,
        typer.Argument(help=f"Artifact B ({ARTIFACT_HELP}) or an identity record.", metavar="B"),
    ],
    fmt: TextJsonOpt = "text",
    algo: Annotated[
        Literal["blake3", "sha256"] | None,
        typer.Option("--algo", help="blake3 or sha256 (default: the record's, blake3)."),
    ] = None,
    threads: Annotated[int | None, typer.Option("--threads", min=1)] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write here.")] = None,
    force: ForceOpt = False,
) -> None:
    """Compare two artifacts by logical identity; exit 0 when identical, 1 when they differ."""
    from exl3tool.actions import diff as action
    from exl3tool.report.identity import diff_text
    from exl3tool.report.render import check_output, write_output

    check_output(output, force, (a, b))
    result = action.run(action.Options(a, b, algo, threads))
    for f in result.errors:
        sys.stderr.write(f"exl3tool: {f.location.file}: {f.code} {f.message}\n")
    if fmt == "json":
        text = json.dumps(result.to_json(), indent=2) + "\n"
    elif not result.conclusive:
        text = f"not conclusive: {len(result.errors)} container errors in {a} / {b}\n"
    else:
        text = diff_text(result.diff, a, b)
    write_output(output, text, force=force)
    if not result.conclusive:
        # An artifact with container errors has no trustworthy identity: never report "identical".
        sys.stderr.write("exl3tool: diff is not conclusive: fix the errors above first\n")
    raise typer.Exit(result.exit_code())
