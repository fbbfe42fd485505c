"""`exl3tool verify-swap`: prove hot swaps, rollbacks and TP slicing bit for bit.

Every rank runs `verify_rank.rank_checks` (the same sequence, collectives in lockstep), one layer
at a time; rank results are merged into one report: a check passes only if it passed on every rank.
What each check detects and what it cannot: docs/verify-swap.md.

Entry points (stable; `actions/verify_swap.py` and the gate call them): `VerifyOptions`,
`run_verify(opts) -> VerifyReport` (and `verify_parts.parse_layers`); `run_verify` raises `UsageError` /
`InputError` / `budget.ResourceRefused` (VS001 memory, VS002 a dead rank: exit 3).

Checks (issue 6): 1 hot-load == cold build; 2 deactivate restores the base (max_abs 0.0);
3 a staging failure leaves the base untouched, a failure after the pause rolls back bit for bit;
4 swap A → B == cold B; 5 TP: rank weights concatenate to the TP=1 weights, TP=N outputs match
TP=1 within TP_MAX_ABS_REL / TP_REL_L2; 6 quality ladder; 7 exllamav3 agreement (CUDA).
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path

from exl3tool.io.atomic import remove_tree
from exl3tool.runtime.distributed import env_world, from_env, launch_local
from exl3tool.runtime.verify_parts import Check, RankResult, VerifyOptions, VerifyReport
from exl3tool.runtime.verify_rank import rank_checks

# --- orchestration ----------------------------------------------------------------------------


def merge(results: list[RankResult], opts: VerifyOptions, world: int) -> VerifyReport:
    first = results[0]
    checks: list[Check] = []
    for i, c in enumerate(first.checks):
        per_rank = [r.checks[i] for r in results]
        failed = [
            (r.rank, ch) for r, ch in zip(results, per_rank, strict=True) if ch.passed is False
        ]
        passed = None if c.passed is None else not failed
        pick = failed[0][1] if failed else c
        detail = pick.detail if not failed or world == 1 else f"rank {failed[0][0]}: {pick.detail}"
        mx = [ch.max_abs for ch in per_rank if ch.max_abs is not None]
        checks.append(
            Check(
                c.name, passed, detail, max(mx) if mx else None, pick.first_difference, pick.extra
            )
        )
    timings: dict[str, float] = {}
    for k in first.timings:
        timings[k] = max(r.timings.get(k, 0.0) for r in results)
    return VerifyReport(
        world, opts.device, first.layers, checks, first.quality, timings, first.notes
    )


def _geometry(opts: VerifyOptions) -> tuple[int, int, int, int]:
    from exl3tool.runtime.base import base_geometry, open_base

    _ckpt, cfg = open_base(opts.base)
    hidden, inter, experts, _topk, k, _layers = base_geometry(cfg, opts.base)
    return hidden, inter, experts, k


def run_verify(opts: VerifyOptions) -> VerifyReport:
    """Run every check on `opts.tp` ranks (spawned locally, or the torchrun group if present).

    Before any worker starts, the memory one rank needs is estimated and checked against
    `opts.max_memory` and the machine (VS001). Every rank works in one private temporary
    directory that is removed whatever happens, also when a rank dies (VS002)."""
    from exl3tool.runtime import budget

    t0 = time.perf_counter()
    found = env_world()
    world = found[1] if found is not None and found[1] > 1 else opts.tp
    adapters = [a for a in (opts.adapter, opts.adapter_b) if a is not None]
    est = budget.estimate(_geometry(opts), adapters, world, opts.device)
    budget.check_budget(est, opts.device, world, opts.max_memory)
    root = Path(tempfile.mkdtemp(prefix="exl3tool-verify-", dir=opts.work_dir))
    try:
        report = _run(dataclasses.replace(opts, work_dir=root), found)
    finally:
        remove_tree(root)  # whole, even when an interrupt comes meanwhile
    report.timings["total"] = time.perf_counter() - t0
    report.notes.append(f"memory estimate {est.text()}")
    return report


def _run(opts: VerifyOptions, found: tuple[int, int, int] | None) -> VerifyReport:
    if found is not None and found[1] > 1:
        comm = from_env(opts.device)
        if opts.tp not in (1, comm.world_size):
            raise ValueError(f"--tp {opts.tp} but torchrun started {comm.world_size} ranks")
        try:
            results = comm.gather_objects(rank_checks(comm, opts))
        finally:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        world = comm.world_size
    else:
        world = opts.tp
        results = launch_local(rank_checks, opts, world, opts.device)
    return merge(results, opts, world)
