"""The one place a command's artifact argument becomes a local path: the path itself, or
`org/name[@revision]` resolved offline in the local Hugging Face cache (`HF_HUB_CACHE`), with
the rules `exl3tool check` uses (`io.hf_cache`)."""

from __future__ import annotations

from pathlib import Path

from exl3tool.rules.errors import InputError


def resolve_input(arg: str | Path) -> Path:
    """A local path for `arg`; InputError (exit 3) when it is neither a path nor cached, a
    UsageError (exit 2) naming the `hf` extra when huggingface_hub is needed and missing."""
    from exl3tool.io.hf_cache import NotCached, resolve_artifact

    try:
        return resolve_artifact(str(arg))
    except NotCached as exc:
        raise InputError(f"{arg}: no such file or directory, and {exc}") from None


def resolve_optional(arg: str | Path | None) -> Path | None:
    return None if arg is None else resolve_input(arg)
