"""The `exl3tool-validate` pre-commit hook: validate the artifacts whose files changed.

pre-commit passes file names (config.json, quantization_config.json, adapter_config.json,
manifests, shards); each maps to its artifact directory, once, and every directory is validated
into one report. A bare `config.json` of something that is no EXL3/R7/MSRT artifact is skipped
(with a note), so the hook can run on repositories that hold other projects too.

    python -m exl3tool.actions.gate.precommit [--hash] [--tp N] [--strict] [--format F] FILE...
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# Files that belong to an artifact directory (the hook's `files` pattern lists the same names).
ARTIFACT_FILES = (
    "config.json",
    "quantization_config.json",
    "adapter_config.json",
    "model.safetensors.index.json",
    "MANIFEST.json",
    "MANIFEST.sha256",
    "exl3tool-staging.json",
    "exl3tool-slices.json",
)
# Files that only an exl3tool artifact has: their directory is validated whatever its kind.
_MARKERS = ("quantization_config.json", "adapter_config.json", "MANIFEST.json")


def artifact_dirs(files: list[str]) -> tuple[list[Path], list[str]]:
    """Distinct artifact directories of `files` (in first-seen order), and notes on skips."""
    from exl3tool.formats.detect import Kind, detect

    dirs: list[Path] = []
    notes: list[str] = []
    seen: set[Path] = set()
    for name in files:
        d = Path(name).parent
        key = d.resolve()
        if key in seen:
            continue
        seen.add(key)
        if not d.is_dir():
            notes.append(f"skipped {name}: its directory does not exist")
            continue
        if detect(d) is Kind.UNKNOWN and not any((d / m).is_file() for m in _MARKERS):
            notes.append(f"skipped {d}: not an EXL3/R7/MSRT artifact")
            continue
        dirs.append(d)
    return dirs, notes


def main(argv: list[str] | None = None) -> int:
    from exl3tool.actions.validate import validate_path
    from exl3tool.checks.options import ValidateOptions
    from exl3tool.report.model import Report
    from exl3tool.report.render import emit
    from exl3tool.rules.registry import Findings

    ap = argparse.ArgumentParser(prog="exl3tool-precommit", description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*")
    ap.add_argument("--hash", action="store_true", help="recompute the declared digests too")
    ap.add_argument("--tp", type=int, default=None, help="check against this TP size")
    ap.add_argument("--strict", action="store_true", help="warnings fail too")
    ap.add_argument("--format", default="text", choices=("text", "json", "sarif", "junit"))
    ns = ap.parse_args(argv)
    dirs, notes = artifact_dirs(ns.files)
    report = Report(findings=Findings(), notes=notes)
    options = ValidateOptions(tp=ns.tp, hash=ns.hash)
    for d in dirs:
        ref, found = validate_path(d, options)
        report.artifacts.append(ref)
        report.add_findings(found)
    if not dirs:
        for note in notes:
            sys.stderr.write(f"exl3tool: {note}\n")
        return 0
    emit(report, ns.format)
    return report.exit_code(ns.strict)


if __name__ == "__main__":
    raise SystemExit(main())
