"""Replicated rank copies (`--hash`): every rank's copy of a replicated tensor must be rank 0's
bytes (RS012; docs/formats/r7.md §7.1). The same comparison as the identity's ID007, from the
same logical plan (identity/logical), with the sha256 of `validate --hash`."""

from __future__ import annotations

from exl3tool.checks.digests import Digests
from exl3tool.formats.checkpoint import Checkpoint
from exl3tool.rules import r7
from exl3tool.rules.registry import Findings

MAX_REPORTED = 20  # copies named one by one; the rest are counted in one finding


def check_replicas(ckpt: Checkpoint, findings: Findings, digests: Digests) -> None:
    """RS012 for each rank copy whose dtype, shape or bytes differ from rank 0's."""
    from exl3tool.identity.logical import build_plan

    plan = build_plan(ckpt)
    if not plan.replicas:
        return
    unreadable = ckpt.damaged_shards | ckpt.rejected_files  # their own findings say so
    groups = [
        (first, reps)
        for n, reps in plan.replicas.items()
        if (first := plan.tensors[n].sources[0]).file not in unreadable
        and not any(r.file in unreadable for r in reps)
    ]
    got = digests.tensors(ref for first, reps in groups for ref in (first, *reps))
    bad = [
        (first, ref)
        for first, reps in groups
        for ref in reps
        if (ref.info.dtype, ref.info.shape) != (first.info.dtype, first.info.shape)
        or got.get(ref.name) != got.get(first.name)
    ]
    for first, ref in bad[:MAX_REPORTED]:
        findings.add(
            r7.RS_REPLICA,
            f"{ref.name} differs from rank 0's copy {first.name}",
            file=ref.file,
            tensor=ref.name,
        )
    if len(bad) > MAX_REPORTED:
        findings.add(
            r7.RS_REPLICA,
            f"{len(bad) - MAX_REPORTED} more replicated rank copies differ from rank 0's",
            file=bad[MAX_REPORTED][1].file,
        )
