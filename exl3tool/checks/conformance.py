"""What the serving runtime (the vLLM fork's EXL3 loader) refuses before it serves, predicted from
configs and headers (docs/runtime-conformance.md; the map itself is `rules/conformance.py`).

The family checks verify the formats; these close the gaps where a format-valid artifact is still
refused by the runtime: its config step, its expert-name mapping and its kernel bitrates.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from exl3tool.checks.exl3 import check_storage_records
from exl3tool.checks.options import ValidateOptions
from exl3tool.formats.checkpoint import Checkpoint, TensorRef
from exl3tool.formats.detect import Kind
from exl3tool.formats.exl3 import LinearGroup, codebook_of, group_linears
from exl3tool.formats.names import ExpertPrefixes
from exl3tool.formats.tail import (
    RANK_SLICED_K,
    bitmap_reference,
    bitmap_view,
    config_tail,
    is_mixed_bits,
    layer_range,
    runtime_bits,
    runtime_k,
    tail_layer_range,
    whole_k,
)
from exl3tool.io.strict_json import pointer_join
from exl3tool.rules import base as mb
from exl3tool.rules import checkpoint as ck
from exl3tool.rules import exl3 as ex
from exl3tool.rules import r7 as r7
from exl3tool.rules.registry import Findings

# Runtime revisions `--runtime` can target. "public": the strictest public revisions (the R7 and
# main exl3.py); "cartridge": the cartridge-era revision (uniform rank-sliced K 2..6).
# auto: the cartridge revision for an MSRT base (the only one that serves it), else public
RUNTIMES = ("auto", "public", "cartridge")
REFUSED_BY = {
    "public": "the public R7 and main revisions (integral 3/4/5/6 only)",
    "cartridge": "every revision, the cartridge revision included (2..6)",
}
# the runtime's MoE method has these parameters only (no legacy su/sv, unlike a dense linear),
# the rank-sliced regex the same fields
EXPERT_FIELDS = frozenset(("trellis", "suh", "svh", "mcg", "mul1"))
_ACCEPTED = tuple(f".{f}" for f in sorted(EXPERT_FIELDS))
MAX_NAMED = 20  # expert-namespace findings named one by one; the rest are counted


def rank_sliced_tail(config: Any) -> dict[str, Any] | None:
    """The `hybrid_tr3_tail` the runtime takes the rank-sliced path for, if any."""
    tail = config_tail(config)
    return dict(tail.raw) if tail is not None and tail.is_rank_sliced_format else None


def check_storage_claim(ckpt: Checkpoint, kind: Kind, findings: Findings) -> None:
    """Exl3Config.maybe_update_config / _validate_storage_metadata: without a rank-sliced tail
    the runtime needs a non-empty tensor_storage holding at least one EXL3 record."""
    if rank_sliced_tail(ckpt.config) is not None or ckpt.single_file is not None:
        return
    ts = runtime_storage(ckpt)[0]
    if not ts:
        if kind is Kind.R7:  # a plain EXL3 checkpoint gets EX020 from its family check
            findings.add(
                r7.R7_STORAGE_REQUIRED,
                "no hybrid_tr3_tail (format exl3-trellis) and no non-empty tensor_storage: "
                'the runtime refuses to start ("EXL3 requires quantization_config.json with '
                'a non-empty tensor_storage map")',
                file="quantization_config.json",
                pointer="/tensor_storage",
            )
        return
    if not any(isinstance(v, dict) and v.get("quant_format") == "exl3" for v in ts.values()):
        findings.add(
            ex.EX_NO_RECORDS,
            f"{len(ts)} records, none with quant_format 'exl3'",
            file="quantization_config.json",
            pointer="/tensor_storage",
        )


def _claimed_layers(ckpt: Checkpoint, names: ExpertPrefixes) -> set[int]:
    """Layers the runtime loads as EXL3 experts: those holding an expert trellis."""
    out: set[int] = set()
    for name in ckpt.tensors:
        if name.endswith(".trellis") and ".mlp.experts." in name:
            en = names.parse(name)
            if en is not None:
                out.add(en[0])
    return out


def check_expert_namespace(ckpt: Checkpoint, findings: Findings) -> None:
    """The model's load_weights expert mapping: every name under an expert projection must be an
    EXL3 component the loader has a parameter for."""
    # A name ending in a component both mappings accept is never refused: only the others are
    # parsed (one parse per projection prefix), and the claimed layers only if one parses.
    suspects = [
        name for name in ckpt.tensors if not name.endswith(_ACCEPTED) and ".mlp.experts." in name
    ]
    names = ExpertPrefixes()
    parsed = [(name, en) for name in suspects if (en := names.parse(name)) is not None]
    claimed = _claimed_layers(ckpt, names) if parsed else set()
    bad: list[tuple[str, str]] = []
    for name, (layer, _rank, field) in parsed:
        if layer in claimed and field not in EXPERT_FIELDS:
            bad.append((name, ckpt.tensors[name].file))

    def describe(item: tuple[str, str]) -> tuple[str, dict[str, Any]]:
        name, file = item
        field = name.rsplit(".", 1)[1]
        why = (
            "the runtime's EXL3 MoE method has no expert biases (it refuses a MoE layer with "
            "them: gpt-oss experts cannot be served as EXL3)"
            if field == "bias"
            else "the weight loader has no parameter for it"
        )
        return f"{field!r} is no EXL3 expert component: {why}", {"file": file, "tensor": name}

    more = "{n} more tensors with unknown fields in expert namespaces"
    findings.add_counted(ck.CK_EXPERT_FIELD, bad, describe, more, MAX_NAMED)


def _bitmap(tail: dict[str, Any]) -> tuple[str, str]:
    """The file and field a mixed tail's K per expert is read from (RS011 says when unusable)."""
    return bitmap_reference(tail.get("bits_per_expert")) or ("tier_bitmap.json", "k")


def _tier_layers(ckpt: Checkpoint, tail: dict[str, Any]) -> dict[int, set[int]]:
    """K values per layer of tier_bitmap.json inside moe_layers (bounded by the file, not by a
    hostile range). Unusable files are RS011's business: read quietly here."""
    layers = tail_layer_range(tail.get("moe_layers"))
    if layers is None:
        return {}
    name, field = _bitmap(tail)
    tb = bitmap_view(ckpt.json_file(name, Findings()), field)
    out: dict[int, set[int]] = {}
    for key, entry in tb.items() if isinstance(tb, dict) else ():
        ks = entry.get("k") if isinstance(entry, dict) else None
        inside = key.isascii() and key.isdecimal() and layers[0] <= int(key) <= layers[1]
        if inside and isinstance(ks, list):
            out[int(key)] = {k for k in map(runtime_k, ks) if k is not None}
    return out


def check_tail_bitrates(
    ckpt: Checkpoint, tail: dict[str, Any], runtime: str, findings: Findings
) -> None:
    """Exl3Config.rank_sliced_layer_bitrates, Exl3MoEMethod._prepare_rank_sliced_weights and
    _prepare_mixed_rank_sliced_weights: the bitrates a rank-sliced layer can run at."""
    ptr = "/hybrid_tr3_tail"
    bits = tail.get("bits")
    runtime = runtime if runtime in REFUSED_BY else "public"
    allowed = RANK_SLICED_K[runtime]
    x = runtime_bits(bits)  # float(bits), as the runtime reads it
    if not is_mixed_bits(bits) and x is not None and x > 0:
        k = whole_k(bits)
        if k is None:
            msg = f"bits {bits!r} is not integral: refused by {REFUSED_BY['cartridge']}"
        elif k not in allowed:
            msg = f"uniform K={k}: refused by {REFUSED_BY[runtime]}"
        else:
            return
        findings.add(r7.RS_RUNTIME_K, msg, file="config.json", pointer=pointer_join(ptr, "bits"))
        return
    if not is_mixed_bits(bits):
        return
    name, field = _bitmap(tail)
    if "/" in name and runtime == "public":
        findings.add(
            r7.RS_TIER_BITMAP,
            f"bits_per_expert names {name!r}, a path: refused by the hardened public revision "
            "(a bare file name at the checkpoint's root only; the R7 revision opens it)",
            file="config.json",
            pointer=pointer_join(ptr, "bits_per_expert"),
        )
    for layer, ks in sorted(_tier_layers(ckpt, tail).items()):
        where = dict(file=name, pointer=pointer_join(f"/{layer}", field))
        if len(ks) > 2:
            findings.add(
                r7.RS_MIXED_TIERS, f"layer {layer} uses {len(ks)} bitrates {sorted(ks)}", **where
            )
        elif len(ks) == 1 and next(iter(ks)) not in allowed:
            k = next(iter(ks))
            findings.add(
                r7.RS_RUNTIME_K,
                f"layer {layer} is uniform K={k}: refused by {REFUSED_BY[runtime]}",
                **where,
            )


_LAYER_INDEX = re.compile(r"layers\.(\d+)\b")  # the runtime's own pattern for a module's layer


class Dense(NamedTuple):
    """The tensors outside routed experts, and their EXL3 linears (one pass for every check)."""

    tensors: dict[str, TensorRef]
    linears: dict[str, LinearGroup]


def dense_linears(ckpt: Checkpoint) -> Dense:
    tensors = {n: r for n, r in ckpt.tensors.items() if ".mlp.experts." not in n}
    return Dense(tensors, group_linears(tensors))


def check_tail_codebooks(
    ckpt: Checkpoint, tail: dict[str, Any], dense: Dense, findings: Findings
) -> None:
    """Exl3Config.codebook_for_prefix with a rank-sliced tail: every module of a layer in its
    moe_layers is expected to be mcg, so a dense EXL3 linear the runtime claims there without
    the mcg marker is refused when its weights are processed (RS022)."""
    layers = tail_layer_range(tail.get("moe_layers"))
    if layers is None:
        return
    first, last = layers
    ts, _, _ = runtime_storage(ckpt)
    bad = []
    for prefix, group in sorted(dense.linears.items()):
        m = _LAYER_INDEX.search(prefix)
        if m is None or not first <= int(m.group(1)) <= last or "trellis" not in group.parts:
            continue
        codebook = codebook_of(group.parts)
        if codebook != "mcg" and claims_linear(ts, prefix):
            bad.append((group.parts["trellis"], codebook, m.group(1)))

    def describe(item: tuple[TensorRef, str, str]) -> tuple[str, dict[str, Any]]:
        ref, codebook, layer = item
        message = f"a {codebook} linear in layer {layer}, inside the tail's moe_layers "
        message += f"[{first}, {last}], where the runtime expects mcg"
        return message, {"file": ref.file, "tensor": ref.name}

    more = "{n} more dense linears without mcg in the tail's layers"
    findings.add_counted(r7.RS_TAIL_CODEBOOK, bad, describe, more, MAX_NAMED)


def _storage_keys(prefix: str) -> list[str]:
    """The tensor_storage keys under which the runtime finds the record of the linear `prefix`
    (Exl3Config._storage_entry): as named, with or without a leading `model.`, and with a
    `model` or `language_model` segment of a multimodal wrapper left out."""
    keys = [
        prefix,
        prefix.removeprefix("model.") if prefix.startswith("model.") else "model." + prefix,
    ]
    parts = prefix.split(".")
    for wrapper in ("model", "language_model"):
        for i, part in enumerate(parts[:-1]):
            if part == wrapper:
                short = ".".join(parts[:i] + parts[i + 1 :])
                keys += [short, "model." + short]
                if short.startswith("model."):
                    keys.append(short.removeprefix("model."))
    return list(dict.fromkeys(keys))


def runtime_storage(ckpt: Checkpoint) -> tuple[dict[str, Any], str, str]:
    """The tensor_storage map the runtime holds once configured, and where it comes from (file,
    JSON pointer). With a rank-sliced tail: config.json's embedded map alone (the config step
    returns before it would read quantization_config.json); without one, the embedded map if
    it is non-empty, else the file's."""
    emb = ckpt.embedded_quant
    ts = emb.get("tensor_storage") if isinstance(emb, dict) else None
    if rank_sliced_tail(ckpt.config) is not None or (isinstance(ts, dict) and ts):
        return (
            (ts if isinstance(ts, dict) else {}),
            "config.json",
            "/quantization_config/tensor_storage",
        )
    qc = ckpt.quant_config
    ts = qc.get("tensor_storage") if isinstance(qc, dict) else None
    return (ts if isinstance(ts, dict) else {}), "quantization_config.json", "/tensor_storage"


def claims_linear(storage: dict[str, Any], prefix: str) -> bool:
    """Whether `storage` holds an exl3 record the runtime finds for the linear `prefix`."""
    hit = storage.get(prefix)
    if isinstance(hit, dict) and hit.get("quant_format") == "exl3":
        return True  # the usual key, without building the other candidates
    records = (storage.get(k) for k in _storage_keys(prefix))
    return any(isinstance(r, dict) and r.get("quant_format") == "exl3" for r in records)


def check_linear_claims(ckpt: Checkpoint, dense: Dense, findings: Findings) -> None:
    """Exl3Config.get_quant_method for the dense linears of a checkpoint whose experts are not
    claimed through tensor_storage (R7, rank-sliced): a linear stored as EXL3 is loaded as EXL3
    only when the tensor_storage the runtime holds (`runtime_storage`) has an exl3 record for
    it."""
    ts, where, ptr = runtime_storage(ckpt)
    if not ts and rank_sliced_tail(ckpt.config) is None:
        return  # R7080 / EX020 say why the runtime refuses to start
    unclaimed = []
    for prefix, group in sorted(dense.linears.items()):
        if "trellis" in group.parts and not claims_linear(ts, prefix):
            unclaimed.append(group.parts["trellis"])
    message = (
        f"stored as EXL3 but the tensor_storage the runtime reads ({where}) has no exl3 record "
        "for it: the runtime loads the linear as unquantized and has no parameter for its trellis"
    )
    findings.add_counted(
        ex.EX_STORAGE_UNLISTED,
        unclaimed,
        lambda ref: (message, {"file": where, "tensor": ref.name, "pointer": ptr}),
        "{n} more EXL3 linears without an exl3 record",
        MAX_NAMED,
    )


# vLLM model classes' packed_modules_mapping: a fused module and the checkpoint linears it is
# loaded from (Llama, Qwen, Mistral, Gemma...; DeepSeek V2/V3 with a q LoRA rank)
PACKED_MODULES = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
    "fused_qkv_a_proj": ("q_a_proj", "kv_a_proj_with_mqa"),
}
_PACKED_SOURCE = {src: fused for fused, srcs in PACKED_MODULES.items() for src in srcs}


def check_packed_modules(ckpt: Checkpoint, dense: Dense, findings: Findings) -> None:
    """Exl3Config._linear_prefix_is_exl3: every source of a fused module is EXL3 (an exl3
    record the runtime finds) or none is. A source that is absent is not counted (Gemma's
    K=V attention stores no v_proj)."""
    ts, where, ptr = runtime_storage(ckpt)
    quantized = {p for p, g in dense.linears.items() if "trellis" in g.parts}
    plain = {n[: -len(".weight")] for n in dense.tensors if n.endswith(".weight")} - quantized
    sources: dict[tuple[str, str], dict[str, bool]] = {}  # (base, fused) -> source -> is exl3
    for prefix in quantized | plain:
        base, _, leaf = prefix.rpartition(".")
        fused = _PACKED_SOURCE.get(leaf)
        if fused is not None and base:
            exl3 = prefix in quantized and claims_linear(ts, prefix)
            sources.setdefault((base, fused), {})[leaf] = exl3
    for (base, fused), kinds in sorted(sources.items()):
        if any(kinds.values()) and not all(kinds.values()):
            unquantized = sorted(k for k, v in kinds.items() if not v)
            exl3 = sorted(k for k, v in kinds.items() if v)
            findings.add(
                ex.EX_PACKED_MIXED,
                f"{base}.{fused} is loaded from {', '.join(exl3)} (EXL3) and "
                f"{', '.join(unquantized)} (unquantized): the runtime refuses the fused module",
                file=where,
                tensor=f"{base}.{unquantized[0]}",
                pointer=ptr,
            )


_MODULE_FIELDS = (".weight", ".trellis", ".suh", ".svh", ".su", ".sv")


def check_r7_storage_records(ckpt: Checkpoint, dense: Dense, findings: Findings) -> None:
    """The records of the tensor_storage map an R7 checkpoint's runtime holds
    (Exl3Config._validate_storage_metadata; a record claims whatever linear it names), and
    Exl3Config.codebook_for_prefix for routed experts: a record found for an expert projection
    decides its codebook, before the R7 block's mcg."""
    ts, where, ptr = runtime_storage(ckpt)
    if not ts:
        return
    tensors = ckpt.tensors
    # records of modules the checkpoint ships (a stale record of a module not shipped, such as
    # an MTP layer left out, is never looked up); validated only without a rank-sliced tail
    # (with one, the config step returns before Exl3Config._validate_storage_metadata)
    live = {p: r for p, r in ts.items() if any(p + f in tensors for f in _MODULE_FIELDS)}
    validated = rank_sliced_tail(ckpt.config) is None
    check_storage_records(ckpt, live, dense.linears, findings, where, ptr, validated=validated)
    if not any(".mlp.experts." in key for key in ts):
        return
    wrong = _expert_codebook_mismatches(ts, tensors)

    def describe(item: tuple[str, str, str, str]) -> tuple[str, dict[str, Any]]:
        name, key, promised, held = item
        message = (
            f"the tensor_storage record {key!r} makes the runtime expect "
            + (f"the {promised} codebook" if promised != "3inst" else "no codebook marker")
            + " for this expert projection, which has "
            + (f"the {held} marker" if held != "3inst" else "no marker")
        )
        return message, {"file": where, "tensor": name, "pointer": pointer_join(ptr, key)}

    more = "{n} more expert projections with such a record"
    findings.add_counted(ex.EX_STORAGE_CODEBOOK, wrong, describe, more, MAX_NAMED)


def _expert_codebook_mismatches(
    ts: dict[str, Any], tensors: dict[str, Any]
) -> list[tuple[str, str, str, str]]:
    """(trellis, record key, codebook the record promises, marker the expert holds) of every
    expert projection whose record (found as the runtime finds it) promises another codebook."""
    wrong = []
    for name in tensors:
        if not name.endswith(".trellis") or ".mlp.experts." not in name:
            continue
        prefix = name[: -len(".trellis")]
        key = next((k for k in _storage_keys(prefix) if isinstance(ts.get(k), dict)), None)
        if key is None:
            continue
        stored = ts[key].get("stored_tensors")
        fields = {n.rpartition(".")[2] for n in stored} if isinstance(stored, dict) else set()
        promised = codebook_of(fields)
        held = codebook_of({m for m in ("mcg", "mul1") if f"{prefix}.{m}" in tensors})
        if promised != held:
            wrong.append((name, key, promised, held))
    return wrong


def check_r7_mixed_tail(ckpt: Checkpoint, tail: dict[str, Any], findings: Findings) -> None:
    """Exl3MoEMethod.create_weights with a carried tail: every EXL3 MoE layer, the R7 ones
    too, takes its bitrates from Exl3Config.rank_sliced_layer_bitrates, which for mixed bits
    knows only the layers of the tail's range."""
    if not is_mixed_bits(tail.get("bits")):
        return
    emb = ckpt.embedded_quant
    block = emb.get("r7_routed_experts") if isinstance(emb, dict) else None
    moe = layer_range(block.get("moe_layers")) if isinstance(block, dict) else None
    if moe is None:
        return  # the R7 block's own rules report it
    covered = tail_layer_range(tail.get("moe_layers"))
    outside = [
        layer
        for layer in (moe[0], moe[1], (covered or (0, -1))[1] + 1)
        if moe[0] <= layer <= moe[1] and not (covered and covered[0] <= layer <= covered[1])
    ]
    if not outside:
        return
    span = f"layers {covered[0]}..{covered[1]}" if covered else "no usable layer range"
    findings.add(
        r7.R7_TAIL_MIXED,
        f"the carried hybrid_tr3_tail has bits 'mixed': the runtime then looks up every EXL3 "
        f"MoE layer's bitrates in the tail's bitmap, which holds {span}, so R7 layer "
        f'{min(outside)} is refused ("bitrate map has no layer {min(outside)}")',
        file="config.json",
        pointer="/hybrid_tr3_tail/bits",
    )


def check_conformance(
    ckpt: Checkpoint, kind: Kind, findings: Findings, options: ValidateOptions
) -> None:
    """Every runtime-conformance check that applies to a checkpoint of `kind`."""
    # both read config.json's tail: missing or unusable, its own finding is the cause
    usable = "config.json" not in ckpt.rejected_files
    dense = dense_linears(ckpt)
    if kind in (Kind.R7, Kind.EXL3) and usable:
        check_storage_claim(ckpt, kind, findings)
    if kind is Kind.EXL3 and usable and rank_sliced_tail(ckpt.config) is None:
        findings.add(
            ex.EX_SERVE_EAGER,
            "no rank-sliced tail: the runtime builds this model only with --enforce-eager",
            file="config.json",
            pointer="/quantization_config",
        )
    if kind in (Kind.R7, Kind.RANK_SLICED) and usable:
        check_linear_claims(ckpt, dense, findings)  # a plain EXL3 checkpoint: EX022 in its family
    if usable:
        check_packed_modules(ckpt, dense, findings)
    if kind is Kind.R7 and usable:
        check_r7_storage_records(ckpt, dense, findings)
    if kind is not Kind.MSRT_BASE:  # the base profile's component rule (MB007) covers it
        check_expert_namespace(ckpt, findings)
    elif options.runtime == "public":
        findings.add(
            mb.MB_PUBLIC_RUNTIME,
            "an MSRT base runs on the cartridge revision only: the public revisions refuse its "
            "tail (no tp) and its K",
            file="config.json",
            pointer="/hybrid_tr3_tail",
        )
    tail = rank_sliced_tail(ckpt.config)
    if tail is not None and kind in (Kind.RANK_SLICED, Kind.R7):
        check_tail_bitrates(ckpt, tail, options.runtime, findings)
    if tail is not None and kind is Kind.R7:
        check_r7_mixed_tail(ckpt, tail, findings)
    if tail is not None and kind in (Kind.RANK_SLICED, Kind.R7) and usable:
        check_tail_codebooks(ckpt, tail, dense, findings)


__all__ = [
    "RUNTIMES",
    "check_conformance",
    "claims_linear",
    "rank_sliced_tail",
    "runtime_storage",
]
