"""The one place a command's artifact argument becomes a local path: the path itself, or
`org/name[@revision]` resolved offline in the local Hugging Face cache (`HF_HUB_CACHE`), with
the rules `exl3tool check` uses (`io.hf_cache`)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from exl3tool.io.fs import exists
from exl3tool.rules.errors import InputError, UsageError
from exl3tool.rules.registry import Findings, Location


def resolve_input(arg: str | Path) -> Path:
    """A local path for `arg`; InputError (exit 3) when it is neither a path nor cached, a
    UsageError (exit 2) naming the `hf` extra when huggingface_hub is needed and missing."""
    from exl3tool.io.hf_cache import NotCached, resolve_artifact

    try:
        return resolve_artifact(str(arg))
    except NotCached as exc:
        raise InputError(f"{arg}: no such file or directory, and {exc}") from None
    except UsageError:  # huggingface_hub is not installed
        parent = os.path.dirname(str(arg))
        if parent and os.path.isdir(parent):  # `models/x` beside a local models/: a path
            raise InputError(f"{arg}: no such file or directory") from None
        raise


def resolve_optional(arg: str | Path | None) -> Path | None:
    return None if arg is None else resolve_input(arg)


def check_readable(path: Path) -> None:
    """InputError (exit 3) for a path that cannot be read at all."""
    if not exists(path):
        raise InputError(f"{path}: no such file or directory")
    if not os.access(path, os.R_OK) or (path.is_dir() and not os.access(path, os.X_OK)):
        raise InputError(f"{path}: permission denied")
    if not (path.is_dir() or path.is_file()):
        raise InputError(f"{path}: not a directory or regular file")


def artifact_root(path: Path) -> Path:
    """The artifact a path names: a config or manifest file (what pre-commit passes) stands for
    its directory; a `.safetensors` file and `adapter_config.json` stand for themselves."""
    if path.is_file() and path.suffix == ".json" and path.name != "adapter_config.json":
        return path.parent
    if path.is_file() and path.name == "MANIFEST.sha256":
        return path.parent
    return path


def anchor(path: Path, findings: Findings) -> Findings:
    """Findings name files relative to the artifact; prefix them with the path the user gave so
    one report over several artifacts stays unambiguous."""
    base = path.parent if path.is_file() else path
    out = Findings()
    for f in findings:
        file = f.location.file
        if file in (None, "", ".") or (path.is_file() and file == path.name):
            shown = str(path)
        else:
            shown = str(base / file)
        out.extend(
            [
                dataclasses.replace(
                    f, location=Location(shown, f.location.tensor, f.location.pointer)
                )
            ]
        )
    return out
