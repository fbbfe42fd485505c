"""What the serving runtime (the vLLM fork's EXL3 loader) refuses before it serves, predicted from
configs and headers (docs/runtime-conformance.md; the map itself is `rules/conformance.py`).

The family checks verify the formats; these close the gaps where a format-valid artifact is still
refused by the runtime: its config step, its expert-name mapping and its kernel bitrates.
"""

from __future__ import annotations

from typing import Any

from exl3tool.checks.options import ValidateOptions
from exl3tool.formats.checkpoint import Checkpoint
from exl3tool.formats.detect import Kind
from exl3tool.formats.names import ExpertPrefixes
from exl3tool.formats.tail import config_tail
from exl3tool.io.strict_json import is_json_int, pointer_join
from exl3tool.rules import checkpoint as ck
from exl3tool.rules import exl3 as ex
from exl3tool.rules import r7 as r7
from exl3tool.rules.registry import Findings

# Runtime revisions `--runtime` can target. "public": the strictest public revisions (the R7 and
# main exl3.py); "cartridge": the cartridge-era revision (uniform rank-sliced K 2..6).
RUNTIMES = ("public", "cartridge")
UNIFORM_K = {"public": range(3, 7), "cartridge": range(2, 7)}
REFUSED_BY = {
    "public": "the public R7 and main revisions (integral 3/4/5/6 only)",
    "cartridge": "every revision, the cartridge revision included (2..6)",
}
PLAIN_FIELDS = frozenset(("trellis", "suh", "svh", "su", "sv", "mcg", "mul1"))
RANKED_FIELDS = frozenset(("trellis", "suh", "svh", "mcg", "mul1"))  # the rank-sliced regex
_ACCEPTED = tuple(f".{f}" for f in sorted(RANKED_FIELDS))  # RANKED_FIELDS is within PLAIN_FIELDS
MAX_NAMED = 20  # expert-namespace findings named one by one; the rest are counted


def rank_sliced_tail(config: Any) -> dict[str, Any] | None:
    """The `hybrid_tr3_tail` the runtime takes the rank-sliced path for, if any."""
    tail = config_tail(config)
    return dict(tail.raw) if tail is not None and tail.is_rank_sliced_format else None


def storage_map(ckpt: Checkpoint) -> Any:
    """The tensor_storage the runtime ends up with: the embedded one, else the file's."""
    emb = ckpt.embedded_quant
    ts = emb.get("tensor_storage") if isinstance(emb, dict) else None
    if isinstance(ts, dict) and ts:
        return ts
    qc = ckpt.quant_config
    return qc.get("tensor_storage") if isinstance(qc, dict) else None


def check_storage_claim(ckpt: Checkpoint, kind: Kind, findings: Findings) -> None:
    """Exl3Config.maybe_update_config / _validate_storage_metadata: without a rank-sliced tail
    the runtime needs a non-empty tensor_storage holding at least one EXL3 record."""
    if rank_sliced_tail(ckpt.config) is not None or ckpt.single_file is not None:
        return
    ts = storage_map(ckpt)
    if not isinstance(ts, dict) or not ts:
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
    for name, (layer, rank, field) in parsed:
        if layer in claimed and field not in (PLAIN_FIELDS if rank is None else RANKED_FIELDS):
            bad.append((name, ckpt.tensors[name].file))
    for name, file in bad[:MAX_NAMED]:
        findings.add(
            ck.CK_EXPERT_FIELD,
            f"{name.rsplit('.', 1)[1]!r} is no EXL3 expert component: the weight loader has no "
            "parameter for it",
            file=file,
            tensor=name,
        )
    if len(bad) > MAX_NAMED:
        findings.add(
            ck.CK_EXPERT_FIELD,
            f"{len(bad) - MAX_NAMED} more tensors with unknown fields in expert namespaces",
            file=bad[MAX_NAMED][1],
            tensor=bad[MAX_NAMED][0],
        )


def _tier_layers(ckpt: Checkpoint, tail: dict[str, Any]) -> dict[int, set[int]]:
    """K values per layer of tier_bitmap.json inside moe_layers (bounded by the file, not by a
    hostile range). Unusable files are RS011's business: read quietly here."""
    layers = tail.get("moe_layers")
    if not (isinstance(layers, list) and len(layers) == 2 and all(map(is_json_int, layers))):
        return {}
    tb = ckpt.json_file("tier_bitmap.json", Findings())
    out: dict[int, set[int]] = {}
    for key, entry in tb.items() if isinstance(tb, dict) else ():
        ks = entry.get("k") if isinstance(entry, dict) else None
        if key.isdigit() and layers[0] <= int(key) <= layers[1] and isinstance(ks, list):
            out[int(key)] = {k for k in ks if is_json_int(k)}
    return out


def check_tail_bitrates(
    ckpt: Checkpoint, tail: dict[str, Any], runtime: str, findings: Findings
) -> None:
    """Exl3Config.rank_sliced_layer_bitrates, Exl3MoEMethod._prepare_rank_sliced_weights and
    _prepare_mixed_rank_sliced_weights: the bitrates a rank-sliced layer can run at."""
    ptr = "/hybrid_tr3_tail"
    bits = tail.get("bits")
    allowed = UNIFORM_K.get(runtime, UNIFORM_K["public"])
    if bits != "mixed" and type(bits) in (int, float) and bits > 0:
        if bits != int(bits):
            msg = f"bits {bits!r} is not integral: refused by {REFUSED_BY['cartridge']}"
        elif int(bits) not in allowed:
            msg = f"uniform K={int(bits)}: refused by {REFUSED_BY[runtime]}"
        else:
            return
        findings.add(r7.RS_RUNTIME_K, msg, file="config.json", pointer=pointer_join(ptr, "bits"))
        return
    if bits != "mixed":
        return
    for layer, ks in sorted(_tier_layers(ckpt, tail).items()):
        where = dict(file="tier_bitmap.json", pointer=pointer_join(f"/{layer}", "k"))
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


def check_conformance(
    ckpt: Checkpoint, kind: Kind, findings: Findings, options: ValidateOptions
) -> None:
    """Every runtime-conformance check that applies to a checkpoint of `kind`."""
    # the storage claim reads config.json's tail too: unparseable, its JSON finding is the cause
    if kind in (Kind.R7, Kind.EXL3) and "config.json" not in ckpt.rejected_files:
        check_storage_claim(ckpt, kind, findings)
    if kind is not Kind.MSRT_BASE:  # the base profile's component rule (MB007) covers it
        check_expert_namespace(ckpt, findings)
    tail = rank_sliced_tail(ckpt.config)
    if tail is not None and kind in (Kind.RANK_SLICED, Kind.R7):
        check_tail_bitrates(ckpt, tail, options.runtime, findings)


__all__ = ["RUNTIMES", "check_conformance", "rank_sliced_tail", "storage_map"]
