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
    from exl3tool.identity.logical import build_plan, differing_copies

    plan = build_plan(ckpt)
    unreadable = ckpt.damaged_shards | ckpt.rejected_files  # their own findings say so
    first = {n: plan.tensors[n].sources[0] for n in plan.replicas}
    replicas = {
        n: refs
        for n, refs in plan.replicas.items()
        if first[n].file not in unreadable and not any(r.file in unreadable for r in refs)
    }
    if not replicas:
        return
    got = digests.tensors(ref for n, refs in replicas.items() for ref in (first[n], *refs))

    def digest(name: str, i: int | None) -> str | None:
        return got.get((first[name] if i is None else replicas[name][i]).name)

    bad = [(first[n], ref) for n, ref in differing_copies(plan.tensors, replicas, digest)]
    for rank0, ref in bad[:MAX_REPORTED]:
        findings.add(
            r7.RS_REPLICA,
            f"{ref.name} differs from rank 0's copy {rank0.name}",
            file=ref.file,
            tensor=ref.name,
        )
    if len(bad) > MAX_REPORTED:
        findings.add(
            r7.RS_REPLICA,
            f"{len(bad) - MAX_REPORTED} more replicated rank copies differ from rank 0's",
            file=bad[MAX_REPORTED][1].file,
        )
