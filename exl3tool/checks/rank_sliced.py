"""Checks of the legacy rank-sliced profile, `hybrid_tr3_tail` with `tp` (RS rules, docs/formats/r7.md §7.1).

Used for rank-sliced checkpoints and for the MTP layer an R7 checkpoint carries under the tail (§6).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from exl3tool.checks.budget import check_declared
from exl3tool.checks.digests import Digests
from exl3tool.checks.exl3_linear import (
    check_linears,
    check_marker,
    check_tables,
    check_trellis_dtype,
    flush_payload_checks,
)
from exl3tool.checks.options import ValidateOptions
from exl3tool.checks.payload import FiniteCheck, RandomAccessReader, Scan
from exl3tool.checks.replicas import check_replicas
from exl3tool.formats.checkpoint import Checkpoint, TensorRef
from exl3tool.formats.exl3 import group_linears
from exl3tool.formats.experts import ExpertTable, expert_count, expert_table
from exl3tool.formats.names import LAYER_RE, PROJECTIONS
from exl3tool.formats.tail import (
    POINTER,
    Tail,
    bitmap_reference,
    bitmap_view,
    is_mixed_bits,
    layer_ks,
    parse_tail,
    raw_tail,
    runtime_bits,
    runtime_k,
)
from exl3tool.io.strict_json import is_json_int, pointer_join
from exl3tool.rules import r7 as r7
from exl3tool.rules.registry import Findings

TENSOR_SCHEMA = "model.layers.{L}.mlp.experts.{E}.{proj}.rank{r}.{trellis|suh|svh|mcg}"
SHARED_H_SCHEMA = "model.layers.{L}.mlp.experts.shared_h.{proj}.rank{r}.{suh|svh}"
ROTATIONS = ("per_expert_v1", "shared_h_v1")
MAX_MISSING = 20  # per layer; the rest is summarised in one finding


@dataclass(frozen=True)
class TailContext:
    """Where the tail lives and what the model and the run say about it."""

    file: str  # config.json
    base: str  # JSON pointer of the tail
    hidden: int | None
    inter: int | None
    n_experts: int | None
    runtime_tp: int | None = None  # `validate --tp`


@dataclass(frozen=True)
class SliceSpec:
    """What every rank slice of the tail's layers must look like."""

    layers: tuple[int, int]
    n_experts: int
    tp: int
    hidden: int
    inter: int
    uniform_k: int | None  # `bits` when it is a whole number
    k_allowed: set[int] | None  # `k_values` of a mixed tail
    tier: dict[str, Any] | None  # tier_bitmap.json of a mixed tail
    shared_h: bool  # rotation_layout shared_h_v1

    @property
    def part(self) -> int:
        return self.inter // self.tp


def report_missing_expert_count(findings: Findings) -> None:
    """R7/RS configs must give the routed expert count (rule R7 expert-count)."""
    findings.add(
        r7.R7_EXPERT_COUNT,
        "config.json gives no n_routed_experts / num_experts / num_local_experts",
        file="config.json",
        pointer="/n_routed_experts",
    )


def check_tail(
    ckpt: Checkpoint,
    raw: Any,
    table: ExpertTable,
    ctx: TailContext,
    scan: Scan,
    *,
    outside: bool = False,
) -> None:
    """The tail's fields (§7.1) and every rank slice of every expert in its layer range;
    `outside`: also RS013 for rank slices of layers outside it (an R7 checkpoint's own check,
    R7031, reports those of its carried tail)."""
    findings = scan.findings
    tail = parse_tail(raw)
    if tail is None:
        findings.add(
            r7.RS_FIELD, "hybrid_tr3_tail must be an object", file=ctx.file, pointer=ctx.base
        )
        return
    layers, epl, tp, rotation = _tail_fields(tail, ctx, findings)
    shared = _shared_h_vectors(ckpt, rotation, findings) if rotation in ROTATIONS else set()
    if outside and layers is not None:
        _report_outside(table, layers, findings)
    k_allowed, tier, bitmap = _mixed_bits(ckpt, tail, tail.mixed, ctx, findings)
    if tier is not None and layers is not None and epl is not None:
        check_tier_bitmap(tier, layers, epl, k_allowed, findings, bitmap)
    inter, hidden = ctx.inter, ctx.hidden
    if tp is not None and inter is not None and (inter % tp or (inter // tp) % 128):
        findings.add(
            r7.RS_ALIGN,
            f"intermediate {inter} / tp {tp} is not a multiple of 128",
            file=ctx.file,
            pointer=pointer_join(ctx.base, "tp"),
        )
        return
    if layers is None or tp is None or epl is None or hidden is None or inter is None:
        return
    spec = SliceSpec(
        layers, epl, tp, hidden, inter, tail.k, k_allowed, tier, rotation == "shared_h_v1"
    )
    _check_slices(table, spec, ctx, scan, shared)
    beyond: list[tuple[str, TensorRef]] = []
    for (layer, e, _p, rank), parts in table.ranked.items():
        if layers[0] <= layer <= layers[1] and rank >= tp:
            ref = next(iter(parts.values()))
            findings.add(
                r7.RS_RANK_RANGE, f"rank {rank} >= tp {tp}", file=ref.file, tensor=ref.name
            )
        if layers[0] <= layer <= layers[1] and e >= epl:  # one finding a slice
            beyond.append((f"expert {e} >= experts_per_layer {epl}", next(iter(parts.values()))))
    more = "{n} more tensors of experts beyond experts_per_layer"
    findings.add_counted(r7.RS_EXPERT_RANGE, beyond, _at_tensor, more, MAX_MISSING)


def _at_tensor(item: tuple[str, TensorRef]) -> tuple[str, dict[str, Any]]:
    """`Findings.add_counted`'s description of a (message, tensor) item: located at the tensor."""
    msg, ref = item
    return msg, {"file": ref.file, "tensor": ref.name}


def _report_outside(table: ExpertTable, layers: tuple[int, int], findings: Findings) -> None:
    """RS013 for each rank slice of a layer outside moe_layers: no rank-sliced MoE layer claims
    it, and the model has no parameter for its names (one finding a slice, counted past 20)."""
    first, last = layers
    why = f"is outside moe_layers [{first}, {last}]: no rank-sliced layer takes it"
    stray = [
        (f"layer {layer} {why}", next(iter(parts.values())))
        for (layer, _e, _p, _r), parts in table.ranked.items()
        if not first <= layer <= last
    ]
    more = "{n} more rank slices outside moe_layers"
    findings.add_counted(r7.RS_EXPERT_RANGE, stray, _at_tensor, more, MAX_MISSING)


def _tail_fields(
    tail: Tail, ctx: TailContext, findings: Findings
) -> tuple[tuple[int, int] | None, int | None, int | None, Any]:
    """RS fields of the tail; (layers, experts_per_layer, tp, rotation), None where unusable."""

    def field_problem(key: str, msg: str, r: Any = r7.RS_FIELD) -> None:
        findings.add(r, msg, file=ctx.file, pointer=pointer_join(ctx.base, key))

    if tail.get("format") != "exl3-trellis":
        field_problem("format", f"format {tail.get('format')!r}, expected 'exl3-trellis'")
    bits = tail.get("bits")
    x = runtime_bits(bits)  # read with float(), as the runtime reads it ("4" is 4)
    if not is_mixed_bits(bits) and (x is None or not x > 0):
        field_problem("bits", f"bits {bits!r}: a positive number or 'mixed'")
    if tail.get("codebook") != "mcg":
        field_problem("codebook", f"codebook {tail.get('codebook')!r}, expected 'mcg'")
    epl = tail.experts_per_layer
    if epl is None:
        field_problem(
            "experts_per_layer",
            f"experts_per_layer {tail.get('experts_per_layer')!r}: a positive integer",
        )
    elif ctx.n_experts is not None and epl != ctx.n_experts:
        field_problem(
            "experts_per_layer",
            f"experts_per_layer {epl}, the model has {ctx.n_experts} routed experts",
            r7.RS_EXPERTS,
        )
    layers = tail.moe_layers
    if layers is None:
        field_problem(
            "moe_layers",
            f"moe_layers {tail.get('moe_layers')!r}: [first, last], integers 0 <= first <= last",
        )
    if tail.get("tensor_schema") != TENSOR_SCHEMA:
        field_problem("tensor_schema", f"tensor_schema {tail.get('tensor_schema')!r}", r7.RS_SCHEMA)
    tp = tail.tp
    if tp is None:
        field_problem("tp", f"tp {tail.get('tp')!r}: a positive integer")
    elif ctx.runtime_tp is not None and tp != ctx.runtime_tp:
        field_problem("tp", f"checkpoint tp {tp}, runtime --tp {ctx.runtime_tp}", r7.RS_TP)
    rotation = tail.get("rotation_layout", "per_expert_v1")
    if rotation not in ROTATIONS:
        field_problem("rotation_layout", f"rotation_layout {rotation!r}", r7.RS_ROTATION)
    elif rotation == "shared_h_v1" and tail.get("shared_h_tensor_schema") != SHARED_H_SCHEMA:
        field_problem(
            "shared_h_tensor_schema",
            f"shared_h_v1 needs shared_h_tensor_schema {SHARED_H_SCHEMA!r}",
            r7.RS_ROTATION,
        )
    elif rotation != "shared_h_v1" and tail.get("shared_h_tensor_schema") is not None:
        field_problem(
            "shared_h_tensor_schema",
            f"shared_h_tensor_schema with rotation_layout {rotation!r}: only shared_h_v1 takes it",
            r7.RS_ROTATION,
        )
    return layers, epl, tp, rotation


# A shared H-side vector as the runtime matches every tensor name (any prefix ending in `.experts`)
_SHARED_H_NAME = re.compile(
    r"(?P<prefix>.+\.experts)\.shared_h\.(?P<proj>gate_proj|up_proj|down_proj)"
    r"\.rank(?P<rank>\d+)\.(?P<field>suh|svh)"
)
_SHARED_H = ".experts.shared_h."
_INDEX_DIGITS = 18  # longer indices are no rank or layer of any model (and int() may refuse them)


def _shared_h_vectors(
    ckpt: Checkpoint, rotation: str, findings: Findings
) -> set[tuple[int, str, int]]:
    """Exl3Config.normalize_rank_sliced_weight_name (the R7 revision): RS010 for every name
    under `experts.shared_h` it refuses (any, unless the tail declares shared_h_v1; one on the
    wrong side: gate/up share suh, down shares svh) or the loader has no parameter for (any
    other field or form); the (layer, projection, rank) of the vectors it loads."""
    bad: list[tuple[str, TensorRef]] = []
    loaded: set[tuple[int, str, int]] = set()
    tensors = ckpt.tensors
    for name in [n for n in tensors if _SHARED_H in n]:  # a comprehension: 10^5 names
        ref = tensors[name]
        m = _SHARED_H_NAME.fullmatch(name)
        if m is None:
            bad.append(("no loader parameter: a shared H-side vector is named "
                        "experts.shared_h.{proj}.rank{r}.{suh|svh}", ref))  # fmt: skip
            continue
        proj, fld, rank = m["proj"], m["field"], m["rank"]
        want = "svh" if proj == "down_proj" else "suh"
        if rotation != "shared_h_v1":
            bad.append((f"shared H-side vector with rotation_layout {rotation!r}: "
                        "only shared_h_v1 has them", ref))  # fmt: skip
        elif fld != want:
            bad.append((f"{proj} shares its H-side vector as {want}, not {fld}", ref))
        elif (layer := LAYER_RE.search(m["prefix"] + ".")) is not None and max(
            len(layer["layer"]), len(rank)
        ) <= _INDEX_DIGITS:
            loaded.add((int(layer["layer"]), proj, int(rank)))  # int(), as the runtime reads it
    more = "{n} more tensors under experts.shared_h the runtime refuses"
    findings.add_counted(r7.RS_ROTATION, bad, _at_tensor, more, MAX_MISSING)
    return loaded


def _mixed_bits(
    ckpt: Checkpoint, tail: Tail, mixed: bool, ctx: TailContext, findings: Findings
) -> tuple[set[int] | None, dict[str, Any] | None, str]:
    """k_values, the bitmap `bits_per_expert` names (its field read as `k`) and that file's
    name, for `bits: "mixed"` (RS011)."""
    if not mixed:
        return None, None, BITMAP
    raw = tail.get("k_values")
    # read with int() as the runtime reads it ("4" and 4.0 are K 4), then each one of 3..6
    kv = [runtime_k(k) for k in raw] if isinstance(raw, list) else []
    if not kv or not all(k is not None and 3 <= k <= 6 for k in kv):
        findings.add(
            r7.RS_TIER_BITMAP,
            f"k_values {repr(raw)[:80]}: a non-empty list of integer K in 3..6",
            file=ctx.file,
            pointer=pointer_join(ctx.base, "k_values"),
        )
        kv = []
    allowed = {k for k in kv if k is not None}
    ref = bitmap_reference(tail.get("bits_per_expert"))
    if ref is None:
        findings.add(
            r7.RS_TIER_BITMAP,
            f"bits_per_expert {tail.get('bits_per_expert')!r}: a 'file.json:field' reference "
            "to a file of the checkpoint (the producer writes 'tier_bitmap.json:k')",
            file=ctx.file,
            pointer=pointer_join(ctx.base, "bits_per_expert"),
        )
        return allowed, None, BITMAP
    name, field = ref
    tb = ckpt.json_file(name, findings)
    if not isinstance(tb, dict):
        findings.add(r7.RS_TIER_BITMAP, f"{name} missing or unusable", file=name)
        return allowed, None, name
    return allowed, bitmap_view(tb, field), name


BITMAP = "tier_bitmap.json"  # what the producer names in bits_per_expert ("tier_bitmap.json:k")
MAX_TAIL_LAYERS = 4096  # a moe_layers range wider than this is not enumerated (no model has it)
TIER_NAMED = 8  # layers named one by one; the rest are counted


def check_tier_bitmap(
    tier: dict[str, Any],
    layers: tuple[int, int],
    experts: int,
    k_allowed: set[int] | None,
    findings: Findings,
    bitmap: str = BITMAP,
) -> None:
    """Exl3Config._load_rank_sliced_bitrates (RS011): every layer of moe_layers has an entry
    whose `k` lists one declared K per expert (or, the MTP overlay's form, a `tail_tr3` list of
    one per expert instead, read as K 3); the runtime refuses to start otherwise."""
    first, last = layers
    if last - first + 1 > MAX_TAIL_LAYERS:
        return
    problems: list[tuple[int, str]] = []
    for layer in range(first, last + 1):
        entry = tier.get(str(layer))
        if not isinstance(entry, dict):
            problems.append((layer, f"{bitmap} has no entry for MoE layer {layer}"))
            continue
        ks = layer_ks(entry, experts)
        if ks is None:
            raw = entry.get("k")
            n = f"{len(raw)} entries" if isinstance(raw, list) else repr(raw)[:40]
            problems.append((layer, f"layer {layer}: k is {n}, experts_per_layer is {experts}"))
            continue
        read = [runtime_k(k) for k in ks]
        bad = sorted({repr(k)[:20] for k, r in zip(ks, read, strict=True) if r is None})
        odd = sorted({r for r in read if r is not None} - k_allowed) if k_allowed else []
        if bad:
            problems.append((layer, f"layer {layer}: K {', '.join(bad[:4])} is not an integer"))
        elif odd:
            problems.append(
                (layer, f"layer {layer} uses K {odd}, k_values declares {sorted(k_allowed or ())}")
            )
    findings.add_counted(
        r7.RS_TIER_BITMAP,
        problems,
        lambda p: (p[1], {"file": bitmap, "pointer": f"/{p[0]}"}),
        "{n} more layers with the same kind of problem",
        TIER_NAMED,
    )


def _tier_ks(tier: dict[str, Any] | None, layer: int, experts: int) -> list[int | None]:
    """The K the runtime reads for each expert of a layer, None where it has none (what is
    unusable is check_tier_bitmap's finding)."""
    ks = layer_ks((tier or {}).get(str(layer)), experts)
    return [runtime_k(k) for k in ks] if ks is not None else [None] * experts


def _check_slices(
    table: ExpertTable,
    spec: SliceSpec,
    ctx: TailContext,
    scan: Scan,
    shared: set[tuple[int, str, int]],
) -> None:
    """Every rank slice of every expert of the tail's layers (`shared`: the (layer, projection,
    rank) of the shared H-side vectors the runtime loads, for shared_h_v1)."""
    span = spec.layers[1] - spec.layers[0] + 1
    declared = max(span, 0) * max(spec.n_experts, 0) * len(PROJECTIONS) * max(spec.tp, 0)
    where = {"file": ctx.file, "pointer": pointer_join(ctx.base, "moe_layers")}
    what = "moe_layers, experts and tp"
    if not check_declared(declared, len(table.ranked), what, scan.findings, **where):
        return
    held = {key[0] for key in table.ranked}
    empty = 0  # layers of the range without any rank slice (moe_layers may be hostile)
    for layer in range(spec.layers[0], spec.layers[1] + 1):
        if layer not in held:
            empty += 1
            if empty <= MAX_MISSING:  # one finding a layer, not one a slice
                scan.findings.add(
                    r7.RS_MISSING,
                    f"no rank slice of any expert of layer {layer}",
                    file=ctx.file,
                    tensor=f"model.layers.{layer}.mlp.experts",
                )
            continue
        missing: list[str] = []
        tier_ks = _tier_ks(spec.tier, layer, spec.n_experts)
        for e in range(spec.n_experts):
            tier_k = tier_ks[e]
            for proj in PROJECTIONS:
                for r in range(spec.tp):
                    key = (layer, e, proj, r)
                    parts = table.ranked.get(key, {})
                    missing.extend(_check_slice(spec, key, parts, tier_k, scan))
        if spec.shared_h:  # the H-side vectors the expert slices no longer hold
            missing.extend(_missing_shared_h(shared, layer, spec.tp))
        for name in missing[:MAX_MISSING]:
            scan.findings.add(r7.RS_MISSING, "rank slice missing", file=ctx.file, tensor=name)
        if len(missing) > MAX_MISSING:
            scan.findings.add(
                r7.RS_MISSING,
                f"{len(missing) - MAX_MISSING} more rank slices of layer {layer} missing",
                file=ctx.file,
                pointer=pointer_join(ctx.base, "moe_layers"),
            )
    if empty > MAX_MISSING:
        scan.findings.add(
            r7.RS_MISSING,
            f"{empty - MAX_MISSING} more layers of moe_layers without any rank slice",
            file=ctx.file,
            pointer=pointer_join(ctx.base, "moe_layers"),
        )


def _missing_shared_h(shared: set[tuple[int, str, int]], layer: int, tp: int) -> list[str]:
    """shared_h_v1: the names of the layer's missing `experts.shared_h.{proj}.rank{r}` vectors
    (each rank loads its own; without it the projection has no H-side rotation)."""
    return [
        f"model.layers.{layer}.mlp.experts.shared_h.{proj}.rank{r}."
        + ("svh" if proj == "down_proj" else "suh")
        for proj in PROJECTIONS
        for r in range(tp)
        if (layer, proj, r) not in shared
    ]


def _check_slice(
    spec: SliceSpec,
    key: tuple[int, int, str, int],
    parts: dict[str, TensorRef],
    tier_k: int | None,
    scan: Scan,
) -> list[str]:
    """One rank slice `{prefix}.{trellis|mcg|suh|svh}` of one expert projection; returns the
    names of its missing fields."""
    findings = scan.findings
    layer, e, proj, r = key
    prefix = f"model.layers.{layer}.mlp.experts.{e}.{proj}.rank{r}"
    down = proj == "down_proj"
    h_side = "svh" if down else "suh"
    need = ("trellis", "mcg", "suh", "svh")
    if spec.shared_h:
        need = tuple(x for x in need if x != h_side)
    missing = [f"{prefix}.{fld}" for fld in need if fld not in parts]
    if spec.shared_h and h_side in parts:
        ref = parts[h_side]
        findings.add(
            r7.RS_ROTATION,
            f"shared_h_v1 forbids {h_side} under expert ids",
            file=ref.file,
            tensor=ref.name,
        )
    t = parts.get("trellis")
    if t is not None and check_trellis_dtype(t, findings):
        _check_slice_trellis(spec, down, t, tier_k, findings)
    part, hidden = spec.part, spec.hidden
    for fld, size in (("suh", hidden if not down else part), ("svh", part if not down else hidden)):
        ref = parts.get(fld)
        if ref is None:
            continue
        scan.finite.add(ref)
        if ref.info.dtype != "F16" or ref.info.shape != (size,):
            findings.add(
                r7.RS_GEOMETRY,
                f"{fld} is {ref.info.dtype}{list(ref.info.shape)}, expected F16 [{size}]",
                file=ref.file,
                tensor=ref.name,
            )
    if "mcg" in parts:
        check_marker(scan.reader, parts["mcg"], "mcg", findings)
    return missing


def _check_slice_trellis(
    spec: SliceSpec, down: bool, t: TensorRef, tier_k: int | None, findings: Findings
) -> None:
    # (trellis rows, trellis cols) of one rank slice
    rows, cols = (spec.part, spec.hidden) if down else (spec.hidden, spec.part)
    shape = t.info.shape
    k = shape[2] // 16 if shape[2] % 16 == 0 else None
    if (shape[0] * 16, shape[1] * 16) != (rows, cols) or k is None:
        findings.add(
            r7.RS_GEOMETRY,
            f"trellis {list(shape)}, expected [{rows // 16}, {cols // 16}, 16*K]",
            file=t.file,
            tensor=t.name,
        )
    want = spec.uniform_k if spec.uniform_k is not None else tier_k
    k_allowed = spec.k_allowed
    if k is not None and (
        (want is not None and k != want)
        or (k_allowed is not None and k_allowed and k not in k_allowed)
    ):
        findings.add(
            r7.RS_K,
            f"K = {k}, expected "
            + (f"{want}" if want is not None else f"one of {sorted(k_allowed or ())}"),
            file=t.file,
            tensor=t.name,
        )


def check_rank_sliced(ckpt: Checkpoint, findings: Findings, options: ValidateOptions) -> None:
    """A legacy rank-sliced checkpoint: the tail, every rank slice, other EXL3 linears."""
    config = ckpt.config or {}
    table = expert_table(ckpt.tensors)
    count = expert_count(config)
    hidden, inter = config.get("hidden_size"), config.get("moe_intermediate_size")
    ctx = TailContext(
        "config.json",
        POINTER,
        hidden if is_json_int(hidden) else None,
        inter if is_json_int(inter) else None,
        count[1] if count else None,
        options.tp,
    )
    if count is None:
        report_missing_expert_count(findings)
    finite = FiniteCheck()
    with RandomAccessReader() as reader:
        scan = Scan(findings, reader, finite)
        check_tail(ckpt, raw_tail(config), table, ctx, scan, outside=True)
        others = {n: r for n, r in ckpt.tensors.items() if ".mlp.experts." not in n}
        tables: list[str] = []
        check_linears(group_linears(others, tables), ckpt.tensors, findings, reader, finite)
        check_tables(tables, ckpt.tensors, findings)
        flush_payload_checks(reader, finite, findings)
    if options.hash:
        rejected = ckpt.damaged_shards | ckpt.rejected_files
        check_replicas(ckpt, findings, Digests(ckpt.root, options, rejected))
