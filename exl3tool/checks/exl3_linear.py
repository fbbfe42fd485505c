"""EXL3 linears (EX rules, docs/formats/exl3.md §1): one `{prefix}.trellis/.suh/.svh[.mcg|.mul1][.bias]`
group at a time; marker reads and the NaN/Inf scan are deferred to `flush_payload_checks`.
Shared by the plain EXL3, R7 and rank-sliced families."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from exl3tool.checks.payload import FiniteCheck, ShardFacts, read_scalar_i32, run_deferred
from exl3tool.formats.checkpoint import TensorRef
from exl3tool.formats.exl3 import HALF_K, MCG_MARKER, MUL1_MARKER, LinearGroup, k_of_last_dim
from exl3tool.io.views import TensorReader
from exl3tool.rules import exl3 as ex
from exl3tool.rules.registry import Findings, Severity

MARKER_VALUES = {"mcg": MCG_MARKER, "mul1": MUL1_MARKER}
EXPERTS = ".mlp.experts."  # in the prefix of every routed expert's linear


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
    """EX010/EX011: an I32 scalar holding the exact sentinel (the 4 bytes are read with pread)."""
    info = ref.info
    if info.dtype != "I32" or info.shape != ():
        one = info.dtype == "I32" and all(d == 1 for d in info.shape)  # [1], [1, 1]: one value
        findings.add(
            ex.EX_MARKER_DTYPE,
            f"{kind} marker is {info.dtype}{list(info.shape)}, expected I32 []"
            + (
                " (the runtime takes any one-element int32; exllamav3 writes a scalar)"
                if one
                else ""
            ),
            file=ref.file,
            tensor=ref.name,
            severity=Severity.WARNING if one else None,
        )
        if not one:
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
    *,
    findings: Findings,
    finite: FiniteCheck,
) -> None:
    """suh/svh (F16 [size]) or, except for a routed expert, legacy su/sv (I16 [size/16]);
    EX004/5, EX007/8, EX014."""
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
    if ref is None or EXPERTS in group.prefix:
        # the runtime's MoE method has parameters for suh/svh only: no legacy path for experts
        t = group.trellis
        also = f" (legacy .{old} is not read for a routed expert)" if ref is not None else ""
        findings.add(
            missing,
            f"no {group.prefix}.{new}" + (also or f" (or legacy .{old})"),
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
    k_in, n_out = _trellis_dims(t, parts, findings)
    _vector(group, "suh", "su", k_in, findings=findings, finite=finite)
    _vector(group, "svh", "sv", n_out, findings=findings, finite=finite)
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


def _trellis_dims(
    t: TensorRef, parts: dict[str, TensorRef], findings: Findings
) -> tuple[int | None, int | None]:
    """EX001-EX003, EX013 of the trellis; (in_features, out_features) when its shape is usable."""
    if not check_trellis_dtype(t, findings):
        return None, None
    k = k_of_last_dim(t.info.shape[2])
    if k is None:
        findings.add(
            ex.EX_TRELLIS_K,
            f"last dimension {t.info.shape[2]} is not 16*K for K in 1..8 or 1.5/2.5/3.5",
            file=t.file,
            tensor=t.name,
        )
    elif k in HALF_K:
        if "mul1" not in parts:
            findings.add(
                ex.EX_HALF_K, f"K = {k} needs the mul1 codebook", file=t.file, tensor=t.name
            )
        findings.add(
            ex.EX_HALF_K_NOT_SERVED,
            f"K = {k} (last dimension {t.info.shape[2]}): the serving runtime refuses it",
            file=t.file,
            tensor=t.name,
        )
    k_in, n_out = t.info.shape[0] * 16, t.info.shape[1] * 16
    if k_in % 128 or n_out % 128:
        findings.add(
            ex.EX_DIM_128,
            f"in_features {k_in} x out_features {n_out}: both must be multiples of 128",
            file=t.file,
            tensor=t.name,
        )
    return k_in, n_out


def check_linears(
    groups: dict[str, LinearGroup],
    tensors: dict[str, TensorRef],
    findings: Findings,
    reader: TensorReader,
    finite: FiniteCheck,
) -> None:
    for group in groups.values():
        check_linear(group, tensors, findings, reader, finite)


def check_tables(tables: list[str], tensors: dict[str, TensorRef], findings: Findings) -> None:
    """EX033 for each quantized embedding table (formats/exl3.is_quantized_table)."""
    for prefix in tables:
        ref = tensors[f"{prefix}.trellis"]
        shape = "x".join(map(str, ref.info.shape))
        findings.add(
            ex.EX_QUANTIZED_TABLE,
            f"{prefix} is a quantized table ({ref.info.dtype} {shape} trellis rows and signs, "
            "no weight): the serving runtime has no EXL3 embedding to load it into",
            file=ref.file,
            tensor=ref.name,
        )


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


def flush_payload_checks(
    reader: TensorReader,
    finite: FiniteCheck,
    findings: Findings,
    facts: dict[Path, ShardFacts] | None = None,
) -> None:
    """Run the deferred marker reads and the finiteness scan (one gather per shard, or the
    shard's facts read ahead)."""

    def bad_marker(ref: TensorRef, value: int, expected: int) -> None:
        findings.add(
            ex.EX_MARKER_VALUE,
            _marker_message(value, expected),
            file=ref.file,
            tensor=ref.name,
        )

    markers = getattr(reader, "markers", None)
    run_deferred(reader, markers, finite, bad_marker, report_nonfinite(findings), facts)
