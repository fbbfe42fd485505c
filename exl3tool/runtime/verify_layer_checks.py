"""verify-swap checks that run per layer (failure drills, swap, exllamav3) and their merge."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from exl3tool.runtime import verify_steps as vs
from exl3tool.runtime.base import BaseModel
from exl3tool.runtime.compare import Tally, compare
from exl3tool.runtime.engine import RolledBack, StageAhead, Staged, StagingFailed, SwapEngine
from exl3tool.runtime.verify_parts import Check, Timer


def merge_layer_checks(name: str, per_layer: list[tuple[int, Check]]) -> Check:
    """One check from its per-layer results: the first failure (named by layer), else the
    first pass with the largest max_abs; skipped only if every layer skipped."""
    if not per_layer:
        return Check(name, None, "skipped: no layer ran it")
    for L, c in per_layer:
        if c.passed is False:
            detail = c.detail if c.detail.startswith("layer ") else f"layer {L}: {c.detail}"
            return Check(name, False, detail, c.max_abs, c.first_difference, c.extra)
    ran = [c for _L, c in per_layer if c.passed is not None]
    if not ran:
        return per_layer[0][1]
    mx = [c.max_abs for c in ran if c.max_abs is not None]
    worst = max(ran, key=lambda c: c.max_abs or 0.0)
    detail = worst.detail if len(per_layer) == 1 else f"{len(ran)} layer(s): {worst.detail}"
    return Check(name, True, detail, max(mx) if mx else None, None, worst.extra)


def failure_check(
    engine: SwapEngine,
    inp: vs.Inputs,
    base0: vs.Outputs,
    bad: Path,
    staged: Staged,
    ahead: StageAhead | None = None,
) -> Check:
    """(a) a copy with one flipped byte must fail staging before any pause; (b) a fault injected
    at activate must roll back to the base bit for bit. Both leave the base outputs equal."""
    problems: list[str] = []
    tally = Tally()
    n_events = len(engine.events)
    try:
        engine.load(bad, ahead)
        problems.append("a corrupted copy was loaded")
    except StagingFailed:
        pass
    except RolledBack:
        problems.append("a corrupted copy passed staging (rolled back after the pause)")
    if "pause" in engine.events[n_events:]:
        problems.append("the engine paused for an adapter that failed staging")
    vs.exact(vs.hot_outputs(engine, inp), base0, tally)
    saved = engine.fault_at
    engine.fault_at = "activate"
    try:
        engine.load_staged(staged)
        problems.append("the injected fault did not fail the load")
    except RolledBack:
        pass
    except StagingFailed as exc:
        problems.append(f"staging failed instead: {exc}")
    finally:
        engine.fault_at = saved
    if engine.status()["active"]:
        problems.append(f"layers {engine.status()['layers']} still active after the rollback")
    vs.exact(vs.hot_outputs(engine, inp), base0, tally)
    engine.restore_base()  # leave the engine in its base state
    if not tally.equal:
        problems.insert(0, "base outputs changed")
    return Check(
        "failed-load-leaves-base",
        not problems,
        "; ".join(problems)
        or "a one-byte corruption failed staging with no pause; a fault injected at activate "
        "rolled back and the base outputs are equal (max_abs 0.0)",
        tally.max_abs,
        tally.first_difference,
    )


def swap_check(
    engine: SwapEngine,
    inp: vs.Inputs,
    cold_b: Callable[[], vs.Outputs],
    staged_b: Staged | None,
    timer: Timer,
) -> Check:
    """With A active, load B over it: B must equal its cold build (computed only once B has
    loaded), a layer common to A and B reuses A's runtime, a layer only A selects is released.
    B stays active (the deactivate check that follows must undo it)."""
    problems: list[str] = []
    if staged_b is None:
        return Check("swap-a-to-b-equals-cold-b", False, "load failed: B was refused by staging")
    with timer("checks"):
        layers_a = set(engine.active)
        ids_a = {L: id(rt) for L, rt in engine.active.items()}
        try:
            info = engine.load_staged(staged_b)
        except (StagingFailed, RolledBack) as exc:
            engine.restore_base()
            return Check("swap-a-to-b-equals-cold-b", False, f"load failed: {exc}")
    common = layers_a & set(info.layers)
    reused = {L for L in common if id(engine.active.get(L)) == ids_a[L]}
    if reused != common:
        problems.append(f"common layers {sorted(common - reused)} were rebuilt, not reused")
    stale = set(engine.active) - set(info.layers)
    if stale:
        problems.append(f"layers {sorted(stale)} of A are still active")
    with timer("gemm"):
        got = vs.hot_outputs(engine, inp)
    tally = vs.exact(got, cold_b())
    if not tally.equal:
        problems.insert(0, "outputs after A → B differ from the cold build of B")
    return Check(
        "swap-a-to-b-equals-cold-b",
        not problems,
        "; ".join(problems)
        or f"outputs equal the cold build of B; {len(reused)} common layer(s) reused, "
        f"{len(layers_a - set(info.layers))} released",
        tally.max_abs,
        tally.first_difference,
    )


def quality_check(stats: dict[tuple[int, int], Any]) -> tuple[Check, list[dict[str, Any]]]:
    rows = [stats[k].to_json() for k in sorted(stats)]
    failed = [r for r in rows if not r["passed"]]
    if failed:
        f = failed[0]
        return Check(
            "quality-ladder", False, f"layer {f['layer']} stage {f['label']}: {f['failures'][0]}"
        ), rows
    first = rows[0]["layer"] if rows else None
    ladder = ", ".join(
        f"{r['label']}(K{r['k']}) {r['correction_ratio_max']:.3g}"
        for r in rows
        if r["correction_ratio_max"] is not None and r["layer"] == first
    )
    detail = f"corrections fall along the chain (max ‖c_s‖/‖W_0‖ per stage: {ladder})"
    if any(r["rel_to_dense_max"] is not None for r in rows):
        detail += "; error vs the dense reference falls"
    return Check("quality-ladder", True, detail), rows


def exllamav3_check(
    opts: Any, base: BaseModel, inp: vs.Inputs, dev: torch.device, rank: int
) -> Check:
    from exl3tool.runtime import exl3ref
    from exl3tool.runtime.linear import gemm32

    if opts.device != "cuda":
        return Check("exllamav3-agreement", None, "skipped: needs --device cuda and exllamav3")
    ext, why = exl3ref.load_ext()
    if ext is None:
        return Check("exllamav3-agreement", None, f"skipped: {why}")
    tally = Tally()
    worst = 0.0
    first = None
    n = 0
    L = base.layers[0]
    x = inp.x[L]
    for (e, p), bl in list(base.linears[L].items())[:12]:
        trellis = bl.trellis.to(dev)
        where = f"layer {L} expert {e} {p}"
        tally.add(
            compare(
                exl3ref.ours_rotated(trellis),
                exl3ref.reconstruct(ext, trellis),
                f"{where} Ŵ (rank {rank})",
            )
        )
        xin = x
        if p == "down_proj":
            g = torch.Generator().manual_seed(e)
            xin = torch.randn((x.shape[0], trellis.shape[0] * 16), generator=g).half().to(dev)
        got = gemm32(xin, bl.linear.weight).double()
        ref = exl3ref.exl3_gemm(ext, xin, trellis, bl.suh, bl.svh).double()
        rel = float((got - ref).norm() / ref.norm())
        worst = max(worst, rel)
        if rel > exl3ref.GEMM_REL_TOL and first is None:
            first = {
                "where": f"{where} exl3_gemm",
                "index": None,
                "got": rel,
                "want": exl3ref.GEMM_REL_TOL,
            }
        n += 1
    passed = tally.equal and first is None
    exact_txt = "bit for bit" if tally.equal else "NOT bit for bit"
    return Check(
        "exllamav3-agreement",
        passed,
        f"{n} linears: Ŵ equal to ext.reconstruct {exact_txt}; x @ W_eff vs exl3_gemm relative "
        f"L2 {worst:.3g} (limit {exl3ref.GEMM_REL_TOL:g})",
        tally.max_abs,
        tally.first_difference or first,
        {"gemm_rel_l2": worst},
    )
