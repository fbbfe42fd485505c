"""Checks of EXL3 linears and of plain `tensor_storage` EXL3 checkpoints (EX rules).

exl3-format.md §1-§2 and r7-checkpoint-format.md §8.
"""

from __future__ import annotations

from typing import Any

from exl3tool.checks.checkpoint import (
    FiniteCheck,
    RandomAccessReader,
    config_int,
    expert_count,
    read_scalar_i32,
)
from exl3tool.checks.options import ValidateOptions
from exl3tool.checks.routers import check_routers
from exl3tool.formats.checkpoint import Checkpoint, TensorRef
from exl3tool.formats.exl3 import (
    HALF_K,
    MCG_MARKER,
    MCG_MULTIPLIER,
    MUL1_MARKER,
    MUL1_MULTIPLIER,
    LinearGroup,
    group_linears,
    k_of_last_dim,
)
from exl3tool.formats.names import layer_of
from exl3tool.io.dtypes import TORCH_NAMES
from exl3tool.io.strict_json import pointer_join
from exl3tool.io.views import TensorReader
from exl3tool.rules import checkpoint as ck
from exl3tool.rules import exl3 as ex
from exl3tool.rules.registry import Findings

MARKER_VALUES = {"mcg": MCG_MARKER, "mul1": MUL1_MARKER}
MULTIPLIERS = {
    "mcg": ("mcg_multiplier", MCG_MULTIPLIER),
    "mul1": ("mul1_multiplier", MUL1_MULTIPLIER),
}


def check_trellis_dtype(ref: TensorRef, findings: Findings) -> bool:
    """EX001: I16 rank 3. Returns whether the shape can be used."""
    info = ref.info
    if info.dtype != "I16" or len(info.shape) != 3:
        findings.add(
            ex.EX_TRELLIS_DTYPE,
            f"trellis is {info.dtype}{list(info.shape)}, expected I16 [k/16, n/16, 16*K]",
            file=ref.file,
            tensor=ref.name,
        )
        return False
    return True


def check_marker(reader: TensorReader, ref: TensorRef, kind: str, findings: Findings) -> None:
    """EX010/EX011: an I32 scalar holding the exact sentinel (the 4 bytes are read via mmap)."""
    info = ref.info
    if info.dtype != "I32" or info.shape != ():
        findings.add(
            ex.EX_MARKER_DTYPE,
            f"{kind} marker is {info.dtype}{list(info.shape)}, expected I32 []",
            file=ref.file,
            tensor=ref.name,
        )
        return
    deferred = getattr(reader, "markers", None)
    if deferred is not None:  # RandomAccessReader: one vectorised read per shard at flush
        deferred.add(ref, MARKER_VALUES[kind])
        return
    value = read_scalar_i32(reader, ref)
    if value is not None and value != MARKER_VALUES[kind]:
        findings.add(
            ex.EX_MARKER_VALUE,
            _marker_message(value, MARKER_VALUES[kind]),
            file=ref.file,
            tensor=ref.name,
        )


def _vector(
    group: LinearGroup,
    new: str,
    old: str,
    size: int | None,
    findings: Findings,
    finite: FiniteCheck,
) -> None:
    """suh/svh (F16 [size]) or legacy su/sv (I16 [size/16]); EX004/5, EX007/8, EX014."""
    missing, shape_rule = (
        (ex.EX_MISSING_SUH, ex.EX_SUH_SHAPE)
        if new == "suh"
        else (ex.EX_MISSING_SVH, ex.EX_SVH_SHAPE)
    )
    ref = group.parts.get(new)
    if ref is not None:
        finite.add(ref)
        if size is not None and (ref.info.dtype != "F16" or ref.info.shape != (size,)):
            findings.add(
                shape_rule,
                f"{new} is {ref.info.dtype}{list(ref.info.shape)}, expected F16 [{size}]",
                file=ref.file,
                tensor=ref.name,
            )
        return
    ref = group.parts.get(old)
    if ref is None:
        t = group.trellis
        findings.add(
            missing,
            f"no {group.prefix}.{new} (or legacy .{old})",
            file=t.file if t else None,
            tensor=f"{group.prefix}.{new}",
        )
        return
    findings.add(ex.EX_LEGACY_SIGNS, f"legacy packed signs .{old}", file=ref.file, tensor=ref.name)
    if size is not None and (ref.info.dtype != "I16" or ref.info.shape != (size // 16,)):
        findings.add(
            shape_rule,
            f"{old} is {ref.info.dtype}{list(ref.info.shape)}, expected I16 [{size // 16}]",
            file=ref.file,
            tensor=ref.name,
        )


def check_linear(
    group: LinearGroup,
    tensors: dict[str, TensorRef],
    findings: Findings,
    reader: TensorReader,
    finite: FiniteCheck,
) -> None:
    """Every EX rule of one `{prefix}.trellis/.suh/.svh[.mcg|.mul1][.bias]` group."""
    parts = group.parts
    t = group.trellis
    if t is None:
        any_ref = next(iter(parts.values()))
        findings.add(
            ex.EX_MISSING_TRELLIS,
            f"{group.prefix} has {sorted(parts)} but no trellis",
            file=any_ref.file,
            tensor=f"{group.prefix}.trellis",
        )
        return
    k_in = n_out = None
    if check_trellis_dtype(t, findings):
        k = k_of_last_dim(t.info.shape[2])
        if k is None:
            findings.add(
                ex.EX_TRELLIS_K,
                f"last dimension {t.info.shape[2]} is not 16*K for K in 1..8 or 1.5/2.5/3.5",
                file=t.file,
                tensor=t.name,
            )
        elif k in HALF_K and "mul1" not in parts:
            findings.add(
                ex.EX_HALF_K, f"K = {k} needs the mul1 codebook", file=t.file, tensor=t.name
            )
        k_in, n_out = t.info.shape[0] * 16, t.info.shape[1] * 16
        if k_in % 128 or n_out % 128:
            findings.add(
                ex.EX_DIM_128,
                f"in_features {k_in} x out_features {n_out}: both must be multiples of 128",
                file=t.file,
                tensor=t.name,
            )
    _vector(group, "suh", "su", k_in, findings, finite)
    _vector(group, "svh", "sv", n_out, findings, finite)
    if "mcg" in parts and "mul1" in parts:
        findings.add(
            ex.EX_BOTH_MARKERS,
            "both .mcg and .mul1 markers present",
            file=parts["mcg"].file,
            tensor=parts["mcg"].name,
        )
    for kind in ("mcg", "mul1"):
        if kind in parts:
            check_marker(reader, parts[kind], kind, findings)
    bias = parts.get("bias")
    if (
        bias is not None
        and n_out is not None
        and (bias.info.dtype not in ("F16", "F32") or bias.info.shape != (n_out,))
    ):
        findings.add(
            ex.EX_BIAS_SHAPE,
            f"bias is {bias.info.dtype}{list(bias.info.shape)}, expected F16 [{n_out}]",
            file=bias.file,
            tensor=bias.name,
        )
    scale = tensors.get(f"{group.prefix}.scale")
    if scale is not None:
        findings.add(
            ex.EX_OBSOLETE_SCALE,
            "obsolete .scale on an EXL3 linear",
            file=scale.file,
            tensor=scale.name,
        )


def check_linears(
    groups: dict[str, LinearGroup],
    tensors: dict[str, TensorRef],
    findings: Findings,
    reader: TensorReader,
    finite: FiniteCheck,
) -> None:
    for group in groups.values():
        check_linear(group, tensors, findings, reader, finite)


def report_nonfinite(findings: Findings) -> Any:
    def report(ref: TensorRef) -> None:
        findings.add(ex.EX_NONFINITE, "NaN or Inf among the scales", file=ref.file, tensor=ref.name)

    return report


def _marker_message(value: int, expected: int) -> str:
    kind = next(k for k, v in MARKER_VALUES.items() if v == expected)
    return (
        f"{kind} marker is {value} (0x{value & 0xFFFFFFFF:08X}), expected "
        f"{expected} (0x{expected & 0xFFFFFFFF:08X})"
    )


def flush_payload_checks(reader: TensorReader, finite: FiniteCheck, findings: Findings) -> None:
    """Run the deferred marker reads and the finiteness scan (zero-copy, one gather per shard)."""
    markers = getattr(reader, "markers", None)
    if markers is not None:

        def bad_marker(ref: TensorRef, value: int, expected: int) -> None:
            findings.add(
                ex.EX_MARKER_VALUE,
                _marker_message(value, expected),
                file=ref.file,
                tensor=ref.name,
            )

        markers.run(reader, bad_marker)
    finite.run(reader, report_nonfinite(findings))


# --- tensor_storage (exl3-format.md §2, r7 §8) ----------------------------------------------------

QC = "quantization_config.json"


def _record_problem(prefix: str, rec: Any) -> str | None:
    if not isinstance(rec, dict) or not isinstance(rec.get("stored_tensors"), dict):
        return "record must be an object with a stored_tensors object"
    if rec.get("quant_format") != "exl3":
        return None
    names = rec["stored_tensors"]
    has = {
        f for f in ("trellis", "suh", "su", "svh", "sv", "mcg", "mul1") if f"{prefix}.{f}" in names
    }
    if "trellis" not in has or not has & {"suh", "su"} or not has & {"svh", "sv"}:
        return "an exl3 record needs trellis, suh|su and svh|sv"
    if {"mcg", "mul1"} <= has:
        return "an exl3 record must not have both mcg and mul1"
    return None


def check_tensor_storage(
    ckpt: Checkpoint, groups: dict[str, LinearGroup], findings: Findings
) -> None:
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
    listed: set[str] = set()
    for prefix, rec in ts.items():
        ptr = pointer_join("/tensor_storage", prefix)
        problem = _record_problem(prefix, rec)
        if problem is not None:
            findings.add(ex.EX_STORAGE_RECORD, problem, file=QC, pointer=ptr)
            if not isinstance(rec, dict) or not isinstance(rec.get("stored_tensors"), dict):
                continue
        stored = rec["stored_tensors"]
        for name, meta in stored.items():
            listed.add(name)
            sptr = pointer_join(pointer_join(ptr, "stored_tensors"), name)
            ref = ckpt.tensors.get(name)
            if ref is None:
                findings.add(
                    ex.EX_STORAGE_ABSENT,
                    "listed but in no shard",
                    file=QC,
                    tensor=name,
                    pointer=sptr,
                )
                continue
            want = {
                "shape": list(ref.info.shape),
                "dtype": TORCH_NAMES.get(ref.info.dtype, ref.info.dtype),
                "n_bytes": ref.info.nbytes,
            }
            got = meta if isinstance(meta, dict) else {}
            bad = [f"{k} {got.get(k)!r} != {v!r}" for k, v in want.items() if got.get(k) != v]
            if bad:
                findings.add(
                    ex.EX_STORAGE_MISMATCH, "; ".join(bad), file=QC, tensor=name, pointer=sptr
                )
        group = groups.get(prefix)
        if rec.get("quant_format") == "exl3" and group is not None:
            _check_record_bits(prefix, rec, group, ptr, findings)
    for prefix, group in groups.items():
        for fld, ref in group.parts.items():
            if (
                fld in ("trellis", "suh", "svh", "su", "sv", "mcg", "mul1")
                and ref.name not in listed
            ):
                findings.add(
                    ex.EX_STORAGE_UNLISTED,
                    "EXL3 tensor not listed in tensor_storage",
                    file=QC,
                    tensor=ref.name,
                    pointer=pointer_join("/tensor_storage", prefix),
                )


def _check_record_bits(
    prefix: str, rec: dict, group: LinearGroup, ptr: str, findings: Findings
) -> None:
    k = group.k
    bpw = rec.get("bits_per_weight")
    if bpw is not None and k is not None and (type(bpw) not in (int, float) or bpw != k):
        findings.add(
            ex.EX_STORAGE_BITS,
            f"bits_per_weight {bpw!r}, trellis K = {k}",
            file=QC,
            tensor=f"{prefix}.trellis",
            pointer=pointer_join(ptr, "bits_per_weight"),
        )
    for kind, (key, value) in MULTIPLIERS.items():
        if key in rec and (kind not in group.parts or rec[key] != value):
            findings.add(
                ex.EX_STORAGE_MULTIPLIER,
                f"{key} {rec[key]!r} but the .{kind} marker is "
                + ("absent" if kind not in group.parts else "present"),
                file=QC,
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
    """A plain EXL3 checkpoint: every linear, tensor_storage, embedded/external agreement."""
    del options  # no TP or hash rules for the plain profile yet
    groups = group_linears(ckpt.tensors)
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
    check_routers(ckpt, moe, count[1] if count else None, hidden, ex.EX_ROUTER, findings)
