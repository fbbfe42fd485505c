"""`exl3tool verify-swap`: prove hot swaps, rollbacks and TP slicing bit for bit.

Every rank runs `rank_checks` (the same sequence, collectives in lockstep); rank results are merged
into one report: a check passes only if it passed on every rank.

Checks (issue 6): 1 hot-load == cold build; 2 deactivate restores the base (max_abs 0.0);
3 a staging failure leaves the base untouched, a failure after the pause rolls back bit for bit;
4 swap A → B == cold B; 5 TP: rank weights concatenate to the TP=1 weights, TP=N outputs match
TP=1 within TP_MAX_ABS_REL / TP_REL_L2; 6 quality ladder; 7 exllamav3 agreement (CUDA).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from exl3tool.rules.errors import InputError
from exl3tool.runtime import cold, quality
from exl3tool.runtime.base import BaseModel, base_geometry, load_base, open_base
from exl3tool.runtime.compare import Tally, compare
from exl3tool.runtime.distributed import Comm, env_world, from_env, launch_local
from exl3tool.runtime.engine import RolledBack, StagingFailed, SwapEngine
from exl3tool.runtime.linear import set_precision_policy
from exl3tool.runtime.moe import Routing, moe_forward, route, tokens_needed

SCHEMA = "exl3tool-verify/1"
# TP=N vs TP=1 (check 5): the row-parallel down projection sums N fp32 partials instead of one
# fp32 accumulation, and gate/up GEMMs of other widths may block K differently, so fp16 outputs
# can differ by a few ulps. Documented limits, relative to the TP=1 output:
TP_MAX_ABS_REL = 2.0**-7  # max |Δ| ≤ 2^-7 · max |y_tp1|  (≈ 16 fp16 ulps at the peak)
TP_REL_L2 = 1e-3  # ‖Δ‖₂ / ‖y_tp1‖₂


@dataclass
class VerifyOptions:
    base: Path
    adapter: Path
    adapter_b: Path | None = None
    tp: int = 1
    device: str = "cpu"
    layers: list[int] | None = None  # None: every layer the adapters select
    tokens: int = 8
    seed: int = 0
    dense: Path | None = None
    work_dir: Path | None = None
    threads: int | None = None  # CPU threads per rank (default: torch's, or cores / TP per rank)
    # test hooks: a callable run on each rank's engine right after it is built (fault injection,
    # monkeypatching); must be picklable for spawned ranks (a module-level function)
    engine_hook: Callable[[SwapEngine], None] | None = None


@dataclass
class Check:
    name: str
    passed: bool | None  # None: skipped
    detail: str
    max_abs: float | None = None
    first_difference: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "passed": self.passed,
            "detail": self.detail,
            "max_abs": self.max_abs,
            "first_difference": self.first_difference,
        }
        out.update(self.extra)
        return out


@dataclass
class RankResult:
    rank: int
    checks: list[Check]
    quality: list[dict[str, Any]]
    timings: dict[str, float]
    layers: list[int]
    notes: list[str]


@dataclass
class VerifyReport:
    tp: int
    device: str
    layers: list[int]
    checks: list[Check]
    quality: list[dict[str, Any]]
    timings: dict[str, float]
    notes: list[str]

    @property
    def passed(self) -> bool:
        return all(c.passed is not False for c in self.checks)

    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "tp": self.tp,
            "device": self.device,
            "layers": self.layers,
            "passed": self.passed,
            "checks": [c.to_json() for c in self.checks],
            "quality": self.quality,
            "timings": {k: round(v, 4) for k, v in self.timings.items()},
            "notes": self.notes,
        }


# --- timing ---------------------------------------------------------------------------------


class Timer:
    """Wall time per category (decode / gemm / checks), synchronizing CUDA at the boundaries."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.total: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, what: str) -> Iterator[None]:
        self._sync()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.total[what] = self.total.get(what, 0.0) + time.perf_counter() - t0

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


# --- helpers ---------------------------------------------------------------------------------


def parse_layers(spec: str | None) -> list[int] | None:
    """`3`, `3,5`, `3-6`, `all` (None)."""
    if spec is None or spec.strip() in ("", "all"):
        return None
    out: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        if "-" in part:
            a, b = part.split("-", 1)
            lo, hi = int(a), int(b)
            if hi < lo:
                raise ValueError(f"empty layer range {part!r}")
            out.update(range(lo, hi + 1))
        else:
            out.add(int(part))
    return sorted(out)


def adapter_layers(adapter: Path) -> list[int]:
    """`selected_layers` of a cartridge, read strictly: a defective manifest is an InputError,
    like a defective base (open_base), never a traceback or a hang on a FIFO."""
    from exl3tool.io.jsonfile import read_json
    from exl3tool.rules.registry import Findings

    path = Path(adapter) / "adapter_config.json"
    findings = Findings()
    try:
        m = read_json(path, findings, path.name) if path.is_file() else None
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror or exc}") from exc
    layers = m.get("selected_layers", []) if m is not None else None
    if not isinstance(layers, list) or not all(type(x) is int for x in layers):
        errs = findings.errors()
        first = f"{errs[0].code} {errs[0].message}" if errs else "no usable selected_layers"
        raise InputError(f"{adapter}: not a readable MSRT cartridge ({first})")
    return sorted(layers)


def pick_layers(opts: VerifyOptions, moe_layers: list[int]) -> list[int]:
    wanted = set(adapter_layers(opts.adapter))
    if opts.adapter_b is not None:
        wanted |= set(adapter_layers(opts.adapter_b))
    if opts.layers is not None:
        wanted = set(opts.layers)
    missing = sorted(wanted - set(moe_layers))
    if missing:
        raise ValueError(f"layers {missing} are not MoE layers of the base")
    return sorted(wanted)


def corrupt_copy(adapter: Path, out: Path) -> Path:
    """A copy of `adapter` with one byte flipped in the payload of its first shard.

    Untouched shards are hard links (never written to); the flipped shard is a real copy.
    """
    import json

    out.mkdir(parents=True)
    manifest = json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8"))
    first = manifest["shards"][0]["path"]
    for src in sorted(adapter.rglob("*")):
        rel = src.relative_to(adapter)
        dst = out / rel
        if src.is_dir():
            dst.mkdir(parents=True, exist_ok=True)
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if rel.as_posix() == first:
            shutil.copyfile(src, dst)
            with open(dst, "r+b") as fh:
                header = int.from_bytes(fh.read(8), "little")
                fh.seek(8 + header)
                b = fh.read(1)
                fh.seek(8 + header)
                fh.write(bytes([b[0] ^ 0x01]))
        else:
            try:
                os.link(src, dst)
            except OSError:
                shutil.copyfile(src, dst)
    return out


def load_dense(path: Path, layers: list[int], device: torch.device) -> dict[int, dict]:
    """Dense HF weights `model.layers.{L}.mlp.experts.{E}.{proj}.weight` [out, in] -> [in, out]."""
    from safetensors import safe_open

    files = [path] if path.is_file() else sorted(path.glob("*.safetensors"))
    out: dict[int, dict] = {L: {} for L in layers}
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():  # noqa: SIM118 - safe_open is not a mapping
                parts = name.split(".")
                if len(parts) != 8 or parts[-1] != "weight" or parts[4] != "experts":
                    continue
                L = int(parts[2])
                if L in out:
                    out[L][(int(parts[5]), parts[6])] = st.get_tensor(name).t().float().to(device)
    return out


# --- the checks on one rank -----------------------------------------------------------------


@dataclass
class Inputs:
    x: dict[int, torch.Tensor]
    routing: dict[int, Routing]
    experts: list[int]


def make_inputs(base: BaseModel, opts: VerifyOptions, device: torch.device) -> Inputs:
    xs, rs = {}, {}
    for L in base.layers:
        router = base.routers.get(L)
        T = (
            opts.tokens
            if router is not None
            else tokens_needed(opts.tokens, base.num_experts, base.topk)
        )
        g = torch.Generator().manual_seed(opts.seed * 1000003 + L)
        x = torch.randn((T, base.hidden), generator=g).half().to(device)
        xs[L] = x
        rs[L] = route(x, router, base.num_experts, base.topk, opts.seed + L)
    return Inputs(xs, rs, list(range(base.num_experts)))


Outputs = dict[int, tuple[torch.Tensor, torch.Tensor]]


def hot_outputs(engine: SwapEngine, inp: Inputs) -> Outputs:
    return {
        L: (engine.forward(L, x, inp.routing[L]), engine.probe(L, x, inp.experts))
        for L, x in inp.x.items()
    }


def cold_outputs(
    weights: dict[int, cold.ColdLayer], inp: Inputs, hidden: int, rank: int, world: int, reduce
) -> Outputs:
    from exl3tool.runtime.moe import expert_probe

    out = {}
    for L, x in inp.x.items():
        fn = cold.expert_fn(weights[L], rank, world)
        out[L] = (
            moe_forward(x, inp.routing[L], fn, reduce, hidden),
            expert_probe(x, inp.experts, fn, reduce),
        )
    return out


def exact(got: Outputs, want: Outputs, tally: Tally | None = None) -> Tally:
    t = tally or Tally()
    for L in sorted(want):
        t.add(compare(got[L][0], want[L][0], f"layer {L} block output"))
        t.add(compare(got[L][1], want[L][1], f"layer {L} expert probe"))
    return t


def check_from(
    name: str, tally: Tally, ok_detail: str, extra_ok: bool = True, why: str = ""
) -> Check:
    passed = tally.equal and extra_ok
    detail = ok_detail if passed else (why or f"outputs differ ({ok_detail})")
    return Check(name, passed, detail, tally.max_abs, tally.first_difference)


def _same(a: Any, b: Any) -> bool:
    return a == b


def rank_checks(comm: Comm, opts: VerifyOptions) -> RankResult:
    """Every check on this rank (all ranks call this in lockstep)."""
    set_precision_policy()
    prev_threads = torch.get_num_threads()
    if opts.threads is not None and comm.device.type == "cpu":
        torch.set_num_threads(opts.threads)
    try:
        return _rank_checks(comm, opts)
    finally:
        torch.set_num_threads(prev_threads)


def _rank_checks(comm: Comm, opts: VerifyOptions) -> RankResult:
    dev = comm.device
    timer = Timer(dev)
    checks: list[Check] = []
    notes: list[str] = []
    world, rank = comm.world_size, comm.rank
    _ckpt, cfg = open_base(opts.base)
    moe_layers = base_geometry(cfg, opts.base)[5]
    layers = pick_layers(opts, moe_layers)
    work = Path(tempfile.mkdtemp(prefix=f"exl3tool-verify-r{rank}-", dir=opts.work_dir))
    try:
        with timer("decode.base"):
            base = load_base(opts.base, layers, rank, world, dev)
        engine = SwapEngine(base, comm, dev, work_root=work)
        if opts.engine_hook is not None:
            opts.engine_hook(engine)
        inp = make_inputs(base, opts, dev)
        reduce = comm.all_reduce_sum
        with timer("gemm"):
            base0 = hot_outputs(engine, inp)
        routed = sum(len(r.routed_experts()) for r in inp.routing.values())
        src = {r.source for r in inp.routing.values()}
        notes.append(
            f"router: {', '.join(sorted(src))}; {routed} (layer, expert) pairs routed of "
            f"{len(layers) * base.num_experts}; every expert is also probed on every token"
        )

        # 1. hot load == cold build -------------------------------------------------------
        # the hot load goes first: an adapter that staging refuses stops here, with staging's
        # findings in the detail, before the cold build would read a defective file
        import hashlib

        sha_a = hashlib.sha256((opts.adapter / "adapter_config.json").read_bytes()).hexdigest()
        with timer("checks"):
            err = None
            try:
                engine.load(opts.adapter)
            except (StagingFailed, RolledBack) as exc:
                err = str(exc)
        if err is not None:
            checks.append(Check("hot-load-equals-cold", False, f"load failed: {err}"))
            notes.append("the adapter could not be loaded; no other check was run")
            return _finish(rank, checks, [], timer, layers, notes, engine)
        with timer("decode.cold"):
            cold_a = cold.build(opts.base, opts.adapter, layers, dev)
        with timer("gemm"):
            want_a = cold_outputs(cold_a, inp, base.hidden, rank, world, reduce)
        with timer("gemm"):
            hot_a = hot_outputs(engine, inp)
        st = engine.status()
        named = st["adapter"] is not None and st["adapter"]["manifest_sha256"] == sha_a
        t = exact(hot_a, want_a)
        detail = (
            f"{t.compared} tensors over {len(layers)} layer(s) on {world} rank(s) equal; "
            f"status names {sha_a[:12]} {st['adapter']['assembly'] if st['adapter'] else ''} "
            f"{st['adapter']['labels'] if st['adapter'] else ''}"
        )
        changed = not exact(hot_a, base0).equal
        checks.append(
            check_from(
                "hot-load-equals-cold",
                t,
                detail,
                named and changed,
                None
                if t.equal and named and changed
                else (
                    "outputs differ from the cold build"
                    if not t.equal
                    else "status does not name the adapter"
                    if not named
                    else "the cartridge changed no output"
                ),
            )
        )

        # 5a. TP: rank weights concatenate to the TP=1 weights ------------------------------
        if world > 1:
            with timer("checks"):
                checks.append(tp_weight_check(engine, cold_a, base, comm))

        # 5b. TP=N vs TP=1 within tolerance --------------------------------------------------
        if world > 1:
            with timer("gemm"):
                tp1 = cold_outputs(cold_a, inp, base.hidden, 0, 1, lambda t: t)
            checks.append(tp_tolerance_check(hot_a, tp1, world))

        # 2. deactivate restores the base ----------------------------------------------------
        with timer("checks"):
            released = engine.deactivate()
        with timer("gemm"):
            after = hot_outputs(engine, inp)
        t = exact(after, base0)
        inactive = not engine.status()["active"]
        checks.append(
            check_from(
                "deactivate-restores-base",
                t,
                f"{released} layer(s) released; base outputs equal, max_abs 0.0",
                inactive,
                "outputs after deactivate differ from the base" if not t.equal else "still active",
            )
        )

        # 3. failed staging / rollback -------------------------------------------------------
        with timer("checks"):
            checks.append(failure_check(engine, inp, base0, opts, work))

        # 4. swap A -> B == cold B ------------------------------------------------------------
        if opts.adapter_b is not None:

            def cold_b_outputs() -> Outputs:
                with timer("decode.cold"):
                    cold_b = cold.build(opts.base, opts.adapter_b, layers, dev)
                with timer("gemm"):
                    return cold_outputs(cold_b, inp, base.hidden, rank, world, reduce)

            checks.append(swap_check(engine, inp, cold_b_outputs, base0, opts, timer))

        # 6. quality ladder (rank 0 holds the full cold weights like every rank; one suffices)
        qual: list[dict[str, Any]] = []
        with timer("checks"):
            check, qual = quality_check(opts, cold_a, layers, base, dev)
        checks.append(check)

        # 7. exllamav3 ---------------------------------------------------------------------
        with timer("checks"):
            checks.append(exllamav3_check(opts, base, cold_a, inp, dev, rank))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _finish(rank, checks, qual, timer, layers, notes, engine)


def _finish(
    rank: int,
    checks: list[Check],
    qual: list[dict[str, Any]],
    timer: Timer,
    layers: list[int],
    notes: list[str],
    engine: SwapEngine,
) -> RankResult:
    # engine.load ran under "checks"; its prepare step is stage decoding
    prep = engine.seconds.get("prepare", 0.0)
    timer.total["decode.prepare"] = prep
    timer.total["decode"] = sum(v for k, v in timer.total.items() if k.startswith("decode."))
    timer.total["checks"] = max(0.0, timer.total.get("checks", 0.0) - prep)
    timer.total["staging"] = engine.seconds.get("stage", 0.0)
    return RankResult(rank, checks, qual, timer.total, layers, notes)


def tp_weight_check(engine: SwapEngine, cold_a: dict, base: BaseModel, comm: Comm) -> Check:
    """Gather every rank's decoded weights (base and stages) and compare with the TP=1 ones."""
    pieces = {}
    for L in base.layers:
        for (e, p), ws in sorted(engine.local_weights(L).items()):
            pieces[(L, e, p)] = [comm.all_gather(w) for w in ws]
    return concat_check(pieces, cold_a, comm.world_size)


def concat_check(
    pieces: dict[tuple[int, int, str], list[list[torch.Tensor]]], cold_a: dict, world: int
) -> Check:
    """pieces: (layer, expert, proj) -> per weight (base, then stages) the rank slices in rank
    order; they must concatenate (gate/up on the output axis, down on the input axis) to the
    full TP=1 effective weights bit for bit."""
    tally = Tally()
    for (L, e, p), per_weight in sorted(pieces.items()):
        full = [cold_a[L].base[(e, p)], *(w for _l, _i, w in cold_a[L].stages[(e, p)])]
        if len(per_weight) != len(full):
            tally.add(
                compare(
                    torch.zeros(len(per_weight)),
                    torch.zeros(len(full)),
                    f"layer {L} expert {e} {p}: stage count",
                )
            )
            continue
        for s, (parts, ref) in enumerate(zip(per_weight, full, strict=True)):
            cat = torch.cat(parts, dim=0 if p == "down_proj" else 1)
            what = "base" if s == 0 else f"stage {s}"
            tally.add(compare(cat, ref, f"layer {L} expert {e} {p} {what} W_eff"))
    return check_from(
        "tp-weights-concatenate",
        tally,
        f"{tally.compared} effective weights: the {world} rank slices concatenate to the TP=1 "
        "weights bit for bit",
    )


def tp_tolerance_check(hot: Outputs, tp1: Outputs, world: int) -> Check:
    worst_abs, worst_rel, worst_ratio = 0.0, 0.0, 0.0
    first = None
    for L in sorted(tp1):
        for i, what in enumerate(("block output", "expert probe")):
            got, want = hot[L][i].double(), tp1[L][i].double()
            d = (got - want).abs()
            peak = float(want.abs().max())
            mx = float(d.max())
            rel = float((got - want).norm() / want.norm()) if float(want.norm()) > 0 else 0.0
            worst_abs, worst_rel = max(worst_abs, mx), max(worst_rel, rel)
            ratio = mx / peak if peak > 0 else 0.0
            worst_ratio = max(worst_ratio, ratio)
            if (ratio > TP_MAX_ABS_REL or rel > TP_REL_L2) and first is None:
                flat = int(torch.argmax(d.reshape(-1)))
                first = {
                    "where": f"layer {L} {what}",
                    "index": [int(x) for x in torch.unravel_index(torch.tensor(flat), d.shape)],
                    "got": float(got.reshape(-1)[flat]),
                    "want": float(want.reshape(-1)[flat]),
                }
    passed = first is None
    return Check(
        "tp-matches-tp1",
        passed,
        f"TP={world} vs TP=1: max_abs {worst_abs:.3g} ({worst_ratio:.3g} of the peak, limit "
        f"{TP_MAX_ABS_REL:.3g}), relative L2 {worst_rel:.3g} (limit {TP_REL_L2:g})",
        worst_abs,
        first,
        {"rel_l2": worst_rel},
    )


def failure_check(
    engine: SwapEngine, inp: Inputs, base0: Outputs, opts: VerifyOptions, work: Path
) -> Check:
    problems: list[str] = []
    tally = Tally()
    # (a) one flipped byte in a copy: staging must refuse it before any pause
    bad = corrupt_copy(opts.adapter, work / "corrupt")
    n_events = len(engine.events)
    try:
        engine.load(bad)
        problems.append("a corrupted copy was loaded")
    except StagingFailed:
        pass
    except RolledBack:
        problems.append("a corrupted copy passed staging (rolled back after the pause)")
    if "pause" in engine.events[n_events:]:
        problems.append("the engine paused for an adapter that failed staging")
    exact(hot_outputs(engine, inp), base0, tally)
    # (b) a failure injected after the pause: rollback must restore the base bit for bit
    saved = engine.fault_at
    engine.fault_at = "activate"
    try:
        engine.load(opts.adapter)
        problems.append("the injected fault did not fail the load")
    except RolledBack:
        pass
    except StagingFailed as exc:
        problems.append(f"staging failed instead: {exc}")
    finally:
        engine.fault_at = saved
    if engine.status()["active"]:
        problems.append(f"layers {engine.status()['layers']} still active after the rollback")
    exact(hot_outputs(engine, inp), base0, tally)
    # leave the engine in its base state for the next check
    engine.restore_base()
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
    inp: Inputs,
    cold_b: Callable[[], Outputs],
    base0: Outputs,
    opts: VerifyOptions,
    timer: Timer,
) -> Check:
    """Load A, then B over it: B must equal its cold build (computed only once B has passed
    staging), common layers reuse A's runtimes, A-only layers are released."""
    problems: list[str] = []
    with timer("checks"):
        try:
            engine.load(opts.adapter)
            layers_a = set(engine.active)
            ids_a = {L: id(rt) for L, rt in engine.active.items()}
            info = engine.load(opts.adapter_b)
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
        got = hot_outputs(engine, inp)
    tally = exact(got, cold_b())
    engine.deactivate()
    if not exact(hot_outputs(engine, inp), base0).equal:
        problems.append("deactivate after the swap does not restore the base")
    if not tally.equal:
        problems.insert(0, "outputs after A → B differ from the cold build of B")
    return Check(
        "swap-a-to-b-equals-cold-b",
        not problems,
        "; ".join(problems)
        or f"{tally.compared} tensors equal; {len(reused)} common layer(s) reused, "
        f"{len(layers_a - set(info.layers))} released",
        tally.max_abs,
        tally.first_difference,
    )


def quality_check(
    opts: VerifyOptions, cold_a: dict, layers: list[int], base: BaseModel, dev: torch.device
) -> tuple[Check, list[dict[str, Any]]]:
    import json

    m = json.loads((opts.adapter / "adapter_config.json").read_text(encoding="utf-8"))
    chain_k = {c["label"]: int(c["k"]) for c in m["chain"]}
    dense = load_dense(opts.dense, layers, dev) if opts.dense is not None else None
    rows: list[dict[str, Any]] = []
    for L in layers:
        weights = {key: (w0, cold_a[L].stages[key]) for key, w0 in cold_a[L].base.items()}
        stats = quality.ladder(
            L, m["base"]["label"], base.k, chain_k, weights, dense[L] if dense else None
        )
        rows.extend(s.to_json() for s in stats)
    failed = [r for r in rows if not r["passed"]]
    if failed:
        f = failed[0]
        detail = f"layer {f['layer']} stage {f['label']}: {f['failures'][0]}"
    else:
        ladder = ", ".join(
            f"{r['label']}(K{r['k']}) {r['correction_ratio_max']:.3g}"
            for r in rows
            if r["correction_ratio_max"] is not None and r["layer"] == rows[0]["layer"]
        )
        detail = f"corrections fall along the chain (max ‖c_s‖/‖W_0‖ per stage: {ladder})"
        if dense is not None:
            detail += "; error vs the dense reference falls"
    return Check("quality-ladder", not failed, detail), rows


def exllamav3_check(
    opts: VerifyOptions, base: BaseModel, cold_a: dict, inp: Inputs, dev: torch.device, rank: int
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
        tally.add(
            compare(
                exl3ref.ours_rotated(trellis),
                exl3ref.reconstruct(ext, trellis),
                f"layer {L} expert {e} {p} Ŵ (rank {rank})",
            )
        )
        xin = (
            x
            if p != "down_proj"
            else torch.randn(
                (x.shape[0], trellis.shape[0] * 16), generator=torch.Generator().manual_seed(e)
            )
            .half()
            .to(dev)
        )
        got = gemm32(xin, bl.linear.weight).double()
        ref = exl3ref.exl3_gemm(ext, xin, trellis, bl.suh, bl.svh).double()
        rel = float((got - ref).norm() / ref.norm())
        worst = max(worst, rel)
        if rel > exl3ref.GEMM_REL_TOL and first is None:
            first = {
                "where": f"layer {L} expert {e} {p} exl3_gemm",
                "index": None,
                "got": rel,
                "want": exl3ref.GEMM_REL_TOL,
            }
        n += 1
    passed = tally.equal and first is None
    return Check(
        "exllamav3-agreement",
        passed,
        f"{n} linears: Ŵ equal to ext.reconstruct {'bit for bit' if tally.equal else 'NOT bit for bit'}; "
        f"x @ W_eff vs exl3_gemm relative L2 {worst:.3g} (limit {exl3ref.GEMM_REL_TOL:g})",
        tally.max_abs,
        tally.first_difference or first,
        {"gemm_rel_l2": worst},
    )


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


def run_verify(opts: VerifyOptions) -> VerifyReport:
    """Run every check on `opts.tp` ranks (spawned locally, or the torchrun group if present)."""
    t0 = time.perf_counter()
    found = env_world()
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
    report = merge(results, opts, world)
    report.timings["total"] = time.perf_counter() - t0
    return report
