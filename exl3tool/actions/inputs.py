"""The one place a command's artifact argument becomes a local path: the path itself, or
`org/name[@revision]` resolved offline in the local Hugging Face cache (`HF_HUB_CACHE`), with
the rules `exl3tool check` uses."""

from __future__ import annotations

from pathlib import Path

from exl3tool.rules.errors import InputError
from exl3tool.rules.registry import Findings


def resolve_input(arg: str | Path) -> Path:
    """A local path for `arg`; InputError (exit 3) when it is neither a path nor cached."""
    try:  # the shared resolver of the io layer, once it exists
        from exl3tool.io.hf_cache import resolve_artifact
    except ImportError:
        return _resolve_with_gate(str(arg))
    return resolve_artifact(str(arg))


def resolve_optional(arg: str | Path | None) -> Path | None:
    return None if arg is None else resolve_input(arg)


def _resolve_with_gate(arg: str) -> Path:
    from exl3tool.actions.gate.hf import parse_hf_id, resolve

    local = Path(arg).expanduser()
    if local.exists() or local.is_symlink():
        return local
    ref = parse_hf_id(arg) if not local.is_absolute() else None
    if ref is None:
        raise InputError(f"{arg}: no such file or directory")
    findings = Findings()
    path = resolve(ref, findings)
    if path is None:
        why = "; ".join(f.message for f in findings)
        raise InputError(f"{arg}: no such file or directory, nor a cached model: {why}")
    return path
