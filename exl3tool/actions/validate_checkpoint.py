"""The checks of one loaded checkpoint: its family's, then the runtime-conformance checks (for
`validate` of a path and of each rank folder of a slice output, actions/validate_slices)."""

from __future__ import annotations

from typing import Any

from exl3tool.checks.options import ValidateOptions
from exl3tool.formats.checkpoint import Checkpoint
from exl3tool.formats.detect import Kind
from exl3tool.rules.registry import Findings


def check_checkpoint(
    ckpt: Checkpoint,
    kind: Kind,
    findings: Findings,
    options: ValidateOptions,
    *,
    prefetched: Any = None,
) -> dict:
    """The family checks and the runtime-conformance checks of a loaded checkpoint.
    `prefetched`: an R7 checkpoint's `prefetch_r7` under way (a `Forked`)."""
    extra = _facts(ckpt)
    # Checks write to their own list: what only repeats a defect the loader reported (a JSON
    # syntax error, a truncated shard) is dropped, so the root cause stands alone.
    loaded, findings = findings, Findings()
    if kind is Kind.MSRT_BASE:
        from exl3tool.checks.base import check_base

        check_base(ckpt, findings, options)
    elif kind is Kind.R7:
        from exl3tool.checks.r7 import check_r7

        payload = check_r7(ckpt, findings, options, prefetched=prefetched)
        extra["layers"] = len(payload.by_layer)
        extra["tiers"] = {str(k): v for k, v in payload.tiers().items()}
    elif kind is Kind.RANK_SLICED:
        from exl3tool.checks.rank_sliced import check_rank_sliced

        check_rank_sliced(ckpt, findings, options)
    else:  # plain EXL3 checkpoint, or one safetensors file of one
        from exl3tool.checks.exl3 import check_exl3

        check_exl3(ckpt, findings, options)
    from exl3tool.checks.conformance import check_conformance

    check_conformance(ckpt, kind, findings, options)
    loaded.extend(f for f in findings if not ckpt.is_consequence(f))
    return extra


def _facts(ckpt: Checkpoint) -> dict:
    return {
        "shards": len(ckpt.shards),
        "tensors": len(ckpt.tensors),
        "bytes": ckpt.payload_bytes(),
    }
