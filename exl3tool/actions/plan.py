"""`exl3tool plan`: the boot plan. Per TP rank, the weight bytes the serving runtime keeps
resident, by class, and how it claims each module; from configs and headers only (no torch, no
payload byte read).

The claim logic follows the runtime (docs/runtime-conformance.md): `override_quantization_method`
keeps the EXL3 config only for an exl3-trellis tail or the R7 block, unless another
`--quantization` is forced (then every EXL3 module falls to the unquantized method, BF16);
a MoE layer is claimed by the R7 range first, then the tail's range, then tensor_storage; a
linear by tensor_storage. Sizes per rank: split tensors are divided by TP (rounded up), the
replicated ones (rotation vectors on their hidden side, markers, 1-D tensors) counted whole.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from exl3tool.actions.counts import check_counts
from exl3tool.formats.checkpoint import Checkpoint, load_checkpoint
from exl3tool.formats.detect import Kind, detect
from exl3tool.formats.experts import expert_count, expert_table, model_config
from exl3tool.formats.names import layer_of
from exl3tool.formats.tail import config_tail, layer_range
from exl3tool.io.gcpause import paused_gc
from exl3tool.rules import plan as pl
from exl3tool.rules import r7 as r7_rules
from exl3tool.rules.errors import InputError, UsageError
from exl3tool.rules.registry import Findings

# How the runtime claims a module (docs/runtime-conformance.md, "boot plan").
TENSOR_STORAGE = "tensor_storage EXL3"
R7_EXPERTS = "R7 routed experts"
TAIL = "rank-sliced tail"
UNQUANTIZED = "unquantized"
FALLBACK = "unquantized fallback (BF16)"
MOE_FALLBACK = "unquantized MoE fallback (BF16)"

DENSE, TAIL_CLASS, PLAIN, BF16_DENSE, BF16_EXPERTS = (
    "EXL3 dense",
    "MTP/hybrid tail",
    "unquantized",
    "dense BF16 (fallback)",
    "routed BF16 (fallback)",
)
_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_IUNITS = {"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


@dataclass(frozen=True)
class PlanOptions:
    path: str
    tp: int
    gpu_memory: int | None = None  # bytes per GPU
    quantization: str | None = None  # what `--quantization` the runtime is started with


@dataclass
class Claim:
    method: str
    modules: set[str] = field(default_factory=set)
    nbytes: int = 0  # over all ranks

    def to_json(self) -> dict[str, Any]:
        example = min(self.modules) if self.modules else None
        return {"method": self.method, "modules": len(self.modules), "bytes": self.nbytes,
                "example": example}  # fmt: skip


@dataclass
class BootPlan:
    path: str
    kind: str
    tp: int
    quantization: str | None
    exl3_config: str  # "kept" or "discarded"
    reason: str
    gpu_memory: int | None
    ranks: list[dict[str, int]]  # class -> bytes, per rank
    claims: dict[str, Claim]
    findings: Findings

    def totals(self) -> list[int]:
        return [sum(r.values()) for r in self.ranks]

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "kind": self.kind,
            "tp": self.tp,
            "quantization": self.quantization,
            "exl3_config": self.exl3_config,
            "reason": self.reason,
            "gpu_memory": self.gpu_memory,
            "ranks": [
                {"rank": i, "bytes": dict(sorted(r.items())), "total": sum(r.values())}
                for i, r in enumerate(self.ranks)
            ],
            "claims": [c.to_json() for c in self.claims.values()],
            "findings": [f.to_json() for f in self.findings],
        }

    @property
    def exit_code(self) -> int:
        return 1 if self.findings.has_errors() else 0


MAX_MEMORY = 2**63 - 1


def parse_memory(text: str) -> int:
    """`96GiB`, `80GB`, `96G`, `1.5TiB` or a byte count -> bytes (UsageError otherwise)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kKmMgGtT]i?)?[bB]?\s*", text or "")
    if m is None:
        raise UsageError(f"--gpu-memory {text!r}: a size such as 96GiB, 80GB or 1.5TiB")
    unit = (m.group(2) or "").lower()
    scale = _IUNITS.get(unit) or _UNITS[unit]
    try:
        value = int(Fraction(m.group(1)) * scale)  # exact: a float of 400 digits is infinite
    except ValueError:  # more digits than Python converts
        raise UsageError(f"--gpu-memory {text[:40]!r}…: too many digits") from None
    if value <= 0:
        raise UsageError(f"--gpu-memory {text!r} must be positive")
    if value > MAX_MEMORY:
        raise UsageError(f"--gpu-memory {text!r} is beyond {MAX_MEMORY} bytes")
    return value


@dataclass
class _Context:
    """What the runtime decided from the configs before any weight is allocated."""

    kind: Kind
    tp: int
    kept: bool
    reason: str
    r7_range: tuple[int, int] | None
    tail_range: tuple[int, int] | None
    tail_sliced: bool  # tensors already carry `.rank{r}.` (legacy profile) vs full-rank base
    storage: dict[str, Any]  # the tensor_storage map the runtime holds (runtime_storage)


def _quant_dicts(ckpt: Checkpoint) -> list[dict[str, Any]]:
    return [q for q in (ckpt.embedded_quant, ckpt.quant_config) if isinstance(q, dict)]


def _decide(ckpt: Checkpoint, kind: Kind, tp: int, quantization: str | None) -> _Context:
    """Exl3Config.override_quantization_method and the config step, as the runtime runs them."""
    config = ckpt.config if isinstance(ckpt.config, dict) else {}
    tail = config_tail(config)
    tail = tail if tail is not None and tail.is_rank_sliced_format else None
    qs = _quant_dicts(ckpt)
    block = next((q["r7_routed_experts"] for q in qs if "r7_routed_experts" in q), None)
    stamp = next((q.get("quant_method") for q in qs if "quant_method" in q), None)
    if quantization is not None and quantization != "exl3":
        kept, reason = False, f"--quantization {quantization} is forced"
    elif tail is not None or isinstance(block, dict):
        kept, reason = True, "R7 block" if tail is None else "hybrid_tr3_tail (exl3-trellis)"
    elif quantization == "exl3" or stamp == "exl3":
        kept, reason = True, "tensor_storage (quant_method exl3)"
    else:
        kept = False
        reason = f"quant_method {stamp!r} with no R7 block and no exl3-trellis tail"
    from exl3tool.checks.conformance import runtime_storage

    storage = runtime_storage(ckpt)[0]  # as validate's EX022 reads it
    sliced = tail is not None and tail.runtime_profile is None
    return _Context(
        kind,
        tp,
        kept,
        reason,
        layer_range(block.get("moe_layers")) if isinstance(block, dict) else None,
        tail.moe_layers if tail is not None else None,
        sliced,
        storage,
    )


class _Tally:
    """Bytes per rank by class, and modules by claim method."""

    def __init__(self, tp: int) -> None:
        self.tp = tp
        self.ranks: list[dict[str, int]] = [defaultdict(int) for _ in range(tp)]
        self.claims: dict[str, Claim] = {}

    def split(self, klass: str, method: str, module: str, nbytes: int, divided: bool) -> None:
        share = -(-nbytes // self.tp) if divided else nbytes
        for r in self.ranks:
            r[klass] += share
        self._claim(method, module, share * self.tp)

    def on_rank(self, rank: int, klass: str, method: str, module: str, nbytes: int) -> None:
        self.ranks[rank][klass] += nbytes
        self._claim(method, module, nbytes)

    def add(
        self, klass: str, method: str, modules: list[str], share: int, rank: int | None
    ) -> None:
        """Bytes already summed per rank: `share` on every rank (rank None) or on `rank`."""
        for r in self.ranks if rank is None else [self.ranks[rank]]:
            r[klass] += share
        c = self.claims.setdefault(method, Claim(method))
        c.modules.update(modules)
        c.nbytes += share * (self.tp if rank is None else 1)

    def _claim(self, method: str, module: str, nbytes: int) -> None:
        c = self.claims.setdefault(method, Claim(method))
        c.modules.add(module)
        c.nbytes += nbytes


def _in(rng: tuple[int, int] | None, layer: int) -> bool:
    return rng is not None and rng[0] <= layer <= rng[1]


def _expert_method(ctx: _Context, layer: int, module: str) -> str:
    if not ctx.kept:
        return MOE_FALLBACK
    if _in(ctx.r7_range, layer):
        return R7_EXPERTS
    if _in(ctx.tail_range, layer):
        return TAIL
    return TENSOR_STORAGE if _storage_has(ctx, module) else MOE_FALLBACK


def _plan_experts(
    ckpt: Checkpoint, ctx: _Context, tally: _Tally, fallback: set[int]
) -> dict[str, Any]:
    """Routed-expert tensors, one entry per (expert, projection[, rank]) group. The hot path
    of a GLM-5.2 checkpoint (58,000 groups): per-layer claims are computed once, bytes summed
    locally and handed to the tally per (class, method). Returns the `…mlp.experts.*` names that
    are no expert component (planned with the rest)."""
    table = expert_table(ckpt.tensors)
    tp = ctx.tp
    per_layer: dict[int, str | None] = {}  # None: decided per module through tensor_storage
    acc: dict[tuple[str, str, int | None], list[Any]] = {}  # (class, method, rank) -> [bytes, mods]
    groups = [((L, e, p, None), parts) for (L, e, p), parts in table.plain.items()]
    groups += [((L, e, p, r), parts) for (L, e, p, r), parts in table.ranked.items()]
    for (layer, expert, proj, rank), parts in groups:
        method = per_layer.get(layer, "")
        module = f"model.layers.{layer}.mlp.experts.{expert}.{proj}"
        if method == "":
            method = per_layer[layer] = _layer_method(ctx, layer)
        if method is None:
            method = TENSOR_STORAGE if _storage_has(ctx, module) else MOE_FALLBACK
        if method == MOE_FALLBACK:
            fallback.add(layer)
            continue
        t = parts.get("trellis")
        k = t.info.shape[2] // 16 if t is not None and len(t.info.shape) == 3 else None
        klass = _klass(ctx, layer, k)
        if method == TAIL and ctx.tail_sliced and rank is not None:
            if rank < tp:  # other ranks' slices are dropped at load
                entry = acc.setdefault((klass, method, rank), [0, []])
                entry[0] += sum(r.info.end - r.info.begin for r in parts.values())
                entry[1].append(module)
            continue
        down = proj == "down_proj"
        share = 0
        for fld, r in parts.items():
            n = r.info.end - r.info.begin
            divided = fld == "trellis" or (fld == "svh" and not down) or (fld == "suh" and down)
            share += -(-n // tp) if divided else n
        entry = acc.setdefault((klass, method, None), [0, []])
        entry[0] += share
        entry[1].append(module)
    for (klass, method, rank), (nbytes, modules) in acc.items():
        tally.add(klass, method, modules, nbytes, rank)
    for (layer, rest), ref in table.layer_vectors.items():
        m = re.search(r"\.rank(\d+)\.", rest)
        vrank = int(m.group(1)) if m else None
        module = ref.name.rsplit(".", 1)[0]
        method = _expert_method(ctx, layer, module)
        if method == MOE_FALLBACK:
            fallback.add(layer)
        elif method == TAIL and ctx.tail_sliced and vrank is not None:
            if vrank < ctx.tp:
                tally.on_rank(vrank, _klass(ctx, layer, None), method, module, ref.info.nbytes)
        else:
            tally.split(_klass(ctx, layer, None), method, module, ref.info.nbytes, False)
    return table.other


def _layer_method(ctx: _Context, layer: int) -> str | None:
    """How a MoE layer is claimed, or None when tensor_storage decides module by module."""
    if not ctx.kept:
        return MOE_FALLBACK
    if _in(ctx.r7_range, layer):
        return R7_EXPERTS
    return TAIL if _in(ctx.tail_range, layer) else None


def _klass(ctx: _Context, layer: int, k: int | None) -> str:
    if ctx.kind is Kind.R7 and _in(ctx.tail_range, layer):
        return TAIL_CLASS
    return f"routed K{k}" if k else "routed vectors"


def _storage_has(ctx: _Context, prefix: str) -> bool:
    """Whether the runtime's tensor_storage claims the linear `prefix` (Exl3Config._storage_entry)."""
    from exl3tool.checks.conformance import claims_linear

    return claims_linear(ctx.storage, prefix)


def _plan_dense(rest: dict[str, Any], ctx: _Context, tally: _Tally) -> set[str]:
    """EXL3 linears outside the routed experts; returns the names handled here."""
    from exl3tool.formats.exl3 import group_linears

    done: set[str] = set()
    for prefix, group in group_linears(rest).items():
        done.update(ref.name for ref in group.parts.values())
        layer = layer_of(prefix)
        tail_layer = ctx.kind is Kind.R7 and layer is not None and _in(ctx.tail_range, layer)
        if ctx.kept and _storage_has(ctx, prefix):
            klass = TAIL_CLASS if tail_layer else DENSE
            for fld, ref in group.parts.items():
                tally.split(klass, TENSOR_STORAGE, prefix, ref.info.nbytes, fld == "trellis")
            continue
        rows, cols = group.in_features or 0, group.out_features or 0
        tally.split(BF16_DENSE, FALLBACK, prefix, rows * cols * 2, True)
    return done


def _plan_rest(rest: dict[str, Any], ctx: _Context, tally: _Tally, skip: set[str]) -> None:
    """Unquantized tensors as stored: matrices split across ranks, vectors replicated."""
    for name, ref in rest.items():
        if name in skip:
            continue
        layer = layer_of(name)
        tail_layer = ctx.kind is Kind.R7 and layer is not None and _in(ctx.tail_range, layer)
        klass = TAIL_CLASS if tail_layer else PLAIN
        tally.split(klass, UNQUANTIZED, name.rsplit(".", 1)[0], ref.info.nbytes,
                    len(ref.info.shape) >= 2)  # fmt: skip


def _moe_sizes(config: Any) -> tuple[int, int, int] | None:
    cfg = model_config(config)
    count = expert_count(cfg)
    hidden = cfg.get("hidden_size")
    inter = cfg.get("moe_intermediate_size", cfg.get("intermediate_size"))
    if count is None or type(hidden) is not int or type(inter) is not int:
        return None
    return count[1], hidden, inter


def _plan_fallback(ckpt: Checkpoint, tally: _Tally, layers: set[int], findings: Findings) -> None:
    """The unquantized MoE method allocates w13 [E, 2I, H] and w2 [E, H, I] in BF16 per layer,
    split across ranks along I."""
    if not layers:
        return
    sizes = _moe_sizes(ckpt.config)
    if sizes is None:
        findings.add(r7_rules.R7_SIZES, "no expert count, hidden_size or moe_intermediate_size: "
                     "the BF16 fallback cannot be sized", file="config.json")  # fmt: skip
        return
    experts, hidden, inter = sizes
    for layer in sorted(layers):
        module = f"model.layers.{layer}.mlp.experts"
        tally.split(BF16_EXPERTS, MOE_FALLBACK, module, experts * 3 * inter * hidden * 2, True)


def _findings(plan: BootPlan, ctx: _Context, fallback: set[int]) -> None:
    f = plan.findings
    if not ctx.kept:
        nbytes = sum(r.get(BF16_EXPERTS, 0) for r in plan.ranks)
        f.add(
            pl.PL_CONFIG_DISCARDED,
            f"{ctx.reason}: the EXL3 config is discarded; {len(fallback)} MoE layers fall to "
            f"the unquantized MoE method and allocate {_gib(nbytes)} of BF16 experts",
            file="config.json",
            pointer="/quantization_config/quant_method",
        )
    else:
        for method in (MOE_FALLBACK, FALLBACK):
            claim = plan.claims.get(method)
            if claim is not None:
                f.add(
                    pl.PL_UNCLAIMED,
                    f"{len(claim.modules)} EXL3 modules get the {method} (e.g. "
                    f"{min(claim.modules)}): {_gib(claim.nbytes)} allocated",
                    tensor=min(claim.modules),
                )
    if plan.gpu_memory is not None:
        for rank, total in enumerate(plan.totals()):
            if total > plan.gpu_memory:
                f.add(
                    pl.PL_RANK_MEMORY,
                    f"rank {rank}: {_gib(total)} of weights, the GPU has {_gib(plan.gpu_memory)}",
                )


def _gib(n: int) -> str:
    """Bytes in the largest binary unit they reach, to two decimals; in integers, as a hostile
    config's sizes multiply beyond what a float holds."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            hundredths = (n * 100 + scale // 2) // scale
            return f"{hundredths // 100}.{hundredths % 100:02d} {unit}"
    return f"{n} B"


def build_plan(ckpt: Checkpoint, kind: Kind, opts: PlanOptions) -> BootPlan:
    """The boot plan of a loaded checkpoint (headers only)."""
    ctx = _decide(ckpt, kind, opts.tp, opts.quantization)
    tally = _Tally(opts.tp)
    fallback: set[int] = set()
    other = _plan_experts(ckpt, ctx, tally, fallback)
    rest = {n: r for n, r in ckpt.tensors.items() if ".mlp.experts." not in n}
    rest.update(other)
    done = _plan_dense(rest, ctx, tally)
    _plan_rest(rest, ctx, tally, done)
    findings = Findings()
    _plan_fallback(ckpt, tally, fallback, findings)
    if ctx.kept and opts.tp > 1:  # the runtime's 128-aligned split of every EXL3 linear
        from exl3tool.checks.exl3_tp import check_tp_slices, trellises

        full_rank = kind is Kind.MSRT_BASE  # rank0 holds whole experts each rank slices
        check_tp_slices(ckpt, trellises(ckpt.tensors, full_rank=full_rank), opts.tp, findings)
    tail = config_tail(ckpt.config)  # its tp as the runtime reads it (int(): "2" is 2)
    if ctx.kept and ctx.tail_sliced and tail is not None and tail.tp != opts.tp:
        findings.add(r7_rules.RS_TP, f"checkpoint tp {tail.get('tp')!r}, --tp {opts.tp}: the "
                     "runtime refuses to load the tail", file="config.json",
                     pointer="/hybrid_tr3_tail/tp")  # fmt: skip
    plan = BootPlan(
        str(opts.path),
        kind.value,
        opts.tp,
        opts.quantization,
        "kept" if ctx.kept else "discarded",
        ctx.reason,
        opts.gpu_memory,
        [dict(r) for r in tally.ranks],
        tally.claims,
        findings,
    )
    _findings(plan, ctx, fallback)
    return plan


PLANNABLE = (Kind.EXL3, Kind.R7, Kind.RANK_SLICED, Kind.MSRT_BASE)


def run(opts: PlanOptions) -> BootPlan:
    """Detect, load headers, plan. InputError (exit 3) for an unreadable path; UsageError (2)
    for a bad TP size or an artifact that is not a checkpoint."""
    from exl3tool.actions.inputs import artifact_root, check_readable

    if type(opts.tp) is not int:
        raise UsageError(f"--tp {opts.tp!r} must be a positive integer")
    check_counts(opts.tp, None)
    path = artifact_root(Path(opts.path))
    check_readable(path)
    kind = detect(path)
    if kind is Kind.UNKNOWN and (path / "config.json").is_file():
        kind = Kind.EXL3  # EXL3 tensors behind a foreign stamp: the seed case, planned as such
    if kind not in PLANNABLE or not path.is_dir():
        raise UsageError(f"{path}: a {kind.value} artifact has no boot plan (a checkpoint dir)")
    load_findings = Findings()
    ckpt = load_checkpoint(path, load_findings)
    if not ckpt.tensors:
        raise InputError(f"{path}: no readable tensor headers")
    with paused_gc():  # per-group dicts and tuples, no cycle (GLM-5.2: 58,000 groups)
        plan = build_plan(ckpt, kind, opts)
    plan.findings.extend(f for f in load_findings if f.level.rank >= 2)
    return plan


def plot(plan: BootPlan, out: Path, *, force: bool = False) -> None:
    """A stacked bar per rank (GiB by class), with the GPU memory as a line; written atomically."""
    import io

    from exl3tool.actions.inspect_plot import require_matplotlib
    from exl3tool.io.atomic import write_bytes_atomic

    require_matplotlib()
    import matplotlib.pyplot as plt

    classes = sorted({k for r in plan.ranks for k in r})
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * plan.tp + 3), 4.5), layout="constrained")
    bottom = [0.0] * plan.tp
    for klass in classes:
        values = [r.get(klass, 0) / 2**30 for r in plan.ranks]
        ax.bar(range(plan.tp), values, bottom=bottom, label=klass)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    if plan.gpu_memory is not None:
        ax.axhline(plan.gpu_memory / 2**30, color="red", linestyle="--", label="GPU memory")
    ax.set_xticks(range(plan.tp))
    ax.set_xlabel("TP rank")
    ax.set_ylabel("resident weights (GiB)")
    ax.set_title(f"{Path(plan.path).name}: EXL3 config {plan.exl3_config}")
    ax.legend(fontsize="small")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    write_bytes_atomic(out, buf.getvalue(), force=force, inputs=(plan.path,))
