"""Configs that travel with slices: verbatim copies, per-rank `tensor_storage`, the legacy
rank-sliced `hybrid_tr3_tail` (docs/formats/r7.md §7.1)."""

from __future__ import annotations

import copy
import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from exl3tool.formats.checkpoint import Checkpoint
from exl3tool.formats.detect import Kind
from exl3tool.formats.names import parse_expert
from exl3tool.io.strict_json import MAX_DEPTH, pretty_json
from exl3tool.tp.slices import TensorSlice

MANIFEST_NAME = "exl3tool-slices.json"
RANK_SLICED_SCHEMA = "model.layers.{L}.mlp.experts.{E}.{proj}.rank{r}.{trellis|suh|svh|mcg}"
# files that describe the source's own shards: never carried to a differently laid-out output
_NOT_CARRIED = re.compile(
    r"(\.safetensors$|^model\.safetensors\.index\.json$|^MANIFEST\.(json|sha256)$"
    r"|^r7-experts-layer-[0-9]+\.json$|^r7-v1-layer-.*\.json$|^exl3tool-slices\.json$)"
)
CONFIG_NAMES = ("config.json", "quantization_config.json")


def dump_json(value: Any, depth: int = MAX_DEPTH) -> bytes:
    """Indented JSON; `depth` keeps the deeper levels of large documents on one line (fast)."""
    return (pretty_json(value, depth, ensure_ascii=False) + "\n").encode()


def carried_files(ckpt: Checkpoint) -> list[str]:
    """Top-level regular files of the source copied next to the slices (configs, tokenizer...)."""
    if ckpt.single_file is not None:
        return []
    out = []
    for e in sorted(os.scandir(ckpt.root), key=lambda e: e.name):
        # a link to a file is carried as that file (HF cache snapshots link into blobs/)
        if _is_file(e) and not _NOT_CARRIED.search(e.name):
            out.append(e.name)
    return out


def _is_file(entry: os.DirEntry[str]) -> bool:
    """A regular file, or a link to one; a link that loops (ELOOP) or cannot be followed is
    not carried (the loader reports the configs it needed)."""
    try:
        return entry.is_file()
    except OSError:
        return False


def _storage_for(storage: Any, slices: dict[str, TensorSlice]) -> Any:
    """`tensor_storage` restricted to one rank's tensors, with their sliced shapes."""
    if not isinstance(storage, dict):
        return storage
    out: dict[str, Any] = {}
    for module, entry in storage.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("stored_tensors"), dict):
            out[module] = entry
            continue
        stored = {}
        for name, rec in entry["stored_tensors"].items():
            s = slices.get(name)
            if s is None:
                continue
            rec = dict(rec) if isinstance(rec, dict) else rec
            if isinstance(rec, dict):
                rec["shape"] = list(s.shape)
                rec["n_bytes"] = s.nbytes
            stored[name] = rec
        if stored:
            out[module] = {**entry, "stored_tensors": stored}
    return out


def _with_storage(qc: Any, slices: dict[str, TensorSlice]) -> Any:
    if isinstance(qc, dict) and "tensor_storage" in qc:
        return {**qc, "tensor_storage": _storage_for(qc["tensor_storage"], slices)}
    return qc


def write_rank_configs(ckpt: Checkpoint, dst: Path, slices: Iterable[TensorSlice]) -> list[str]:
    """Copy the carried files into a rank directory; `tensor_storage` describes the rank."""
    by_name = {s.target_name: s for s in slices}
    names = carried_files(ckpt)
    for name in names:
        if name == "config.json" and isinstance(ckpt.config, dict):
            cfg = dict(ckpt.config)
            if "quantization_config" in cfg:
                cfg["quantization_config"] = _with_storage(cfg["quantization_config"], by_name)
            (dst / name).write_bytes(dump_json(cfg) if cfg != ckpt.config else _read(ckpt, name))
        elif name == "quantization_config.json" and isinstance(ckpt.quant_config, dict):
            qc = _with_storage(ckpt.quant_config, by_name)
            (dst / name).write_bytes(
                dump_json(qc) if qc != ckpt.quant_config else _read(ckpt, name)
            )
        else:
            shutil.copyfile(ckpt.root / name, dst / name)  # a real file, also for a link
    return names


def _read(ckpt: Checkpoint, name: str) -> bytes:
    return (ckpt.root / name).read_bytes()


def _expert_ks(ckpt: Checkpoint) -> dict[int, dict[int, dict[str, int]]]:
    """K per (layer, expert, projection) from the trellis shapes (§3.2: K = shape[2] // 16)."""
    out: dict[int, dict[int, dict[str, int]]] = {}
    for name, ref in ckpt.tensors.items():
        e = parse_expert(name)
        if e is None or e.field != "trellis" or len(ref.info.shape) != 3:
            continue
        out.setdefault(e.layer, {}).setdefault(e.expert, {})[e.proj] = ref.info.shape[2] // 16
    return out


def _codebook(ckpt: Checkpoint) -> str:
    fields = {parse_expert(n).field for n in ckpt.tensors if parse_expert(n) is not None}
    return (
        "mul1"
        if "mul1" in fields and "mcg" not in fields
        else ("mcg" if "mcg" in fields else "3inst")
    )


def rank_sliced_tail(ckpt: Checkpoint, kind: Kind, tp: int) -> tuple[dict, dict | None]:
    """The legacy `hybrid_tr3_tail` (§7.1) describing a rank-sliced output, and the
    `tier_bitmap.json` it needs with mixed bits (None with one K)."""
    ks = _expert_ks(ckpt)
    layers = sorted(ks)
    experts = max((len(v) for v in ks.values()), default=0)
    values = sorted({k for lay in ks.values() for ex in lay.values() for k in ex.values()})
    tail: dict[str, Any] = {
        "format": "exl3-trellis",
        "bits": values[0] if len(values) == 1 else "mixed",
        "codebook": _codebook(ckpt),
        "experts_per_layer": experts,
        "moe_layers": [layers[0], layers[-1]] if layers else [0, 0],
        "tensor_schema": RANK_SLICED_SCHEMA,
        "tp": tp,
    }
    # R7 shared vectors are written per expert (plan.SHARED_VECTORS), like the carried MTP layer
    tail["rotation_layout"] = "per_expert_v1"
    bitmap = None
    if len(values) > 1:
        tail["k_values"] = values
        tail["bits_per_expert"] = "tier_bitmap.json:k"
        # one K per expert: plan_slices refuses experts whose projections differ in K
        bitmap = {str(L): {"k": [max(ks[L][e].values()) for e in sorted(ks[L])]} for L in layers}
    return tail, bitmap


def _drop_experts_storage(qc: Any) -> Any:
    if not isinstance(qc, dict):
        return qc
    qc = {k: v for k, v in qc.items() if k != "r7_routed_experts"}
    st = qc.get("tensor_storage")
    if isinstance(st, dict):
        qc["tensor_storage"] = {m: e for m, e in st.items() if ".mlp.experts." not in m}
    return qc


def write_rank_sliced_configs(ckpt: Checkpoint, kind: Kind, tp: int, dst: Path) -> list[str]:
    """Carried files for the rank-sliced layout: the tail replaced by the legacy profile, the R7
    block and expert `tensor_storage` removed (the tail now governs the routed experts)."""
    tail, bitmap = rank_sliced_tail(ckpt, kind, tp)
    names = carried_files(ckpt)
    for name in names:
        if name == "config.json" and isinstance(ckpt.config, dict):
            cfg = copy.deepcopy(ckpt.config)
            cfg["hybrid_tr3_tail"] = tail
            if "quantization_config" in cfg:
                cfg["quantization_config"] = _drop_experts_storage(cfg["quantization_config"])
            (dst / name).write_bytes(dump_json(cfg))
        elif name == "quantization_config.json" and isinstance(ckpt.quant_config, dict):
            (dst / name).write_bytes(dump_json(_drop_experts_storage(ckpt.quant_config)))
        elif name == "tier_bitmap.json" and bitmap is not None:
            continue
        else:
            shutil.copyfile(ckpt.root / name, dst / name)
    if "config.json" not in names:
        (dst / "config.json").write_bytes(dump_json({"hybrid_tr3_tail": tail}))
        names.append("config.json")
    if bitmap is not None:
        (dst / "tier_bitmap.json").write_bytes(dump_json(bitmap))
        if "tier_bitmap.json" not in names:
            names.append("tier_bitmap.json")
    return sorted(names)


def index_json(parts, base: str = "") -> bytes:
    """`model.safetensors.index.json` for parts (paths relative to the index's directory)."""
    wm: dict[str, str] = {}
    total = 0
    for p in parts:
        rel = p.path[len(base) :] if base and p.path.startswith(base) else p.path
        for s in p.slices:
            wm[s.target_name] = rel
            total += s.nbytes
    doc = {"metadata": {"total_size": total}, "weight_map": dict(sorted(wm.items()))}
    return dump_json(doc, depth=2)
