"""Checks of R7 checkpoints (R7 rules; r7-checkpoint-format.md §1-§6, §9).

Order: the block (schema, then the integer rules vLLM enforces), embedded vs external copies,
every routed expert of every layer (header-only except 4-byte marker reads and a finiteness scan
of the scale vectors), per-layer manifests, MANIFEST.json, the carried MTP tail, TP alignment.
Digests are recomputed only under `--hash`.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from exl3tool.checks.checkpoint import (
    Digests,
    ExpertTable,
    FiniteCheck,
    RandomAccessReader,
    expert_count,
    expert_table,
    schema_errors,
    sha_ok,
)
from exl3tool.checks.exl3 import (
    check_linears,
    check_marker,
    check_trellis_dtype,
    flush_payload_checks,
)
from exl3tool.checks.options import ValidateOptions
from exl3tool.checks.rank_sliced import (
    TailContext,
    check_tail,
    report_missing_expert_count,
    tail_layers,
)
from exl3tool.checks.routers import check_routers
from exl3tool.formats.checkpoint import Checkpoint, TensorRef
from exl3tool.formats.exl3 import group_linears
from exl3tool.formats.names import PROJECTIONS
from exl3tool.io.paths import relative_path_problem
from exl3tool.io.strict_json import is_json_int, pointer_join
from exl3tool.io.views import TensorReader
from exl3tool.rules import checkpoint as ck
from exl3tool.rules import r7 as r7
from exl3tool.rules.registry import Findings

SCHEMA_ID = "r7-complete-v2-checkpoint-v1"
MARKER = "CODEX_ROUND7"
QC = "quantization_config.json"
BLOCK_SCHEMA = "r7-routed-experts.schema.json"
MANIFEST_SCHEMA = "r7-layer-manifest.schema.json"
MAX_MISSING = 20
SEAL_RE = re.compile(r"^([0-9a-f]{64})  MANIFEST\.json\n?$")
MANIFEST_OPTIONAL = (
    "marker", "recipe_version", "schema_version", "layer", "shard", "allocation_target_bpw",
    "vector_refs", "roundtrip_hashes", "shared_vectors", "tensor_provenance", "provenance",
    "permutations", "final_expert_artifact_sha256",
)  # fmt: skip
CKPT_MANIFEST_OPTIONAL = (
    "marker", "recipe_version", "schema", "carrier", "carried_tensor_payload_sha256",
    "tensor_count", "r7_layer_manifest_sha256", "assembly_transaction_id",
)  # fmt: skip
# The block fields vLLM validates, and the rule each one's defects fall under (§2.1).
BLOCK_RULES = {
    "schema": r7.R7_SCHEMA,
    "codebook": r7.R7_CODEBOOK_BITS,
    "bits": r7.R7_CODEBOOK_BITS,
    "moe_layers": r7.R7_MOE_LAYERS,
    "k_values": r7.R7_K_VALUES,
}


def layer_shard(layer: int) -> str:
    return f"r7-experts-layer-{layer:03d}.safetensors"


def layer_manifest(layer: int) -> str:
    return f"r7-experts-layer-{layer:03d}.json"


@dataclass
class Block:
    first: int
    last: int
    k_values: set[int]
    file: str
    base: str  # JSON pointer of the block inside `file`


@dataclass
class R7Payload:
    """What the payload says, per layer: K per (expert, proj), for manifests and `inspect`."""

    k: dict[tuple[int, int, str], int] = field(default_factory=dict)
    by_layer: dict[int, dict[str, int]] = field(default_factory=dict)  # layer -> prefix -> K
    trellis: dict[str, TensorRef] = field(default_factory=dict)  # prefix -> trellis

    def tiers(self) -> dict[int, int]:
        by_layer: dict[int, set[int]] = {}
        for (layer, _e, _p), k in self.k.items():
            by_layer.setdefault(layer, set()).add(k)
        return {layer: len(ks) for layer, ks in sorted(by_layer.items())}


# --- the block (§2) -------------------------------------------------------------------------


def check_block(block: Any, file: str, base: str, findings: Findings) -> Block | None:
    """Schema errors mapped to the rule of their field, then what JSON Schema cannot say:
    floats posing as ints (3.0) and last >= first."""
    if not isinstance(block, dict):
        findings.add(
            r7.R7_BLOCK_TYPE, "r7_routed_experts must be an object", file=file, pointer=base
        )
        return None
    reported: set[str] = set()
    for ptr, msg, path in schema_errors(BLOCK_SCHEMA, block):
        key = str(path[0]) if path else ""
        if key in reported:
            continue
        r = BLOCK_RULES.get(key, r7.R7_BLOCK_FIELD)
        if key in BLOCK_RULES:
            reported.add(key)
        findings.add(r, msg, file=file, pointer=base + ptr)
    ml, kv = block.get("moe_layers"), block.get("k_values")
    ok_layers = (
        isinstance(ml, list)
        and len(ml) == 2
        and all(is_json_int(x) and x >= 0 for x in ml)
        and ml[1] >= ml[0]
    )
    if not ok_layers and "moe_layers" not in reported:
        findings.add(
            r7.R7_MOE_LAYERS,
            f"moe_layers {ml!r}: two non-negative JSON integers [first, last] with last >= first",
            file=file,
            pointer=pointer_join(base, "moe_layers"),
        )
    ok_k = isinstance(kv, list) and kv and all(is_json_int(k) and k in (3, 4, 5) for k in kv)
    if not ok_k and "k_values" not in reported:
        findings.add(
            r7.R7_K_VALUES,
            f"k_values {kv!r}: non-empty JSON integers in {{3, 4, 5}}",
            file=file,
            pointer=pointer_join(base, "k_values"),
        )
    if not ok_layers:
        return None
    return Block(ml[0], ml[1], set(kv) if ok_k else {3, 4, 5}, file, base)


def _diffs(a: Any, b: Any, ptr: str, out: list[str], limit: int = 5) -> None:
    if len(out) >= limit:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(pointer_join(ptr, k))
            elif a[k] != b[k] or type(a[k]) is not type(b[k]):
                _diffs(a[k], b[k], pointer_join(ptr, k), out, limit)
            if len(out) >= limit:
                return
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y or type(x) is not type(y):
                _diffs(x, y, pointer_join(ptr, i), out, limit)
    else:
        out.append(ptr)


def check_quant_configs(ckpt: Checkpoint, findings: Findings) -> tuple[dict | None, str, str]:
    """Embedded vs external copy (§1) and the quant_method stamp. Returns (config, file, ptr)."""
    ext, emb = ckpt.quant_config, ckpt.embedded_quant
    if ext is None:
        findings.add(ck.CK_QUANT_CONFIG, "quantization_config.json is missing", file=QC)
    if ckpt.config is not None and emb is None:
        findings.add(
            r7.R7_EMBEDDED_MISSING,
            "config.json has no quantization_config",
            file="config.json",
            pointer="/quantization_config",
        )
    if isinstance(ext, dict) and isinstance(emb, dict):
        diffs: list[str] = []
        _diffs(emb, ext, "", diffs)
        for ptr in diffs:
            findings.add(
                r7.R7_DRIFT,
                f"config.json /quantization_config{ptr} differs from {QC}{ptr or ' (root)'}",
                file="config.json",
                pointer="/quantization_config" + ptr,
            )
    if isinstance(ext, dict):
        qc, file, base = ext, QC, ""
    elif isinstance(emb, dict):
        qc, file, base = emb, "config.json", "/quantization_config"
    else:
        return None, QC, ""
    qm = qc.get("quant_method")
    if qm != "exl3":
        findings.add(
            r7.R7_QUANT_METHOD,
            f"quant_method {qm!r} is the carrier's producer stamp; vLLM serves the routed "
            "experts as exl3 because r7_routed_experts (v2 schema) is present, unless "
            "--quantization forces another method",
            file=file,
            pointer=base + "/quant_method",
        )
    return qc, file, base


# --- routed experts (§3) ------------------------------------------------------------------


def _vector_ok(ref: TensorRef, size: int) -> bool:
    return ref.info.dtype == "F16" and ref.info.shape == (size,)


def check_experts(
    table: ExpertTable,
    block: Block,
    n_experts: int,
    hidden: int | None,
    inter: int | None,
    findings: Findings,
    reader: TensorReader,
    finite: FiniteCheck,
    shards: dict[str, Any],
) -> R7Payload:
    """Every (layer, expert, projection) of moe_layers: presence, K, geometry, markers, vectors."""
    payload = R7Payload()
    geometry = hidden is not None and inter is not None
    for layer in range(block.first, block.last + 1):
        label = layer_shard(layer)
        has_layer = any((layer, 0, p) in table.plain for p in PROJECTIONS) or any(
            (layer, v) in table.layer_vectors
            for v in ("r7_shared.gate_up_suh", "r7_shared.down_svh")
        )
        if not has_layer and not any(k[0] == layer for k in table.plain):
            findings.add(
                r7.R7_LAYER_MISSING,
                f"layer {layer} is in moe_layers but no shard holds its experts ({label})",
                file=block.file,
                pointer=pointer_join(block.base, "moe_layers"),
            )
            continue
        _check_shard_meta(shards.get(label), layer, findings)
        missing: list[str] = []
        for e in range(n_experts):
            for proj in PROJECTIONS:
                prefix = f"model.layers.{layer}.mlp.experts.{e}.{proj}"
                parts = table.plain.get((layer, e, proj))
                if parts is None:
                    missing.append(f"{prefix}.trellis")
                    continue
                _check_projection(
                    prefix, e, proj, parts, layer, label, block, hidden, inter, geometry,
                    missing, payload, findings, reader, finite,
                )  # fmt: skip
        for name in missing[:MAX_MISSING]:
            findings.add(r7.R7_TENSOR_MISSING, "missing", file=label, tensor=name)
        if len(missing) > MAX_MISSING:
            findings.add(
                r7.R7_TENSOR_MISSING,
                f"{len(missing) - MAX_MISSING} more expert tensors of layer {layer} missing",
                file=label,
                tensor=missing[MAX_MISSING],
            )
        for vec in ("gate_up_suh", "down_svh"):
            name = f"model.layers.{layer}.mlp.experts.r7_shared.{vec}"
            ref = table.layer_vectors.get((layer, f"r7_shared.{vec}"))
            if ref is None:
                findings.add(r7.R7_SHARED, "shared vector missing", file=label, tensor=name)
            elif hidden is not None and not _vector_ok(ref, hidden):
                findings.add(
                    r7.R7_SHARED,
                    f"{ref.info.dtype}{list(ref.info.shape)}, expected F16 [{hidden}]",
                    file=ref.file,
                    tensor=name,
                )
            if ref is not None:
                finite.add(ref)
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
    return payload


def _check_projection(
    prefix: str,
    expert: int,
    proj: str,
    parts: dict[str, TensorRef],
    layer: int,
    label: str,
    block: Block,
    hidden: int | None,
    inter: int | None,
    geometry: bool,
    missing: list[str],
    payload: R7Payload,
    findings: Findings,
    reader: TensorReader,
    finite: FiniteCheck,
) -> None:
    down = proj == "down_proj"
    t = parts.get("trellis")
    if t is None:
        missing.append(f"{prefix}.trellis")
    else:
        if t.file != label:
            findings.add(
                r7.R7_WRONG_SHARD, f"stored in {t.file}, not {label}", file=t.file, tensor=t.name
            )
        if check_trellis_dtype(t, findings):
            s0, s1, s2 = t.info.shape
            if s2 % 16:
                findings.add(
                    r7.R7_GEOMETRY,
                    f"last dimension {s2} is not a multiple of 16",
                    file=t.file,
                    tensor=t.name,
                )
            else:
                k = s2 // 16
                payload.k[(layer, expert, proj)] = k
                payload.by_layer.setdefault(layer, {})[prefix] = k
                payload.trellis[prefix] = t
                if k not in block.k_values:
                    findings.add(
                        r7.R7_K_UNDECLARED,
                        f"K = {k} not declared by k_values {sorted(block.k_values)}",
                        file=t.file,
                        tensor=t.name,
                    )
            if geometry:
                want = (inter, hidden) if down else (hidden, inter)
                if (s0 * 16, s1 * 16) != want:
                    findings.add(
                        r7.R7_GEOMETRY,
                        f"trellis {[s0, s1, s2]} is {s0 * 16}x{s1 * 16}, expected "
                        f"{want[0]}x{want[1]} ({'intermediate x hidden' if down else 'hidden x intermediate'})",
                        file=t.file,
                        tensor=t.name,
                    )
    mcg = parts.get("mcg")
    if mcg is None or "mul1" in parts:
        findings.add(
            r7.R7_MARKER,
            "mul1 marker on an R7 expert (codebook must be mcg)"
            if "mul1" in parts
            else "no mcg marker",
            file=label,
            tensor=f"{prefix}.{'mul1' if 'mul1' in parts else 'mcg'}",
        )
    if mcg is not None:
        check_marker(reader, mcg, "mcg", findings)
    own, shared = ("suh", "svh") if down else ("svh", "suh")
    ref = parts.get(own)
    if ref is None:
        missing.append(f"{prefix}.{own}")
    else:
        finite.add(ref)
        if inter is not None and not _vector_ok(ref, inter):
            findings.add(
                r7.R7_VECTOR,
                f"{own} is {ref.info.dtype}{list(ref.info.shape)}, expected F16 [{inter}]",
                file=ref.file,
                tensor=ref.name,
            )
    extra = parts.get(shared)
    if extra is not None:
        findings.add(
            r7.R7_UNEXPECTED_VECTOR,
            f"per-expert {shared}; R7 uses r7_shared.{'down_svh' if down else 'gate_up_suh'}",
            file=extra.file,
            tensor=extra.name,
        )


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


# --- manifests (§4, §5) ---------------------------------------------------------------------


def check_layer_manifests(
    ckpt: Checkpoint,
    block: Block,
    qc: dict,
    payload: R7Payload,
    findings: Findings,
    digests: Digests | None,
) -> None:
    listed = qc["r7_routed_experts"].get("bit_map_manifests")
    expected = [layer_manifest(i) for i in range(block.first, block.last + 1)]
    if listed is not None and listed != expected:
        extra = sorted(set(map(str, listed if isinstance(listed, list) else [])) - set(expected))
        lack = sorted(set(expected) - set(listed if isinstance(listed, list) else []))
        findings.add(
            r7.R7_MANIFEST_LIST,
            f"expected one manifest per layer {block.first}..{block.last}"
            + (f"; missing {lack[:3]}" if lack else "")
            + (f"; unexpected {extra[:3]}" if extra else ""),
            file=block.file,
            pointer=pointer_join(block.base, "bit_map_manifests"),
        )
    to_hash: list[tuple[str, TensorRef, str, str]] = []  # (manifest, ref, declared, pointer)
    shard_sha: dict[str, tuple[str, str]] = {}  # shard label -> (manifest, declared)
    for layer in range(block.first, block.last + 1):
        name = layer_manifest(layer)
        label = layer_shard(layer)
        man = ckpt.json_file(name, findings)
        if man is None:
            if not (ckpt.root / name).is_file():
                findings.add(r7.R7_MANIFEST_MISSING, f"no manifest for layer {layer}", file=name)
            continue
        errors = manifest_schema_errors(man)
        for ptr, msg, _ in errors[:MAX_MISSING]:
            findings.add(r7.R7_MANIFEST_SCHEMA, msg, file=name, pointer=ptr)
        bad_tops = {str(p[0]) for _, _, p in errors if p}
        _manifest_semantics(man, name, layer, label, payload, bad_tops, ckpt, findings)
        absent = [k for k in MANIFEST_OPTIONAL if k not in man]
        if absent:
            findings.add(
                r7.R7_PROVENANCE,
                f"absent: {', '.join(absent)}",
                file=name,
                pointer=pointer_join("", absent[0]),
            )
        st = ckpt.shards.get(label)
        ps = man.get("payload_sha256")
        if (
            digests is not None
            and st is not None
            and isinstance(ps, dict)
            and "payload_sha256" not in bad_tops
        ):
            for tname, declared in ps.items():
                info = st.tensors.get(tname)
                if info is not None:
                    ref = TensorRef(st, info)
                    to_hash.append((name, ref, declared, pointer_join("/payload_sha256", tname)))
        if digests is not None and sha_ok(man.get("shard_sha256")):
            shard_sha[label] = (name, man["shard_sha256"])
    if digests is None:
        return
    got = digests.tensors([ref for _, ref, _, _ in to_hash])
    for name, ref, declared, ptr in to_hash:
        if got.get(ref.name) != declared:
            findings.add(
                r7.R7_PAYLOAD_SHA,
                f"payload sha256 {got.get(ref.name)}, manifest says {declared}",
                file=name,
                tensor=ref.name,
                pointer=ptr,
            )
    files = digests.files(shard_sha)
    for label, (name, declared) in shard_sha.items():
        if files.get(label) is not None and files[label] != declared:
            findings.add(
                r7.R7_SHARD_SHA,
                f"{label} sha256 {files[label]}, manifest says {declared}",
                file=name,
                pointer="/shard_sha256",
            )


# The big per-tensor maps of a manifest (768-2304 entries on GLM-5.2): jsonschema spends ~50 µs
# per entry on them, so their values are checked here with the same rules as the schema
# (`additionalProperties` of /payload_sha256 and /bit_map) and the schema sees them empty.
_BIG_MAPS = {
    "payload_sha256": (lambda v: sha_ok(v), "is not a 64-hex sha256"),
    "bit_map": (lambda v: is_json_int(v) and 1 <= v <= 8, "is not a JSON integer in 1..8"),
}


def manifest_schema_errors(man: dict) -> list[tuple[str, str, tuple[Any, ...]]]:
    """schemas/r7-layer-manifest.schema.json errors of `man`, fast on its big maps."""
    skeleton = dict(man)
    errors: list[tuple[str, str, tuple[Any, ...]]] = []
    for key, (ok, what) in _BIG_MAPS.items():
        value = man.get(key)
        if not isinstance(value, dict):
            continue
        skeleton[key] = {}
        for k, v in value.items():
            if not ok(v):
                errors.append((pointer_join(pointer_join("", key), k), f"{v!r} {what}", (key, k)))
    return sorted(errors + schema_errors(MANIFEST_SCHEMA, skeleton), key=lambda e: e[0])


def _manifest_semantics(
    man: dict,
    name: str,
    layer: int,
    label: str,
    payload: R7Payload,
    bad: set[str],
    ckpt: Checkpoint,
    findings: Findings,
) -> None:
    if is_json_int(man.get("layer")) and man["layer"] != layer:
        findings.add(
            r7.R7_MANIFEST_LAYER,
            f"layer {man['layer']}, file is for layer {layer}",
            file=name,
            pointer="/layer",
        )
    if isinstance(man.get("shard"), str) and man["shard"] != label:
        findings.add(
            r7.R7_MANIFEST_LAYER,
            f"shard {man['shard']!r}, expected {label!r}",
            file=name,
            pointer="/shard",
        )
    sv = man.get("shared_vectors")
    if isinstance(sv, dict):
        for key in ("gate_up_suh", "down_svh"):
            want = f"model.layers.{layer}.mlp.experts.r7_shared.{key}"
            if key in sv and sv[key] != want:
                findings.add(
                    r7.R7_MANIFEST_LAYER,
                    f"shared_vectors.{key} {sv[key]!r}, expected {want!r}",
                    file=name,
                    pointer=f"/shared_vectors/{key}",
                )
    ps = man.get("payload_sha256")
    st = ckpt.shards.get(label)
    if isinstance(ps, dict) and st is not None and "payload_sha256" not in bad:
        stray = [t for t in ps if t not in st.tensors]
        for t in stray[:MAX_MISSING]:
            findings.add(
                r7.R7_MANIFEST_LAYER,
                f"payload_sha256 names a tensor that {label} does not hold",
                file=name,
                tensor=t,
                pointer=pointer_join("/payload_sha256", t),
            )
    bm = man.get("bit_map")
    if not isinstance(bm, dict) or "bit_map" in bad:
        return
    mine = payload.by_layer.get(layer, {})
    mismatched = 0
    for prefix, k in mine.items():
        declared = bm.get(prefix)
        if declared != k:
            mismatched += 1
            if mismatched <= MAX_MISSING:
                findings.add(
                    r7.R7_BIT_MAP,
                    f"bit_map says {declared!r}, payload K = {k}",
                    file=name,
                    tensor=f"{prefix}.trellis",
                    pointer=pointer_join("/bit_map", prefix),
                )
    for prefix in bm:
        if prefix not in mine and prefix not in payload.trellis:
            findings.add(
                r7.R7_BIT_MAP,
                "bit_map entry without a trellis in the shard",
                file=name,
                tensor=f"{prefix}.trellis",
                pointer=pointer_join("/bit_map", prefix),
            )
    units = man.get("allocation_bit_units")
    if "allocation_bit_units" not in bad and is_json_int(units):
        total = sum(v for v in bm.values() if is_json_int(v))
        if total != units:
            findings.add(
                r7.R7_ALLOCATION,
                f"allocation_bit_units {units}, bit_map sums to {total}",
                file=name,
                pointer="/allocation_bit_units",
            )


def check_checkpoint_manifest(
    ckpt: Checkpoint, findings: Findings, digests: Digests | None
) -> None:
    """MANIFEST.json files_sha256 / r7_layer_manifest_sha256 and the MANIFEST.sha256 seal (§5)."""
    mf = ckpt.json_file("MANIFEST.json", findings)
    if mf is None:
        if not (ckpt.root / "MANIFEST.json").is_file():
            findings.add(r7.R7_CKPT_MANIFEST, "MANIFEST.json is missing", file="MANIFEST.json")
        return
    files = mf.get("files_sha256")
    if not isinstance(files, dict):
        findings.add(
            r7.R7_CKPT_MANIFEST,
            "files_sha256 missing or not an object",
            file="MANIFEST.json",
            pointer="/files_sha256",
        )
        files = {}
    absent = [k for k in CKPT_MANIFEST_OPTIONAL if k not in mf]
    if absent:
        findings.add(
            r7.R7_PROVENANCE,
            f"absent: {', '.join(absent)}",
            file="MANIFEST.json",
            pointer="/" + absent[0],
        )
    good: dict[str, str] = {}
    for rel, declared in files.items():
        ptr = pointer_join("/files_sha256", rel)
        problem = relative_path_problem(rel) if isinstance(rel, str) else "not a string"
        if problem or not (ckpt.root / rel).is_file():
            findings.add(
                r7.R7_FILES_LIST,
                f"{rel!r}: {problem or 'no such file'}",
                file="MANIFEST.json",
                pointer=ptr,
            )
        elif not sha_ok(declared):
            findings.add(
                r7.R7_FILES_LIST, f"{declared!r} is not a sha256", file="MANIFEST.json", pointer=ptr
            )
        else:
            good[rel] = declared
    seal_path = ckpt.root / "MANIFEST.sha256"
    seal = None
    if not seal_path.is_file():
        findings.add(r7.R7_CKPT_MANIFEST, "MANIFEST.sha256 is missing", file="MANIFEST.sha256")
    else:
        try:
            text = seal_path.read_bytes()[:4096].decode("utf-8")
        except (OSError, UnicodeDecodeError):
            text = ""
        m = SEAL_RE.match(text)
        if m is None:
            findings.add(
                r7.R7_SEAL, 'expected one line "<sha256>  MANIFEST.json"', file="MANIFEST.sha256"
            )
        else:
            seal = m.group(1)
    lm = mf.get("r7_layer_manifest_sha256")
    if digests is None:
        return
    names = set(good) | ({"MANIFEST.json"} if seal else set())
    if isinstance(lm, dict):
        names |= {layer_manifest(int(k)) for k in lm if str(k).isdigit()}
    got = digests.files(sorted(names))
    for rel, declared in good.items():
        if got.get(rel) is not None and got[rel] != declared:
            findings.add(
                r7.R7_FILES_SHA,
                f"{rel} sha256 {got[rel]}, MANIFEST.json says {declared}",
                file="MANIFEST.json",
                pointer=pointer_join("/files_sha256", rel),
            )
    if seal is not None and got.get("MANIFEST.json") != seal:
        findings.add(
            r7.R7_SEAL,
            f"MANIFEST.json sha256 {got.get('MANIFEST.json')}, seal says {seal}",
            file="MANIFEST.sha256",
        )
    if isinstance(lm, dict):
        for key, declared in lm.items():
            if not str(key).isdigit():
                continue
            rel = layer_manifest(int(key))
            if got.get(rel) is not None and got[rel] != declared:
                findings.add(
                    r7.R7_LAYER_MANIFEST_SHA,
                    f"{rel} sha256 {got[rel]}, MANIFEST.json says {declared}",
                    file="MANIFEST.json",
                    pointer=pointer_join("/r7_layer_manifest_sha256", key),
                )


# --- entry point -------------------------------------------------------------------------------


def _sizes(config: dict, findings: Findings) -> tuple[int | None, int | None]:
    out = []
    for key in ("hidden_size", "moe_intermediate_size"):
        v = config.get(key)
        if not is_json_int(v) or v <= 0 or v % 128:
            findings.add(
                r7.R7_SIZES,
                f"{key} {v!r}: a positive multiple of 128",
                file="config.json",
                pointer="/" + key,
            )
            out.append(None)
        else:
            out.append(v)
    return out[0], out[1]


def check_r7(ckpt: Checkpoint, findings: Findings, options: ValidateOptions) -> R7Payload:
    """Every R7 rule; returns the payload K table (used by `inspect`)."""
    qc, file, base = check_quant_configs(ckpt, findings)
    config = ckpt.config or {}
    payload = R7Payload()
    if qc is None or "r7_routed_experts" not in qc:
        return payload
    block = check_block(qc["r7_routed_experts"], file, base + "/r7_routed_experts", findings)
    count = expert_count(config)
    if count is None:
        report_missing_expert_count(findings)
    hidden, inter = _sizes(config, findings)
    table = expert_table(ckpt.tensors)
    tail = config.get("hybrid_tr3_tail")
    tail_range = tail_layers(tail)
    if block is not None:
        n_layers = config.get("num_hidden_layers")
        mtp = config.get("num_nextn_predict_layers", 0)
        limit = n_layers + (mtp if is_json_int(mtp) else 0) if is_json_int(n_layers) else None
        if limit is not None and block.last >= limit:
            findings.add(
                r7.R7_RANGE_MODEL,
                f"moe_layers ends at {block.last}, the model has {limit} layers",
                file=block.file,
                pointer=pointer_join(block.base, "moe_layers"),
            )
    finite = FiniteCheck()
    digests = Digests(ckpt.root, options) if options.hash else None
    with RandomAccessReader() as reader:
        if block is not None and count is not None:
            payload = check_experts(
                table, block, count[1], hidden, inter, findings, reader, finite, ckpt.shards
            )
            check_out_of_range(table, block, count[1], tail_range, findings)
            if isinstance(qc["r7_routed_experts"], dict):
                check_layer_manifests(ckpt, block, qc, payload, findings, digests)
        if tail is not None:
            _check_carried_tail(
                ckpt, tail, block, table, hidden, inter, count, findings, options, reader, finite
            )
        if block is not None:
            n_exp = count[1] if count is not None else None
            layers = range(block.first, block.last + 1)
            check_routers(ckpt, layers, n_exp, hidden, r7.R7_ROUTER, findings)
        others = {n: r for n, r in ckpt.tensors.items() if ".mlp.experts." not in n}
        check_linears(group_linears(others), ckpt.tensors, findings, reader, finite)
        flush_payload_checks(reader, finite, findings)
    check_checkpoint_manifest(ckpt, findings, digests)
    if digests is None:
        findings.add(
            r7.R7_HASH_SKIPPED,
            "payload_sha256, shard_sha256, files_sha256 and the MANIFEST.sha256 seal were not recomputed",
            file="MANIFEST.json",
        )
    if options.tp is not None and inter is not None:
        part, rem = divmod(inter, options.tp)
        if rem or part % 128:
            findings.add(
                r7.R7_TP_ALIGN,
                f"moe_intermediate_size {inter} / tp {options.tp} = {inter / options.tp:g} per rank, "
                "not a multiple of 128",
                file="config.json",
                pointer="/moe_intermediate_size",
            )
    return payload


def _check_carried_tail(
    ckpt: Checkpoint,
    tail: Any,
    block: Block | None,
    table: ExpertTable,
    hidden: int | None,
    inter: int | None,
    count: tuple[str, int] | None,
    findings: Findings,
    options: ValidateOptions,
    reader: TensorReader,
    finite: FiniteCheck,
) -> None:
    """§6: the legacy tail survives only for the carried MTP layer."""
    if isinstance(tail, dict):
        role = tail.get("r7_compat_role")
        if role != "carried_mtp78_only":
            findings.add(
                r7.R7_TAIL_ROLE,
                f"r7_compat_role {role!r}, expected 'carried_mtp78_only'",
                file="config.json",
                pointer="/hybrid_tr3_tail/r7_compat_role",
            )
        rng = tail_layers(tail)
        if rng is not None and block is not None and rng[0] <= block.last and block.first <= rng[1]:
            findings.add(
                r7.R7_TAIL_ROLE,
                f"tail moe_layers {list(rng)} overlaps r7_routed_experts.moe_layers "
                f"[{block.first}, {block.last}]",
                file="config.json",
                pointer="/hybrid_tr3_tail/moe_layers",
            )
    ctx = TailContext("config.json", "/hybrid_tr3_tail", hidden, inter, count[1] if count else None)
    check_tail(ckpt, tail, table, ctx, findings, options, reader, finite)


def k_histogram(payload: R7Payload) -> dict[str, dict[int, int]]:
    """K histogram per projection (for `inspect`)."""
    out: dict[str, Counter] = {p: Counter() for p in PROJECTIONS}
    for (_l, _e, p), k in payload.k.items():
        out[p][k] += 1
    return {p: dict(sorted(c.items())) for p, c in out.items()}
