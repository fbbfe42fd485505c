"""`check`'s view of `org/name[@revision]` artifacts: the offline resolver (`io.hf_cache`), with
its refusals as GT findings instead of exceptions (one release report lists them all)."""

from __future__ import annotations

from pathlib import Path

from exl3tool.io.hf_cache import HfRef, NotCached, cache_dir, parse_hf_id, snapshot_of
from exl3tool.rules.check import GT_HF_NOT_CACHED, GT_HF_UNAVAILABLE
from exl3tool.rules.errors import UsageError
from exl3tool.rules.registry import Findings

__all__ = ["HfRef", "cache_dir", "parse_hf_id", "resolve"]


def resolve(ref: HfRef, findings: Findings, cache: Path | None = None) -> Path | None:
    """The local snapshot directory of `ref`, or None with a GT003/GT004 finding."""
    try:
        return snapshot_of(ref, cache)
    except NotCached as exc:
        findings.add(GT_HF_NOT_CACHED, str(exc), file=str(ref))
    except UsageError:  # huggingface_hub is not installed
        findings.add(GT_HF_UNAVAILABLE, f"cannot resolve {ref}: huggingface_hub is not installed")
    return None
