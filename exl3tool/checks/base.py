"""Checks of a cartridge-capable EXL3 base, `exl3-msrt-base/1` (msrt-cartridge-format.md §5-§6).

Headers and configs are always checked (closed profile, rank0 storage, four components per
(expert, projection), uniform K == bits, geometry, the published identity's self-consistency:
root == hash of its own map). Recomputing `compatibility_by_layer` from the tensor bytes reads
every routed-expert payload (hundreds of GB on a real base), so it runs only under `--hash`
(`options.hash`), like every other payload digest of `validate`; `stage-cartridge` always does it.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from exl3tool.checks.options import ValidateOptions
from exl3tool.checks.routers import check_routers
from exl3tool.formats import msrt_spec as spec
from exl3tool.formats.checkpoint import Checkpoint
from exl3tool.formats.names import PROJECTIONS, parse_expert
from exl3tool.io import schemas
from exl3tool.io.strict_json import pointer_join
from exl3tool.io.views import TensorReader
from exl3tool.rules import base as mb
from exl3tool.rules.registry import Findings

KIND = "msrt-base"
SCHEMA_FILE = "exl3-msrt-base-1.schema.json"
_PTR = "/hybrid_tr3_tail"
_SUMLINE = re.compile(r"^([0-9a-f]{64}) [ *](.+)$")


def _validator() -> Any:
    return schemas.validator(SCHEMA_FILE)


def base_k(tail: Any) -> int | None:
    """The profile's `bits` as an int K (a float from the producer, an int in tests)."""
    bits = tail.get("bits") if isinstance(tail, dict) else None
    if isinstance(bits, bool) or not isinstance(bits, int | float) or bits != int(bits):
        return None
    return int(bits)


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


def _tensors(ckpt: Checkpoint, tail: dict[str, Any], k: int | None, findings: Findings) -> None:
    comps: dict[tuple[int, int, str], dict[str, Any]] = defaultdict(dict)
    for name, ref in ckpt.tensors.items():
        en = parse_expert(name)
        if en is None:
            if ".mlp.experts." in name:
                findings.add(
                    mb.MB_RANK, "not a rank0 routed-expert tensor name", file=ref.file, tensor=name
                )
            continue
        if en.rank != 0:
            findings.add(
                mb.MB_RANK,
                f"rank {en.rank}: exl3-msrt-base/1 stores rank0 only",
                file=ref.file,
                tensor=name,
            )
            continue
        if en.field not in spec.BASE_COMPONENTS:
            findings.add(
                mb.MB_COMPONENT,
                f"{en.field} is not a base expert component",
                file=ref.file,
                tensor=name,
            )
            continue
        comps[(en.layer, en.expert, en.proj)][en.field] = ref
    layers: dict[int, set[int]] = defaultdict(set)
    ks: dict[Any, str] = {}
    from exl3tool.formats.msrt_spec import base_sizes

    hidden, inter, n_experts = base_sizes(ckpt.config)
    with TensorReader() as rd:
        for (layer, expert, proj), parts in sorted(comps.items()):
            layers[layer].add(expert)
            prefix = f"model.layers.{layer}.mlp.experts.{expert}.{proj}.rank0"
            missing = [c for c in spec.BASE_COMPONENTS if c not in parts]
            if missing:
                findings.add(mb.MB_INCOMPLETE, f"lacks {', '.join(missing)}", tensor=prefix)
            t = parts.get("trellis")
            if t is not None:
                sh = t.info.shape
                if t.info.dtype != "I16" or len(sh) != 3 or sh[2] % 16:
                    findings.add(
                        mb.MB_COMPONENT,
                        f"trellis is {t.info.dtype}{list(sh)}",
                        file=t.file,
                        tensor=t.name,
                    )
                    t = None
                else:
                    ks.setdefault(sh[2] // 16, t.name)
                    if (
                        hidden
                        and inter
                        and sh != spec.trellis_shape(proj, hidden, inter, sh[2] // 16)
                    ):
                        want = spec.trellis_shape(proj, hidden, inter, sh[2] // 16)
                        findings.add(
                            mb.MB_GEOMETRY,
                            f"shape {list(sh)}, config.json sizes (hidden {hidden}, intermediate {inter}) give {list(want)}",
                            file=t.file,
                            tensor=t.name,
                        )
            for comp, axis in (("suh", 0), ("svh", 1)):
                v = parts.get(comp)
                if v is None:
                    continue
                want_len = t.info.shape[axis] * 16 if t is not None else None
                if (
                    v.info.dtype != "F16"
                    or len(v.info.shape) != 1
                    or (want_len and v.info.shape[0] != want_len)
                ):
                    findings.add(
                        mb.MB_COMPONENT,
                        f"{comp} is {v.info.dtype}{list(v.info.shape)}, expected F16 [{want_len}]",
                        file=v.file,
                        tensor=v.name,
                    )
            m = parts.get("mcg")
            if m is not None:
                if m.info.dtype != "I32" or m.info.shape != ():
                    findings.add(
                        mb.MB_COMPONENT,
                        f"mcg is {m.info.dtype}{list(m.info.shape)}, expected I32 []",
                        file=m.file,
                        tensor=m.name,
                    )
                elif bytes(rd.payload(m.shard, m.info)) != spec.MCG_MARKER_BYTES:
                    findings.add(
                        mb.MB_MCG, "mcg marker is not 0xCBAC1FED", file=m.file, tensor=m.name
                    )
    for layer in sorted({layer for layer, _e, _p in comps}):
        for expert in sorted(layers[layer]):
            missing = [p for p in PROJECTIONS if (layer, expert, p) not in comps]
            if missing:
                findings.add(
                    mb.MB_INCOMPLETE,
                    f"expert lacks {', '.join(missing)}",
                    tensor=f"model.layers.{layer}.mlp.experts.{expert}",
                )
    if len(ks) > 1:
        findings.add(
            mb.MB_K,
            f"experts do not share one K: {sorted(ks)}; the cartridge runtime requires a uniform base bitrate",
            tensor=sorted(ks.values())[0],
        )
    elif ks and k is not None and next(iter(ks)) != k:
        findings.add(
            mb.MB_K,
            f"tensors have K={next(iter(ks))} but bits is {k}",
            file="config.json",
            pointer=_PTR + "/bits",
        )
    cov = tail.get("moe_layer_coverage")
    seen_layers = sorted(layers)
    if isinstance(cov, list) and cov != seen_layers:
        findings.add(
            mb.MB_LAYERS,
            f"moe_layer_coverage {cov} but tensors hold layers {seen_layers}",
            file="config.json",
            pointer=_PTR + "/moe_layer_coverage",
        )
    ml = tail.get("moe_layers")
    if seen_layers and isinstance(ml, list) and ml != [seen_layers[0], seen_layers[-1]]:
        findings.add(
            mb.MB_LAYERS,
            f"moe_layers {ml} must be [min, max] = {[seen_layers[0], seen_layers[-1]]}",
            file="config.json",
            pointer=_PTR + "/moe_layers",
        )
    epl = tail.get("experts_per_layer")
    experts = epl if type(epl) is int else n_experts
    check_routers(ckpt, sorted(layers), experts, hidden, mb.MB_ROUTER, findings)
    if type(epl) is int:
        for layer, es in sorted(layers.items()):
            if es != set(range(epl)):
                findings.add(
                    mb.MB_EXPERTS,
                    f"layer {layer} holds experts {sorted(es)}, experts_per_layer is {epl}",
                    file="config.json",
                    pointer=_PTR + "/experts_per_layer",
                )


def _identity(
    ckpt: Checkpoint,
    tail: dict[str, Any],
    k: int | None,
    findings: Findings,
    options: ValidateOptions,
) -> None:
    from exl3tool.identity.compat import compat_identity, root_digest

    by_layer, root = tail.get("compatibility_by_layer"), tail.get("compatibility_sha256")
    cov = tail.get("moe_layer_coverage")
    if (
        isinstance(by_layer, dict)
        and isinstance(cov, list)
        and set(by_layer) != {str(x) for x in cov}
    ):
        findings.add(
            mb.MB_MAP_KEYS,
            f"keys {sorted(by_layer)} differ from moe_layer_coverage {cov}",
            file="config.json",
            pointer=_PTR + "/compatibility_by_layer",
        )
    if (
        k is not None
        and isinstance(by_layer, dict)
        and isinstance(root, str)
        and root_digest(k, by_layer) != root
    ):
        findings.add(
            mb.MB_ROOT,
            "compatibility_sha256 does not match its compatibility_by_layer map",
            file="config.json",
            pointer=_PTR + "/compatibility_sha256",
        )
    if not options.hash or k is None:
        return
    ident = compat_identity(ckpt, k=k, threads=options.threads)
    if ident.root is None:
        return
    for L, digest in sorted(ident.layers.items(), key=lambda kv: int(kv[0])):
        published = by_layer.get(L) if isinstance(by_layer, dict) else None
        if published != digest:
            findings.add(
                mb.MB_LAYER_DIGEST,
                f"layer {L}: published {published}, recomputed from the bytes {digest}: do not match compatibility digest",
                file="config.json",
                pointer=pointer_join(_PTR + "/compatibility_by_layer", L),
            )
    if isinstance(root, str) and root != ident.root:
        findings.add(
            mb.MB_ROOT,
            f"compatibility_sha256 {root} but the bytes give {ident.root}",
            file="config.json",
            pointer=_PTR + "/compatibility_sha256",
        )


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


def _manifest(ckpt: Checkpoint, findings: Findings, options: ValidateOptions) -> None:
    root = ckpt.root
    path = root / "MANIFEST.sha256"
    if not path.is_file():
        findings.add(
            mb.MB_MANIFEST_ABSENT, "the base has no MANIFEST.sha256", file="MANIFEST.sha256"
        )
        return
    listed: dict[str, str] = {}
    for i, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        m = _SUMLINE.match(line)
        if not m:
            findings.add(
                mb.MB_MANIFEST, f"line {i} is not a sha256sum line", file="MANIFEST.sha256"
            )
            continue
        listed[m.group(2)] = m.group(1)
    present: set[str] = set()
    for dirpath, dirs, files in os.walk(root):
        for name in files + [d for d in dirs if (Path(dirpath) / d).is_symlink()]:
            p = Path(dirpath) / name
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                findings.add(mb.MB_MANIFEST, "symlink inside the base", file=rel)
            elif rel != "MANIFEST.sha256" and not rel.startswith("."):
                present.add(rel)
    for rel in sorted(present - set(listed)):
        findings.add(mb.MB_MANIFEST, "file not listed in MANIFEST.sha256", file=rel)
    for rel in sorted(set(listed) - present):
        findings.add(mb.MB_MANIFEST, "listed in MANIFEST.sha256 but absent", file=rel)
    if options.hash:
        from exl3tool.identity.engine import hash_files

        names = sorted(set(listed) & present)
        digests = hash_files([root / n for n in names], "sha256", options.threads)
        for n in names:
            if digests[root / n] != listed[n]:
                findings.add(mb.MB_MANIFEST_HASH, "sha256 differs from MANIFEST.sha256", file=n)


def check_base(ckpt: Checkpoint, findings: Findings, options: ValidateOptions) -> str:
    """Every offline rule of an `exl3-msrt-base/1` base; returns the kind ("msrt-base")."""
    tail = (ckpt.config or {}).get("hybrid_tr3_tail")
    if not isinstance(tail, dict):
        findings.add(
            mb.MB_FIELDS,
            "config.json has no hybrid_tr3_tail profile",
            file="config.json",
            pointer=_PTR,
        )
        return KIND
    _schema(tail, findings)
    k = base_k(tail)
    _tensors(ckpt, tail, k, findings)
    _identity(ckpt, tail, k, findings, options)
    _quant(ckpt, k, findings)
    _tier(ckpt, k, findings)
    _manifest(ckpt, findings, options)
    return KIND
