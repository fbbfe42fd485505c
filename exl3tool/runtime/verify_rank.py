"""What one rank of verify-swap runs: every check, one layer at a time (issue 16).

Each adapter is staged once per rank (`SwapEngine.stage_once`: verified private copy and every
layer's tables); then for each layer: decode that layer of the base (hot) → load the staged adapter
→ one streaming cold pass (one cold expert at a time, `verify_steps.cold_pass`) → the checks →
release everything. Peak memory is therefore one decoded layer (hot base + its stage terms) plus one
cold expert, whatever the number of layers. All ranks walk the same layers and experts in lockstep.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from exl3tool.io.atomic import remove_tree
from exl3tool.runtime import verify_steps as vs
from exl3tool.runtime.base import base_geometry, load_base, open_base
from exl3tool.runtime.cold import ColdIndex
from exl3tool.runtime.compare import Tally
from exl3tool.runtime.distributed import Comm
from exl3tool.runtime.engine import RolledBack, StageAhead, Staged, StagingFailed, SwapEngine
from exl3tool.runtime.layer_progress import LayerProgress
from exl3tool.runtime.verify_layer_checks import (
    exllamav3_check,
    failure_check,
    merge_layer_checks,
    quality_check,
    swap_check,
)
from exl3tool.runtime.verify_parts import (
    Check,
    RankResult,
    Timer,
    VerifyOptions,
    check_from,
    corrupt_copy,
    corrupt_layout,
    load_dense,
    pick_layers,
    tp_tolerance_check,
)
from exl3tool.runtime.warmup import start_warmup

PHASES = ("decode base", "load", "cold pass", "checks")


@dataclass
class RankRun:
    """State of one rank across layers."""

    comm: Comm
    opts: VerifyOptions
    timer: Timer
    work: Path
    layers: list[int]
    sha_a: str
    opened_base: tuple[Any, dict[str, Any]] | None = None  # the base, parsed once per rank
    manifest: dict[str, Any] = field(default_factory=dict)
    # the cold side opens the adapters' files only once staging accepted them: a defective
    # cartridge is staging's finding, never a safetensors error of the cold reader
    cold_a: ColdIndex | None = None
    cold_b: ColdIndex | None = None
    staged_a: Staged | None = None
    staged_b: Staged | None = None
    # stagings started on threads at the start (A, B, the drill's corrupted copy of A): they
    # overlap the first layer's base decode; each is consumed once, or discarded at the end
    ahead: dict[str, StageAhead] = field(default_factory=dict)
    hot: Tally = field(default_factory=Tally)
    concat: Tally = field(default_factory=Tally)
    table_entries: int = 0
    named: bool = True
    changed: bool = False
    per_layer: dict[str, list[tuple[int, Check]]] = field(default_factory=dict)
    stats: dict[tuple[int, int], Any] = field(default_factory=dict)
    routed: int = 0
    experts: int = 0
    drilled: bool = False
    load_error: str | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(self, layer: int, check: Check) -> None:
        self.per_layer.setdefault(check.name, []).append((layer, check))

    def absorb(self, engine: SwapEngine) -> None:
        for k, v in engine.seconds.items():
            self.seconds[k] = self.seconds.get(k, 0.0) + v
        engine.seconds.clear()


def rank_checks(comm: Comm, opts: VerifyOptions) -> RankResult:
    """Every check on this rank (all ranks call this in lockstep)."""
    from exl3tool.runtime.linear import set_precision_policy

    set_precision_policy()
    prev_threads = torch.get_num_threads()
    if opts.threads is not None and comm.device.type == "cpu":
        torch.set_num_threads(opts.threads)
    work = Path(tempfile.mkdtemp(prefix=f"exl3tool-verify-r{comm.rank}-", dir=opts.work_dir))
    try:
        return _rank_checks(comm, opts, work)
    finally:
        remove_tree(work)  # whole, even when an interrupt comes meanwhile
        torch.set_num_threads(prev_threads)


def _rank_checks(comm: Comm, opts: VerifyOptions, work: Path) -> RankResult:
    import hashlib

    opened = open_base(opts.base)
    layers = pick_layers(opts, base_geometry(opened[1], opts.base)[5])
    manifest_bytes = (opts.adapter / "adapter_config.json").read_bytes()
    run = RankRun(
        comm,
        opts,
        Timer(comm.device),
        work,
        layers,
        hashlib.sha256(manifest_bytes).hexdigest(),
        opened_base=opened,
    )
    progress = LayerProgress(len(layers), PHASES, enabled=opts.progress and comm.rank == 0)
    adapters = [a for a in (opts.adapter, opts.adapter_b) if a is not None]
    warmup = start_warmup(comm.device, opened[0], adapters)
    _stage_ahead(run, base_geometry(opened[1], opts.base)[2])
    try:
        with progress:
            for i, L in enumerate(layers):
                t0 = time.perf_counter()
                if not _verify_layer(run, L, i, progress):
                    break
                progress.layer_done(L, time.perf_counter() - t0)
    finally:
        if warmup is not None:
            warmup.stop()
        for ahead in run.ahead.values():  # stagings nobody used: stopped at their next chunk
            ahead.discard(cancel=True)
        for st in (run.staged_a, run.staged_b):
            if st is not None:
                SwapEngine.drop_staged(st)
    return _finish(run)


def _stage_ahead(run: RankRun, experts: int) -> None:
    opts, comm = run.opts, run.comm

    def ahead(adapter: Path, prepare=None) -> StageAhead:
        return StageAhead(
            adapter, opts.base, comm.rank, comm.world_size, experts, run.work, prepare
        )

    # the drill's links first: each changes its source's ctime, which A's staging would report.
    # A manifest too broken to lay out is staging's finding; the drill then never runs.
    try:
        write_flipped = corrupt_layout(opts.adapter, run.work / "corrupt")
    except Exception:  # any manifest it cannot read (deep nesting included): no drill ahead
        shutil.rmtree(run.work / "corrupt", ignore_errors=True)
        write_flipped = None
    run.ahead["a"] = ahead(opts.adapter)
    if opts.adapter_b is not None:
        run.ahead["b"] = ahead(opts.adapter_b)
    if write_flipped is not None:
        run.ahead["corrupt"] = ahead(run.work / "corrupt", write_flipped)


def _stage_adapters(run: RankRun, engine: SwapEngine) -> bool:
    """Stage A (and B) once for every layer; False when A is refused (the run stops)."""
    with run.timer("checks"):
        try:
            run.staged_a = engine.stage_once(run.opts.adapter, run.ahead.pop("a", None))
        except StagingFailed as exc:
            run.load_error = f"load failed: {exc}"
            return False
        if run.opts.adapter_b is not None:
            try:
                run.staged_b = engine.stage_once(run.opts.adapter_b, run.ahead.pop("b", None))
            except StagingFailed as exc:
                run.notes.append(f"adapter B was refused by staging: {exc}")
    run.cold_a = ColdIndex(run.opts.base, run.opts.adapter)
    run.manifest = run.cold_a.manifest
    if run.staged_b is not None and run.opts.adapter_b is not None:
        run.cold_b = ColdIndex(run.opts.base, run.opts.adapter_b)
    return True


def _verify_layer(run: RankRun, L: int, i: int, progress: LayerProgress) -> bool:
    opts, comm, timer = run.opts, run.comm, run.timer
    dev = comm.device
    progress.phase(L, "decode base")
    with timer("decode.base"):
        base = load_base(opts.base, [L], comm.rank, comm.world_size, dev, opened=run.opened_base)
    engine = SwapEngine(base, comm, dev, work_root=run.work)
    if opts.engine_hook is not None:
        opts.engine_hook(engine)
    if run.staged_a is None and not _stage_adapters(run, engine):
        run.absorb(engine)
        return False
    assert run.staged_a is not None
    inp = vs.make_inputs(base, opts.tokens, opts.seed, dev)
    with timer("gemm"):
        base0 = vs.hot_outputs(engine, inp)
    run.routed += len(inp.routing[L].routed_experts())
    run.experts += base.num_experts
    progress.phase(L, "load")
    with timer("checks"):
        try:
            engine.load_staged(run.staged_a)
        except (StagingFailed, RolledBack) as exc:
            run.load_error = f"layer {L}: load failed: {exc}"
            run.absorb(engine)
            return False
    st = engine.status()
    run.named &= st["adapter"] is not None and st["adapter"]["manifest_sha256"] == run.sha_a
    with timer("gemm"):
        hot_a = vs.hot_outputs(engine, inp)
    run.changed |= not vs.exact(hot_a, base0).equal
    progress.phase(L, "cold pass")
    _cold_a(run, engine, base, inp, hot_a)
    progress.phase(L, "checks")
    _after_load(run, engine, inp, base0, L)
    with timer("checks"):
        run.add(L, exllamav3_check(opts, base, inp, dev, comm.rank) if i == 0 else _skip_ext())
    run.absorb(engine)
    engine.restore_base()
    for index in (run.cold_a, run.cold_b):
        if index is not None:
            index.release()
    del engine, base
    return True


def _skip_ext() -> Check:
    return Check("exllamav3-agreement", None, "checked on the first layer")


def _cold_a(run: RankRun, engine: SwapEngine, base, inp: vs.Inputs, hot_a: vs.Outputs) -> None:
    opts, comm, L = run.opts, run.comm, base.layers[0]
    dense = load_dense(opts.dense, [L], comm.device)[L] if opts.dense is not None else None
    chain_k = {c["label"]: int(c["k"]) for c in run.manifest["chain"]}
    assert run.cold_a is not None  # set once staging accepted A
    spec = vs.ColdPassSpec(
        run.cold_a,
        L,
        inp,
        comm,
        comm.device,
        engine=engine,
        tp1=comm.world_size > 1,
        ladder=vs.ladder_fn(L, run.manifest["base"]["label"], base.k, chain_k, dense),
    )
    with run.timer("decode.cold"):
        res = vs.cold_pass(spec)
    run.table_entries += res.tables.compared
    # the first difference of a layer is a table's when one differs: tables come first
    for tally in (res.tables, vs.exact(hot_a, res.outputs)):
        _fold(run.hot, tally)
    if comm.world_size > 1:
        _fold(run.concat, res.concat)
        run.add(L, tp_tolerance_check(hot_a, res.tp1, comm.world_size))
    vs.merge_stats(run.stats, res.quality)


def _fold(into: Tally, t: Tally) -> None:
    into.compared += t.compared
    into.max_abs = max(into.max_abs, t.max_abs)
    into.rel_l2 = max(into.rel_l2, t.rel_l2)
    if not t.equal:
        if into.equal:
            into.first_difference = t.first_difference
        into.equal = False


def _after_load(
    run: RankRun, engine: SwapEngine, inp: vs.Inputs, base0: vs.Outputs, L: int
) -> None:
    """Swap A → B (when given), deactivate, and the failure drills (once, on a layer of A)."""
    opts, timer = run.opts, run.timer
    if opts.adapter_b is not None:
        cold_index = run.cold_b

        def cold_b() -> vs.Outputs:
            assert cold_index is not None  # swap_check calls it only once B has loaded
            spec = vs.ColdPassSpec(cold_index, L, inp, run.comm, run.comm.device)
            with timer("decode.cold"):
                return vs.cold_pass(spec).outputs

        run.add(L, swap_check(engine, inp, cold_b, run.staged_b, timer))
    with timer("checks"):
        engine.deactivate()
    with timer("gemm"):
        after = vs.hot_outputs(engine, inp)
    t = vs.exact(after, base0)
    inactive = not engine.status()["active"]
    run.add(
        L,
        check_from(
            "deactivate-restores-base",
            t,
            "every layer released; base outputs equal, max_abs 0.0",
            inactive,
            "outputs after deactivate differ from the base" if not t.equal else "still active",
        ),
    )
    if not run.drilled and L in run.staged_a.info.layers:
        run.drilled = True
        with timer("checks"):
            ahead = run.ahead.pop("corrupt", None)
            bad = run.work / "corrupt"
            try:
                if ahead is None:  # its layout failed at the start (e.g. no space left)
                    bad = corrupt_copy(opts.adapter, bad)
                run.add(L, failure_check(engine, inp, base0, bad, run.staged_a, ahead))
            except (OSError, ValueError) as exc:
                why = f"skipped: the corrupted copy could not be made ({exc})"
                run.add(L, Check("failed-load-leaves-base", None, why))
            shutil.rmtree(bad, ignore_errors=True)


def _finish(run: RankRun) -> RankResult:
    world = run.comm.world_size
    timings = dict(run.timer.total)
    prep = run.seconds.get("prepare", 0.0)
    timings["decode.prepare"] = prep
    timings["decode"] = sum(v for k, v in timings.items() if k.startswith("decode."))
    timings["checks"] = max(0.0, timings.get("checks", 0.0) - prep)
    timings["staging"] = run.seconds.get("stage", 0.0)
    if run.load_error is not None:
        checks = [Check("hot-load-equals-cold", False, run.load_error)]
        notes = ["the adapter could not be loaded; no other check was run"]
        return RankResult(run.comm.rank, checks, [], timings, run.layers, notes)
    n = len(run.layers)
    ok = run.named and run.changed
    why = (
        None
        if run.hot.equal and ok
        else "runtime tables, effective weights or outputs differ from the cold build"
        if not run.hot.equal
        else "status does not name the adapter"
        if not run.named
        else "the cartridge changed no output"
    )
    checks = [
        check_from(
            "hot-load-equals-cold",
            run.hot,
            f"{run.table_entries} table entries and effective weights (inverse scales, stage "
            f"sets, K, W_eff) and {run.hot.compared - run.table_entries} outputs over {n} "
            f"layer(s) on {world} rank(s) equal bit for bit; status names {run.sha_a[:12]}",
            ok,
            why or "",
        )
    ]
    if world > 1:
        checks.append(
            check_from(
                "tp-weights-concatenate",
                run.concat,
                f"{run.concat.compared} effective weights: the {world} rank slices concatenate "
                "to the TP=1 weights bit for bit",
            )
        )
    names = ["tp-matches-tp1"] if world > 1 else []
    names += ["deactivate-restores-base", "failed-load-leaves-base"]
    names += ["swap-a-to-b-equals-cold-b"] if run.opts.adapter_b is not None else []
    for name in names:
        checks.append(merge_layer_checks(name, run.per_layer.get(name, [])))
    check, rows = quality_check(run.stats)
    checks.append(check)
    checks.append(merge_layer_checks("exllamav3-agreement", run.per_layer["exllamav3-agreement"]))
    notes = [
        f"layers streamed one at a time; {run.routed} (layer, expert) pairs routed of "
        f"{run.experts}; every expert is also probed on every token",
        *run.notes,
    ]
    return RankResult(run.comm.rank, checks, rows, timings, run.layers, notes)
