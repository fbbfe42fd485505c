"""R7 routed experts (docs/formats/r7.md §3): every (layer, expert, projection) of
moe_layers: presence, K, geometry, markers, vectors; header-only except 4-byte marker reads and a
finiteness scan of the scale vectors (both deferred to the payload flush)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

from exl3tool.checks.budget import check_declared
from exl3tool.checks.exl3_linear import check_marker, check_trellis_dtype
from exl3tool.checks.payload import FiniteCheck, MarkerCheck, Scan
from exl3tool.formats.checkpoint import TensorRef
from exl3tool.formats.exl3 import MCG_MARKER
from exl3tool.formats.experts import ExpertTable
from exl3tool.formats.names import PROJECTIONS
from exl3tool.formats.r7 import MARKER, Block, R7Payload, layer_shard
from exl3tool.io.strict_json import pointer_join
from exl3tool.io.views import TensorReader
from exl3tool.rules import r7 as r7
from exl3tool.rules.registry import Findings, Severity

MAX_MISSING = 20
SHARED_VECTORS = ("gate_up_suh", "down_svh")


@dataclass(frozen=True)
class ExpertsContext:
    """What the expert checks of one R7 checkpoint read and where they report."""

    table: ExpertTable
    block: Block
    n_experts: int
    hidden: int | None
    inter: int | None
    shards: dict[str, Any]  # label -> SafetensorsFile
    scan: Scan

    # cached: read once per projection, 57,600 times on GLM-5.2
    @cached_property
    def findings(self) -> Findings:
        return self.scan.findings

    @cached_property
    def reader(self) -> TensorReader:
        return self.scan.reader

    @cached_property
    def finite(self) -> FiniteCheck:
        return self.scan.finite

    @cached_property
    def markers(self) -> MarkerCheck | None:
        """The reader's deferred marker reads, if it defers them (`RandomAccessReader`)."""
        return getattr(self.reader, "markers", None)

    @cached_property
    def geometry(self) -> bool:
        return self.hidden is not None and self.inter is not None

    @cached_property
    def k_values(self) -> frozenset[int]:
        return self.block.k_values


class Slot(NamedTuple):
    """One (layer, expert, projection), the shard it belongs in and its tensor-name prefix."""

    layer: int
    expert: int
    proj: str
    label: str
    prefix: str  # model.layers.{layer}.mlp.experts.{expert}.{proj}


def _vector_ok(ref: TensorRef, size: int) -> bool:
    return ref.info.dtype == "F16" and ref.info.shape == (size,)


def check_experts(ctx: ExpertsContext) -> R7Payload:
    """Every layer of moe_layers; returns the payload's K table."""
    payload = R7Payload()
    n_layers = max(ctx.block.last - ctx.block.first + 1, 0)  # len(range) overflows past 2**63
    declared = n_layers * max(ctx.n_experts, 0) * len(PROJECTIONS)
    where = {"file": ctx.block.file, "pointer": pointer_join(ctx.block.base, "moe_layers")}
    what = "moe_layers and n_routed_experts"
    if not check_declared(declared, len(ctx.table.plain), what, ctx.findings, **where):
        return payload
    held = {k[0] for k in ctx.table.plain}
    for layer in ctx.block.layers:
        if _layer_present(ctx, layer, held):
            _check_layer(ctx, layer, payload)
    return payload


def _layer_present(ctx: ExpertsContext, layer: int, held: set[int]) -> bool:
    table = ctx.table
    has_layer = any((layer, 0, p) in table.plain for p in PROJECTIONS) or any(
        (layer, f"r7_shared.{v}") in table.layer_vectors for v in SHARED_VECTORS
    )
    if has_layer or layer in held:
        return True
    ctx.findings.add(
        r7.R7_LAYER_MISSING,
        f"layer {layer} is in moe_layers but no shard holds its experts ({layer_shard(layer)})",
        file=ctx.block.file,
        pointer=pointer_join(ctx.block.base, "moe_layers"),
    )
    return False


def _check_layer(ctx: ExpertsContext, layer: int, payload: R7Payload) -> None:
    label = layer_shard(layer)
    _check_shard_meta(ctx.shards.get(label), layer, ctx.findings)
    missing: list[str] = []
    plain = ctx.table.plain
    usual = _usual_projections(ctx)
    k_values, markers, finite = ctx.k_values, ctx.markers, ctx.finite
    inter, vec_shape = ctx.inter, (ctx.inter,)
    # what MarkerCheck.add and FiniteCheck.add keep, inline for the layer's own shard
    st = ctx.shards.get(label)
    room = st.file_size - st.data_start if st is not None else -1
    keep_marker = (markers.items if markers is not None else []).append
    keep_vector = finite.items.append
    for e in range(ctx.n_experts):
        head = f"model.layers.{layer}.mlp.experts.{e}."
        for proj, own, shared, want in usual:
            parts = plain.get((layer, e, proj))
            if parts is None:
                missing.append(f"{head}{proj}.trellis")
                continue
            # The usual projection, tested without side effects: it has no finding, so only
            # what `_check_projection` records is done, in its order. Anything else goes there.
            t, mcg, vec = parts.get("trellis"), parts.get("mcg"), parts.get(own)
            if (
                t is not None
                and mcg is not None
                and vec is not None
                and markers is not None
                and "mul1" not in parts
                and parts.get(shared) is None
                and t.shard.label == label
            ):
                info, m, v = t.info, mcg.info, vec.info
                shape = info.shape
                if (
                    info.dtype == "I16"
                    and len(shape) == 3
                    and not shape[2] % 16
                    and shape[2] // 16 in k_values
                    and (want is None or (shape[0] * 16, shape[1] * 16) == want)
                    and m.dtype == "I32"
                    and m.shape == ()
                    and (inter is None or (v.dtype == "F16" and v.shape == vec_shape))
                ):
                    payload.record((layer, e, proj), head + proj, t, shape[2] // 16)
                    if mcg.shard is not st:
                        markers.add(mcg, MCG_MARKER)
                    elif m.end - m.begin == 4 and m.end <= room:
                        keep_marker((mcg, MCG_MARKER))
                    if vec.shard is not st or v.dtype != "F16":
                        finite.add(vec)
                    elif v.end != v.begin and v.end <= room:
                        keep_vector((vec, None))
                    continue
            _check_projection(
                ctx, Slot(layer, e, proj, label, head + proj), parts, missing, payload
            )
    _report_missing(ctx.findings, missing, layer, label)
    _check_shared_vectors(ctx, layer, label)
    _report_tier(ctx.findings, payload, layer, label)


def _usual_projections(
    ctx: ExpertsContext,
) -> list[tuple[str, str, str, tuple[int, int] | None]]:
    """Per projection: its own scale vector, the one it must not carry, and the trellis's
    expected (rows, columns) when the geometry is known (as `_check_projection` tests them)."""
    out = []
    for proj in PROJECTIONS:
        down = proj == "down_proj"
        own, shared = ("suh", "svh") if down else ("svh", "suh")
        want = None
        if ctx.geometry:
            want = (ctx.inter, ctx.hidden) if down else (ctx.hidden, ctx.inter)
        out.append((proj, own, shared, want))
    return out


def _report_missing(findings: Findings, missing: list[str], layer: int, label: str) -> None:
    for name in missing[:MAX_MISSING]:
        findings.add(r7.R7_TENSOR_MISSING, "missing", file=label, tensor=name)
    if len(missing) > MAX_MISSING:
        findings.add(
            r7.R7_TENSOR_MISSING,
            f"{len(missing) - MAX_MISSING} more expert tensors of layer {layer} missing",
            file=label,
            tensor=missing[MAX_MISSING],
        )


def _check_shared_vectors(ctx: ExpertsContext, layer: int, label: str) -> None:
    for vec in SHARED_VECTORS:
        name = f"model.layers.{layer}.mlp.experts.r7_shared.{vec}"
        ref = ctx.table.layer_vectors.get((layer, f"r7_shared.{vec}"))
        if ref is None:
            ctx.findings.add(r7.R7_SHARED, "shared vector missing", file=label, tensor=name)
            continue
        if ctx.hidden is not None and not _vector_ok(ref, ctx.hidden):
            ctx.findings.add(
                r7.R7_SHARED,
                f"{ref.info.dtype}{list(ref.info.shape)}, expected F16 [{ctx.hidden}]",
                file=ref.file,
                tensor=name,
            )
        ctx.finite.add(ref)


def _report_tier(findings: Findings, payload: R7Payload, layer: int, label: str) -> None:
    ks: dict[str, set[int]] = {p: set() for p in PROJECTIONS}
    for prefix, k in payload.by_layer.get(layer, {}).items():
        ks[prefix.rpartition(".")[2]].add(k)
    distinct = set().union(*ks.values())
    if distinct:
        findings.add(
            r7.R7_TIER,
            f"layer {layer}: tier {len(distinct)} (K gate {sorted(ks['gate_proj'])}, "
            f"up {sorted(ks['up_proj'])}, down {sorted(ks['down_proj'])})",
            file=label,
            tensor=f"model.layers.{layer}.mlp.experts",
        )


def _check_projection(
    ctx: ExpertsContext,
    slot: Slot,
    parts: dict[str, TensorRef],
    missing: list[str],
    payload: R7Payload,
) -> None:
    """Every check of one (expert, projection). `_check_layer` skips this call for a projection
    that none of these checks could report: a check added here must also fail that inline test
    (`tests/checks/test_expert_fast_path.py` compares both paths on every R7 defect case)."""
    t = parts.get("trellis")
    if t is None:
        missing.append(f"{slot.prefix}.trellis")
    else:
        _check_trellis(ctx, slot, t, payload)
    _check_expert_marker(ctx, slot, parts)
    _check_expert_vectors(ctx, slot, parts, missing)


def _check_trellis(ctx: ExpertsContext, slot: Slot, t: TensorRef, payload: R7Payload) -> None:
    findings = ctx.findings
    info = t.info
    if t.shard.label != slot.label:
        findings.add(
            r7.R7_WRONG_SHARD, f"stored in {t.file}, not {slot.label}", file=t.file, tensor=t.name
        )
    if info.dtype != "I16" or len(info.shape) != 3:
        check_trellis_dtype(t, findings)  # EX001
        return
    s0, s1, s2 = info.shape
    if s2 % 16:
        findings.add(
            r7.R7_GEOMETRY,
            f"last dimension {s2} is not a multiple of 16",
            file=t.file,
            tensor=t.name,
        )
    else:
        k = s2 // 16
        payload.record((slot.layer, slot.expert, slot.proj), slot.prefix, t, k)
        if k not in ctx.k_values:
            findings.add(
                r7.R7_K_UNDECLARED,
                f"K = {k} not declared by k_values {sorted(ctx.k_values)}",
                file=t.file,
                tensor=t.name,
            )
    if ctx.geometry:
        down = slot.proj == "down_proj"
        want = (ctx.inter, ctx.hidden) if down else (ctx.hidden, ctx.inter)
        if (s0 * 16, s1 * 16) != want:
            findings.add(
                r7.R7_GEOMETRY,
                f"trellis {[s0, s1, s2]} is {s0 * 16}x{s1 * 16}, expected "
                f"{want[0]}x{want[1]} ({'intermediate x hidden' if down else 'hidden x intermediate'})",
                file=t.file,
                tensor=t.name,
            )


def _check_expert_marker(ctx: ExpertsContext, slot: Slot, parts: dict[str, TensorRef]) -> None:
    mcg = parts.get("mcg")
    if mcg is None or "mul1" in parts:
        ctx.findings.add(
            r7.R7_MARKER,
            "mul1 marker on an R7 expert (codebook must be mcg)"
            if "mul1" in parts
            else "no mcg marker",
            file=slot.label,
            tensor=f"{slot.prefix}.{'mul1' if 'mul1' in parts else 'mcg'}",
        )
    if mcg is not None:
        info, markers = mcg.info, ctx.markers
        if markers is not None and info.dtype == "I32" and info.shape == ():
            markers.add(mcg, MCG_MARKER)  # what check_marker defers
        else:
            check_marker(ctx.reader, mcg, "mcg", ctx.findings)


def _check_expert_vectors(
    ctx: ExpertsContext, slot: Slot, parts: dict[str, TensorRef], missing: list[str]
) -> None:
    down = slot.proj == "down_proj"
    own, shared = ("suh", "svh") if down else ("svh", "suh")
    ref = parts.get(own)
    if ref is None:
        missing.append(f"{slot.prefix}.{own}")
    else:
        ctx.finite.add(ref)
        info, inter = ref.info, ctx.inter
        if inter is not None and (info.dtype != "F16" or info.shape != (inter,)):
            ctx.findings.add(
                r7.R7_VECTOR,
                f"{own} is {ref.info.dtype}{list(ref.info.shape)}, expected F16 [{ctx.inter}]",
                file=ref.file,
                tensor=ref.name,
            )
    extra = parts.get(shared)
    if extra is not None:
        vector = f"r7_shared.{'down_svh' if down else 'gate_up_suh'}"
        # The runtime loads the shared vectors as expert 0's (gate_up_suh as experts.0.gate_proj
        # .suh, aliased to up; down_svh as experts.0.down_proj.svh): expert 0's own copy takes
        # that place, and every expert's projection is served with it, with no error. Another
        # expert's own copy is kept ("explicit per-expert tensors win"): a layer of one K serves
        # it, a layer of several tiers serves the shared one.
        if slot.expert == 0:
            why = f"the runtime loads {vector} in this tensor's place, so this one would replace "
            why += "it for every expert"
        else:
            why = "a layer of one K serves this copy, a layer of several K tiers the shared one"
        same = _same_bytes(ctx, extra, ctx.table.layer_vectors.get((slot.layer, vector)))
        ctx.findings.add(
            r7.R7_UNEXPECTED_VECTOR,
            f"per-expert {shared}; R7 uses {vector}: "
            + ("a byte-identical copy, served the same either way" if same else why),
            file=extra.file,
            tensor=extra.name,
            severity=Severity.WARNING if same else None,
        )


def _same_bytes(ctx: ExpertsContext, a: TensorRef, b: TensorRef | None) -> bool:
    """Whether two small vectors hold the same bytes (False when one cannot be read)."""
    if b is None or a.info.dtype != b.info.dtype or a.info.shape != b.info.shape:
        return False
    try:
        rd = ctx.reader
        return bytes(rd.payload(a.shard, a.info)) == bytes(rd.payload(b.shard, b.info))
    except (OSError, ValueError):  # the payload checks report an unreadable shard
        return False


def _check_shard_meta(st: Any, layer: int, findings: Findings) -> None:
    if st is None:
        return
    want = {"r7_schema": "2", "r7_layer": str(layer), "r7_marker": MARKER}
    meta = st.metadata or {}
    bad = {k: meta.get(k) for k, v in want.items() if meta.get(k) != v}
    if bad:
        findings.add(
            r7.R7_SHARD_META,
            f"__metadata__ has {bad}, expected {want}",
            file=st.label,
            pointer="/__metadata__",
        )


MAX_OTHER = 20  # unparsed expert-namespace names named one by one; the rest are counted


def check_out_of_range(
    table: ExpertTable,
    block: Block,
    n_experts: int,
    tail: tuple[int, int] | None,
    findings: Findings,
) -> None:
    """R7031: plain expert tensors outside moe_layers / the expert count, ranked ones outside the
    carried tail; one finding per (layer, reason)."""
    seen: set[tuple[int, str]] = set()

    def report(layer: int, why: str, ref: TensorRef) -> None:
        if (layer, why) not in seen:
            seen.add((layer, why))
            findings.add(r7.R7_OUT_OF_RANGE, why, file=ref.file, tensor=ref.name)

    for (layer, e, _p), parts in table.plain.items():
        ref = next(iter(parts.values()))
        if not block.first <= layer <= block.last:
            report(layer, f"layer {layer} is outside moe_layers [{block.first}, {block.last}]", ref)
        elif e >= n_experts:
            report(layer, f"expert {e} >= the model's {n_experts} routed experts", ref)
    for (layer, _e, _p, _r), parts in table.ranked.items():
        if tail is None or not tail[0] <= layer <= tail[1]:
            report(
                layer,
                f"rank-sliced layer {layer} is not covered by hybrid_tr3_tail",
                next(iter(parts.values())),
            )
    _check_layer_vectors(table, block, tail, report)
    # a name under an experts namespace that no expert mapping parses: the model's weight
    # loader looks it up as a parameter of its own, and there is none
    for name, ref in list(table.other.items())[:MAX_OTHER]:
        report(-1, f"{name} is under an experts namespace but names no expert projection", ref)
    if len(table.other) > MAX_OTHER:
        name, ref = list(table.other.items())[MAX_OTHER]
        report(-1, f"{len(table.other) - MAX_OTHER} more such names", ref)


def _check_layer_vectors(
    table: ExpertTable,
    block: Block,
    tail: tuple[int, int] | None,
    report: Callable[[int, str, TensorRef], None],
) -> None:
    """Layer-level vectors the runtime maps by name, in any layer: `r7_shared.gate_up_suh` and
    `down_svh` become expert 0's suh/svh of their layer (a dense layer has no such parameter; in
    the carried tail's layer they replace that expert's own vectors), anything else under
    `r7_shared` has no parameter, and `shared_h` belongs to the rank-sliced tail alone."""
    for (layer, name), ref in table.layer_vectors.items():
        head, _, fld = name.partition(".")
        if head == "r7_shared" and fld not in SHARED_VECTORS:
            report(layer, f"r7_shared.{fld} is no R7 shared vector (gate_up_suh, down_svh)", ref)
        elif head == "r7_shared" and not block.first <= layer <= block.last:
            report(
                layer,
                f"r7_shared vector in layer {layer}, outside moe_layers [{block.first}, "
                f"{block.last}]: the runtime loads it as that layer's expert 0 vector",
                ref,
            )
        elif head == "shared_h" and (tail is None or not tail[0] <= layer <= tail[1]):
            report(layer, f"shared_h vector in layer {layer}, not a carried tail layer", ref)
