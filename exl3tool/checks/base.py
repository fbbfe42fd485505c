"""Checks of a cartridge-capable EXL3 base, `exl3-msrt-base/1` (docs/formats/msrt.md §5-§6).

Headers and configs are always checked (closed profile, rank0 storage, four components per
(expert, projection), uniform K == bits, geometry, the published identity's self-consistency:
root == hash of its own map). Recomputing `compatibility_by_layer` from the tensor bytes reads
every routed-expert payload (hundreds of GB on a real base), so it runs only under `--hash`
(`options.hash`), like every other payload digest of `validate`; `stage-cartridge` always does it.
"""

from __future__ import annotations

from typing import Any

from exl3tool.checks.base_identity import check_identity, check_manifest
from exl3tool.checks.base_tensors import check_tensors
from exl3tool.checks.exl3_tp import check_tp_slices, trellises
from exl3tool.checks.options import ValidateOptions
from exl3tool.formats import msrt_spec as spec
from exl3tool.formats.checkpoint import Checkpoint
from exl3tool.formats.tail import POINTER as _PTR
from exl3tool.formats.tail import config_tail
from exl3tool.io import schemas
from exl3tool.io.strict_json import pointer_join
from exl3tool.rules import base as mb
from exl3tool.rules.registry import Findings

KIND = "msrt-base"
SCHEMA_FILE = "exl3-msrt-base-1.schema.json"


def _validator() -> Any:
    return schemas.validator(SCHEMA_FILE)


def _schema(tail: dict[str, Any], findings: Findings) -> None:
    seen: set[str] = set()
    for err in sorted(
        _validator().iter_errors(tail), key=lambda e: list(map(str, e.absolute_path))
    ):
        path = list(err.absolute_path)
        if not path:
            r = (
                mb.MB_FIELDS
                if err.validator in ("required", "additionalProperties")
                else mb.MB_VALUE
            )
            missing = [f for f in spec.BASE_TAIL_FIELDS if f not in tail]
            unknown = sorted(set(tail) - set(spec.BASE_TAIL_FIELDS))
            msg = f"closed exl3-msrt-base/1: missing={missing}, unexpected={unknown}"
        else:
            r = {
                "moe_layers": mb.MB_LAYERS,
                "moe_layer_coverage": mb.MB_LAYERS,
                "experts_per_layer": mb.MB_EXPERTS,
                "compatibility_sha256": mb.MB_ROOT,
                "compatibility_by_layer": mb.MB_MAP_KEYS,
                "bits": mb.MB_K,
            }.get(path[0], mb.MB_VALUE)
            msg = err.message[:300]
        ptr = _PTR + "".join(pointer_join("", t) for t in path)
        if (r.code, ptr) not in seen:
            seen.add((r.code, ptr))
            findings.add(r, msg, file="config.json", pointer=ptr)


def _quant(ckpt: Checkpoint, k: int | None, findings: Findings) -> None:
    qc = ckpt.embedded_quant if ckpt.embedded_quant is not None else ckpt.quant_config
    want = {"quant_method": "exl3", "bits": k, "codebook": "mcg", "version": "rank-sliced"}
    if not isinstance(qc, dict):
        findings.add(
            mb.MB_QUANT,
            "no quantization_config",
            file="config.json",
            pointer="/quantization_config",
        )
        return
    for key, value in want.items():
        if value is not None and qc.get(key) != value:
            findings.add(
                mb.MB_QUANT,
                f"{key} is {qc.get(key)!r}, expected {value!r}",
                file="config.json",
                pointer=f"/quantization_config/{key}",
            )


def _tier(ckpt: Checkpoint, k: int | None, findings: Findings) -> None:
    tb = ckpt.json_file("tier_bitmap.json", findings)
    if tb is None or k is None:
        return
    for L, entry in tb.items() if isinstance(tb, dict) else []:
        for key in ("k", "bits_per_expert"):
            vals = entry.get(key) if isinstance(entry, dict) else None
            if vals is not None and (not isinstance(vals, list) or any(v != k for v in vals)):
                findings.add(
                    mb.MB_TIER,
                    f"layer {L} {key} is not the uniform K {k}",
                    file="tier_bitmap.json",
                    pointer=f"/{L}/{key}",
                )


def check_base(ckpt: Checkpoint, findings: Findings, options: ValidateOptions) -> str:
    """Every offline rule of an `exl3-msrt-base/1` base; returns the kind ("msrt-base")."""
    tail = config_tail(ckpt.config)
    if tail is None:
        findings.add(
            mb.MB_FIELDS,
            "config.json has no hybrid_tr3_tail profile",
            file="config.json",
            pointer=_PTR,
        )
        return KIND
    _schema(tail.raw, findings)
    k = tail.k
    check_tensors(ckpt, tail.raw, k, findings)
    check_identity(ckpt, tail.raw, k, findings, options)
    _quant(ckpt, k, findings)
    _tier(ckpt, k, findings)
    check_manifest(ckpt, findings, options)
    # each rank slices rank0's full experts for itself (docs/formats/msrt.md §5)
    check_tp_slices(ckpt, trellises(ckpt.tensors, full_rank=True), options.tp, findings)
    return KIND
