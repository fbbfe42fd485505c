"""Checks of plain `tensor_storage` EXL3 checkpoints (EX rules; docs/formats/exl3.md §2 and
docs/formats/r7.md §8). The per-linear rules are in `exl3_linear`."""

from __future__ import annotations

import re
from typing import Any

from exl3tool.checks.exl3_experts import check_expert_geometry
from exl3tool.checks.exl3_linear import check_linears, check_tables, flush_payload_checks
from exl3tool.checks.exl3_tp import check_tp_slices, of_groups
from exl3tool.checks.options import ValidateOptions
from exl3tool.checks.payload import FiniteCheck, RandomAccessReader
from exl3tool.checks.routers import check_routers
from exl3tool.formats.checkpoint import Checkpoint
from exl3tool.formats.exl3 import (
    MCG_MULTIPLIER,
    MUL1_MULTIPLIER,
    LinearGroup,
    codebook_of,
    group_linears,
)
from exl3tool.formats.experts import config_int, expert_count, model_config
from exl3tool.formats.names import is_encoder_tower, layer_of
from exl3tool.io.dtypes import TORCH_NAMES
from exl3tool.io.strict_json import pointer_join
from exl3tool.rules import checkpoint as ck
from exl3tool.rules import exl3 as ex
from exl3tool.rules.registry import Findings, Severity

MULTIPLIERS = {
    "mcg": ("mcg_multiplier", MCG_MULTIPLIER),
    "mul1": ("mul1_multiplier", MUL1_MULTIPLIER),
}
QC = "quantization_config.json"
STORED_FIELDS = frozenset(("trellis", "suh", "svh", "su", "sv", "mcg", "mul1"))


def _record_problem(rec: Any) -> str | None:
    """Exl3Config._validate_storage_metadata: a record that is not an object fails its
    `.get`; an exl3 one needs stored tensors whose last name parts hold trellis, suh|su and
    svh|sv and not both mcg and mul1. A record of another format is not looked into. Stricter
    than the runtime in one point: its stored tensors must be an object, as every writer makes
    them (EX021-EX023 and EX032 read their descriptions)."""
    if not isinstance(rec, dict):
        return "record must be an object"
    if rec.get("quant_format") != "exl3":
        return None
    names = rec.get("stored_tensors")
    if not isinstance(names, dict):  # the runtime would also iterate a list; no writer makes one
        return "an exl3 record needs a stored_tensors object"
    has = {name.rsplit(".", 1)[-1] for name in names}
    if "trellis" not in has or not has & {"suh", "su"} or not has & {"svh", "sv"}:
        return "an exl3 record needs trellis, suh|su and svh|sv"
    if {"mcg", "mul1"} <= has:
        return "an exl3 record must not have both mcg and mul1"
    return None


def check_tensor_storage(
    ckpt: Checkpoint, groups: dict[str, LinearGroup], findings: Findings
) -> None:
    """quantization_config.json's tensor_storage, and config.json's embedded map where it is not
    empty and differs: one revision of the runtime reads the embedded map when it has one
    (Exl3Config.maybe_update_config), another the file's, so both must describe the shards."""
    qc = ckpt.quant_config
    if qc is None:
        findings.add(ck.CK_QUANT_CONFIG, "quantization_config.json is missing", file=QC)
        return
    ts = qc.get("tensor_storage")
    if not isinstance(ts, dict) or not ts:
        findings.add(
            ex.EX_STORAGE_MISSING,
            "no non-empty tensor_storage map (vLLM: serve an actual bpw revision)",
            file=QC,
            pointer="/tensor_storage",
        )
        return
    _check_storage_map(ckpt, ts, groups, findings, QC, "/tensor_storage")
    emb = ckpt.embedded_quant
    embedded = emb.get("tensor_storage") if isinstance(emb, dict) else None
    if isinstance(embedded, dict) and embedded and embedded != ts:
        _check_storage_map(
            ckpt, embedded, groups, findings, "config.json", "/quantization_config/tensor_storage"
        )


def _check_storage_map(
    ckpt: Checkpoint,
    ts: dict,
    groups: dict[str, LinearGroup],
    findings: Findings,
    file: str,
    base: str,
) -> None:
    """Every record of one tensor_storage map, and every EXL3 tensor listed in its own record
    (the runtime looks a linear up by its prefix and takes its codebook from that record)."""
    check_storage_records(ckpt, ts, groups, findings, file, base)
    mtp = _mtp_layers(model_config(ckpt.config))
    for prefix, group in groups.items():
        rec = ts.get(prefix)
        own = rec.get("stored_tensors") if isinstance(rec, dict) else None
        own = own if isinstance(own, dict) else {}
        unlisted = [ref for fld, ref in group.parts.items() if fld in STORED_FIELDS]
        unlisted = [ref for ref in unlisted if ref.name not in own]
        if not unlisted:
            continue
        message, severity = _unlisted(prefix, rec is not None, mtp)
        if severity is not None:  # a warning: once per linear
            message += f" ({len(unlisted)} tensors)" if len(unlisted) > 1 else ""
            unlisted = unlisted[:1]
        for ref in unlisted:
            findings.add(
                ex.EX_STORAGE_UNLISTED,
                message,
                file=file,
                tensor=ref.name,
                pointer=pointer_join(base, prefix),
                severity=severity,
            )


_DECODER = re.compile(r"(?:model\.)?(?:language_model\.)?(?:model\.)?layers\.(0|[1-9][0-9]{0,5})\.")


def _mtp_layers(config: Any) -> range:
    """The decoder layers a config declares as MTP heads: num_nextn_predict_layers of them
    after its num_hidden_layers (none when either is not a plain integer)."""
    n = config_int(config, "num_hidden_layers")
    mtp = config_int(config, "num_nextn_predict_layers")
    if n is None or mtp is None or n < 0 or not 0 < mtp <= 64:
        return range(0)
    return range(n, n + mtp)


def _unlisted(prefix: str, has_record: bool, mtp: range) -> tuple[str, Severity | None]:
    """EX022's message, and its severity: a warning for a declared MTP layer's linear (built
    only as a speculative draft), the rule's error otherwise."""
    if has_record:
        return "EXL3 tensor not listed in its linear's tensor_storage record", None
    vision = is_encoder_tower(prefix)
    decoder = _DECODER.match(prefix)
    in_mtp = decoder is not None and int(decoder.group(1)) in mtp
    if not vision and (in_mtp or "mtp" in prefix.split(".")):
        return (
            "EXL3 tensor of an MTP-layer linear without a tensor_storage record: the runtime "
            "builds MTP layers only as a speculative draft, and then cannot load it "
            "(exllamav3's converter writes no record for MTP modules)",
            Severity.WARNING,
        )
    why = "the runtime builds it unquantized and has no parameter for a trellis"
    if vision:
        why += " (exllamav3's converter writes no record for vision modules)"
    return f"EXL3 tensor of a linear without a tensor_storage record: {why}", None


def check_storage_records(
    ckpt: Checkpoint,
    ts: dict,
    groups: dict[str, LinearGroup],
    findings: Findings,
    file: str,
    base: str,
    *,
    validated: bool = True,
) -> None:
    """The records of a tensor_storage map: well formed (EX025; `validated` False: a runtime
    path that does not validate them, only a record it cannot read at all is reported), their
    stored tensors held as described (EX021, EX023), and for the linears of `groups` their
    bits and codebook."""
    for prefix, rec in ts.items():
        ptr = pointer_join(base, prefix)
        problem = _record_problem(rec)
        if problem is not None and (validated or not isinstance(rec, dict)):
            findings.add(ex.EX_STORAGE_RECORD, problem, file=file, pointer=ptr)
        if not isinstance(rec, dict) or not isinstance(rec.get("stored_tensors"), dict):
            continue  # nothing listed with a description to hold the shards to
        for name, meta in rec["stored_tensors"].items():
            _check_stored(ckpt, name, meta, pointer_join(ptr, "stored_tensors"), file, findings)
        group = groups.get(prefix)
        if rec.get("quant_format") == "exl3" and group is not None:
            _check_record_bits(prefix, rec, group, ptr, file, findings)
            _check_record_codebook(prefix, rec, group, ptr, file, findings)


def _check_record_codebook(
    prefix: str, rec: dict, group: LinearGroup, ptr: str, file: str, findings: Findings
) -> None:
    """EX032: the record promises a marker the linear does not have (or another one)."""
    promised = codebook_of({name.rsplit(".", 1)[-1] for name in rec["stored_tensors"]})
    held = group.codebook
    if promised != "3inst" and promised != held:
        findings.add(
            ex.EX_STORAGE_CODEBOOK,
            f"the record lists a .{promised} marker, so the runtime expects the {promised} "
            f"codebook; {prefix} has " + (f"a .{held} marker" if held != "3inst" else "no marker"),
            file=file,
            tensor=f"{prefix}.trellis",
            pointer=pointer_join(ptr, "stored_tensors"),
        )


def _check_stored(
    ckpt: Checkpoint, name: str, meta: Any, base: str, file: str, findings: Findings
) -> None:
    """One stored_tensors entry: present in a shard, with the shard's shape, dtype and size."""
    sptr = pointer_join(base, name)
    ref = ckpt.tensors.get(name)
    if ref is None:
        findings.add(
            ex.EX_STORAGE_ABSENT, "listed but in no shard", file=file, tensor=name, pointer=sptr
        )
        return
    want = {
        "shape": list(ref.info.shape),
        "dtype": TORCH_NAMES.get(ref.info.dtype, ref.info.dtype),
        "n_bytes": ref.info.nbytes,
    }
    got = meta if isinstance(meta, dict) else {}
    bad = [f"{k} {got.get(k)!r} != {v!r}" for k, v in want.items() if got.get(k) != v]
    if bad:
        findings.add(ex.EX_STORAGE_MISMATCH, "; ".join(bad), file=file, tensor=name, pointer=sptr)


def _check_record_bits(
    prefix: str, rec: dict, group: LinearGroup, ptr: str, file: str, findings: Findings
) -> None:
    k = group.k
    bpw = rec.get("bits_per_weight")
    if bpw is not None and k is not None and (type(bpw) not in (int, float) or bpw != k):
        findings.add(
            ex.EX_STORAGE_BITS,
            f"bits_per_weight {bpw!r}, trellis K = {k}",
            file=file,
            tensor=f"{prefix}.trellis",
            pointer=pointer_join(ptr, "bits_per_weight"),
        )
    for kind, (key, value) in MULTIPLIERS.items():
        if key in rec and (kind not in group.parts or rec[key] != value):
            findings.add(
                ex.EX_STORAGE_MULTIPLIER,
                f"{key} {rec[key]!r} but the .{kind} marker is "
                + ("absent" if kind not in group.parts else "present"),
                file=file,
                tensor=f"{prefix}.{kind}",
                pointer=pointer_join(ptr, key),
            )


def check_config_drift(ckpt: Checkpoint, findings: Findings) -> None:
    """EX027: the embedded dict equals quantization_config.json minus tensor_storage."""
    emb, ext = ckpt.embedded_quant, ckpt.quant_config
    if not isinstance(emb, dict) or not isinstance(ext, dict):
        return
    ext = {k: v for k, v in ext.items() if k != "tensor_storage"}
    emb = {k: v for k, v in emb.items() if k != "tensor_storage"}
    if emb != ext:
        keys = sorted(k for k in set(emb) | set(ext) if emb.get(k) != ext.get(k))
        findings.add(
            ex.EX_CONFIG_DRIFT,
            f"keys differ: {', '.join(keys[:8])}",
            file="config.json",
            pointer=pointer_join("/quantization_config", keys[0])
            if keys
            else "/quantization_config",
        )


def check_exl3(ckpt: Checkpoint, findings: Findings, options: ValidateOptions) -> None:
    """A plain EXL3 checkpoint: every linear, tensor_storage, embedded/external agreement, and
    the runtime's TP split at `options.tp`."""
    tables: list[str] = []
    groups = group_linears(ckpt.tensors, tables)
    check_tables(tables, ckpt.tensors, findings)
    check_tp_slices(ckpt, of_groups(groups), options.tp, findings)
    if not groups and ckpt.tensors:
        findings.add(
            ex.EX_NO_LINEARS,
            f"no {{prefix}}.trellis tensor in any of {len(ckpt.shards)} shards",
            file=QC if ckpt.quant_config is not None else next(iter(ckpt.shards)),
            pointer="/tensor_storage" if ckpt.quant_config is not None else None,
        )
    finite = FiniteCheck()
    with RandomAccessReader() as reader:
        check_linears(groups, ckpt.tensors, findings, reader, finite)
        flush_payload_checks(reader, finite, findings)
    if ckpt.single_file is None:
        check_tensor_storage(ckpt, groups, findings)
        check_config_drift(ckpt, findings)
    moe = sorted({layer_of(n) for n in ckpt.tensors if ".mlp.experts." in n} - {None})
    count = expert_count(ckpt.config)
    hidden = config_int(ckpt.config, "hidden_size")
    n_experts = count[1] if count else None
    check_routers(ckpt, moe, n_experts, hidden, rule=ex.EX_ROUTER, findings=findings)
    check_expert_geometry(ckpt, findings)
