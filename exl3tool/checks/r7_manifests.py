"""R7 per-layer manifests (docs/formats/r7.md §4): presence, schema, agreement with the
payload (layer, shard, shared vectors, bit_map, allocation) and, under `--hash`, their digests."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from exl3tool.checks.budget import check_declared
from exl3tool.checks.digests import Digests, sha_ok
from exl3tool.checks.rows import Row, from_rows, rows
from exl3tool.formats.checkpoint import Checkpoint, TensorRef, present
from exl3tool.formats.r7 import Block, R7Payload, layer_manifest, layer_shard
from exl3tool.io.jsonfile import read_json
from exl3tool.io.schemas import schema_errors
from exl3tool.io.strict_json import is_json_int, pointer_join
from exl3tool.rules import r7 as r7
from exl3tool.rules.registry import Findings

MANIFEST_SCHEMA = "r7-layer-manifest.schema.json"
MAX_MISSING = 20
MANIFEST_OPTIONAL = (
    "marker", "recipe_version", "schema_version", "layer", "shard", "allocation_target_bpw",
    "vector_refs", "roundtrip_hashes", "shared_vectors", "tensor_provenance", "provenance",
    "permutations", "final_expert_artifact_sha256",
)  # fmt: skip

# The big per-tensor maps of a manifest (768-2304 entries on GLM-5.2): jsonschema spends ~50 µs
# per entry on them, so their values are checked here with the same rules as the schema
# (`additionalProperties` of /payload_sha256 and /bit_map) and the schema sees them empty.
_BIG_MAPS = {
    "payload_sha256": (lambda v: sha_ok(v), "is not a 64-hex sha256"),
    "bit_map": (lambda v: is_json_int(v) and 1 <= v <= 8, "is not a JSON integer in 1..8"),
}
_SHA_LINES = re.compile(r"(?:[0-9a-f]{64}\n)*[0-9a-f]{64}")


def _all_ok(key: str, values: list[Any]) -> bool:
    """True when no value of the big map `key` breaks its rule, tested on all of them at once
    (one regex over the joined digests, min/max of the K values); else each is tested alone."""
    if not values:
        return True
    types = set(map(type, values))
    if key == "payload_sha256":
        joined = "\n".join(values) if types == {str} else ""
        # the length proves one line per value: no value holds a newline of its own
        return len(joined) == 65 * len(values) - 1 and _SHA_LINES.fullmatch(joined) is not None
    return types == {int} and min(values) >= 1 and max(values) <= 8


@dataclass(frozen=True)
class LayerManifest:
    """One parsed per-layer manifest and what it is checked against."""

    man: dict
    name: str  # r7-experts-layer-NNN.json
    layer: int
    label: str  # the layer's shard
    bad: frozenset[str]  # top-level fields with schema errors (their semantics are skipped)


@dataclass
class _DigestWork:
    """Digests the manifests declare, recomputed together at the end (`--hash`)."""

    tensors: list[tuple[str, TensorRef, str, str]] = field(default_factory=list)
    shards: dict[str, tuple[str, str]] = field(default_factory=dict)  # label -> (manifest, sha)


def manifest_schema_errors(man: dict) -> list[tuple[str, str, tuple[Any, ...]]]:
    """schemas/r7-layer-manifest.schema.json errors of `man`, fast on its big maps."""
    skeleton = dict(man)
    errors: list[tuple[str, str, tuple[Any, ...]]] = []
    for key, (ok, what) in _BIG_MAPS.items():
        value = man.get(key)
        if not isinstance(value, dict):
            continue
        skeleton[key] = {}
        if _all_ok(key, list(value.values())):
            continue
        for k, v in value.items():
            if not ok(v):
                errors.append((pointer_join(pointer_join("", key), k), f"{v!r} {what}", (key, k)))
    return sorted(errors + schema_errors(MANIFEST_SCHEMA, skeleton), key=lambda e: e[0])


def _check_listing(block: Block, qc: dict, findings: Findings) -> None:
    listed = qc["r7_routed_experts"].get("bit_map_manifests")
    if listed is None:
        return
    # the expected names are built only as far as the list can match (moe_layers may be hostile)
    cap = len(listed) + 1 if isinstance(listed, list) else 1
    n_layers = min(max(block.last - block.first + 1, 0), cap)
    expected = [layer_manifest(i) for i in range(block.first, block.first + n_layers)]
    if listed != expected:
        extra = sorted(set(map(str, listed if isinstance(listed, list) else [])) - set(expected))
        names = {x for x in listed if isinstance(x, str)} if isinstance(listed, list) else set()
        lack = sorted(set(expected) - names)
        findings.add(
            r7.R7_MANIFEST_LIST,
            f"expected one manifest per layer {block.first}..{block.last}"
            + (f"; missing {lack[:3]}" if lack else "")
            + (f"; unexpected {extra[:3]}" if extra else ""),
            file=block.file,
            pointer=pointer_join(block.base, "bit_map_manifests"),
        )


@dataclass(frozen=True)
class LayerResult:
    """What one layer's manifest gives on its own: the findings of its load, schema and identity
    (`before`), the tensors its payload_sha256 names (`names`, held against its shard), its
    bit_map (held against the payload K), then its provenance findings (`after`). `lm` is the
    whole manifest, kept only for the digests of `--hash`."""

    layer: int
    before: tuple[Row, ...]
    names: str | list[str] | None  # `_names`
    bit_map: tuple[LayerManifest, dict] | None
    after: tuple[Row, ...]
    lm: LayerManifest | None


@dataclass(frozen=True)
class ManifestResults:
    """`layer_results` of every layer, as plain data (it may come from a forked worker)."""

    listed: tuple[Row, ...]  # what `_layers` reported
    layers: tuple[LayerResult, ...]
    rejected: frozenset[str]  # manifests that could not be used (Checkpoint.rejected_files)


def layer_results(ckpt: Checkpoint, block: Block, *, keep: bool) -> ManifestResults:
    """Load and check every per-layer manifest of moe_layers as far as that needs neither the
    shards nor the payload (the costly part: 52 MB of JSON on GLM-5.2); only `ckpt.root` is
    read. `keep` keeps each whole manifest (digests); else only what the rest reads of it."""
    before_rejected = set(ckpt.rejected_files)
    listed = Findings()
    out = []
    for layer in _layers(ckpt, block, listed):
        before, after = Findings(), Findings()
        lm = _load(ckpt, layer, before)
        if lm is None:
            out.append(LayerResult(layer, rows(before), None, None, (), None))
            continue
        _check_identity(lm, before)
        ps = lm.man.get("payload_sha256")
        names = _names(ps) if isinstance(ps, dict) and "payload_sha256" not in lm.bad else None
        bm = lm.man.get("bit_map")
        deferred = None
        if isinstance(bm, dict) and "bit_map" not in lm.bad:
            slim = lm if keep else replace(lm, man=_bit_map_fields(lm.man))
            deferred = (slim, bm)
        absent = [k for k in MANIFEST_OPTIONAL if k not in lm.man]
        if absent:
            after.add(
                r7.R7_PROVENANCE,
                f"absent: {', '.join(absent)}",
                file=lm.name,
                pointer=pointer_join("", absent[0]),
            )
        out.append(
            LayerResult(layer, rows(before), names, deferred, rows(after), lm if keep else None)
        )
    rejected = frozenset(ckpt.rejected_files - before_rejected)
    return ManifestResults(rows(listed), tuple(out), rejected)


def prefetch_block(root: Path) -> tuple[Checkpoint, Block] | None:
    """The block that `root`'s configs declare, read as the loader reads them, before the
    checkpoint is loaded (by a worker; its caller uses what it finds only for an equal block),
    with a checkpoint that holds only the root."""
    from exl3tool.checks.r7_block import check_block, check_quant_configs

    ckpt = Checkpoint(root=root)
    for name, attr in (("config.json", "config"), ("quantization_config.json", "quant_config")):
        if present(ckpt, name, Findings()):
            setattr(ckpt, attr, read_json(root / name, Findings(), name))
    qc, file, base = check_quant_configs(ckpt, Findings())
    if not isinstance(qc, dict) or not isinstance(qc.get("r7_routed_experts"), dict):
        return None
    block = check_block(qc["r7_routed_experts"], file, base + "/r7_routed_experts", Findings())
    if block is None:
        return None
    ckpt.rejected_files.clear()  # only the manifests' own rejections are results
    return ckpt, block


def _names(ps: dict) -> str | list[str]:
    """The keys of payload_sha256, as one string of lines where no key holds a line break (a
    worker's result: one string pickles at memcpy speed, 2,306 strings per layer do not)."""
    joined = "\n".join(ps)
    return joined if joined.count("\n") == len(ps) - 1 and ps else list(ps)


def _bit_map_fields(man: dict) -> dict:
    return {k: man[k] for k in ("allocation_bit_units",) if k in man}


def check_layer_manifests(
    ckpt: Checkpoint,
    block: Block,
    qc: dict,
    payload: R7Payload,
    findings: Findings,
    *,
    digests: Digests | None,
    results: ManifestResults | None = None,
) -> None:
    """Every per-layer manifest of moe_layers (§4); their digests under `--hash`. `results`:
    `layer_results` computed earlier (by a worker), else they are computed here."""
    _check_listing(block, qc, findings)
    if results is None:
        results = layer_results(ckpt, block, keep=digests is not None)
    ckpt.rejected_files.update(results.rejected)
    findings.extend(from_rows(results.listed))
    work = _DigestWork()
    for res in results.layers:
        findings.extend(from_rows(res.before))
        if res.names is not None:
            where = (layer_manifest(res.layer), layer_shard(res.layer))
            _check_payload_names(ckpt, res.names, where, findings)
        if res.bit_map is not None:
            _check_bit_map(*res.bit_map, payload, findings)
        findings.extend(from_rows(res.after))
        if digests is not None and res.lm is not None:
            _collect_digests(ckpt, res.lm, work)
    if digests is not None:
        _check_digests(work, findings, digests)


def _layers(ckpt: Checkpoint, block: Block, findings: Findings) -> Iterable[int]:
    """moe_layers, or where that range is beyond any artifact (issue 15) only the layers whose
    manifest files exist (and one CK098 finding)."""
    n_layers = max(block.last - block.first + 1, 0)
    names = os.listdir(ckpt.root)
    where = {"file": block.file, "pointer": pointer_join(block.base, "moe_layers")}
    if check_declared(n_layers, len(names), "moe_layers", findings, **where):
        return block.layers
    held = (re.fullmatch(r"r7-experts-layer-(\d{3,18})\.json", n) for n in names)
    layers = {int(m.group(1)) for m in held if m}
    return sorted(i for i in layers if i in block.layers and layer_manifest(i) in names)


def _load(ckpt: Checkpoint, layer: int, findings: Findings) -> LayerManifest | None:
    name = layer_manifest(layer)
    man = ckpt.json_file(name, findings)
    if man is None:
        if not (ckpt.root / name).is_file():
            findings.add(r7.R7_MANIFEST_MISSING, f"no manifest for layer {layer}", file=name)
        return None
    errors = manifest_schema_errors(man)
    for ptr, msg, _ in errors[:MAX_MISSING]:
        findings.add(r7.R7_MANIFEST_SCHEMA, msg, file=name, pointer=ptr)
    bad = frozenset(str(p[0]) for _, _, p in errors if p)
    return LayerManifest(man, name, layer, layer_shard(layer), bad)


def _collect_digests(ckpt: Checkpoint, lm: LayerManifest, work: _DigestWork) -> None:
    st = ckpt.shards.get(lm.label)
    ps = lm.man.get("payload_sha256")
    if st is not None and isinstance(ps, dict) and "payload_sha256" not in lm.bad:
        for tname, declared in ps.items():
            info = st.tensors.get(tname)
            if info is not None:
                ref = TensorRef(st, info)
                work.tensors.append(
                    (lm.name, ref, declared, pointer_join("/payload_sha256", tname))
                )
    if sha_ok(lm.man.get("shard_sha256")):
        work.shards[lm.label] = (lm.name, lm.man["shard_sha256"])


def _check_digests(work: _DigestWork, findings: Findings, digests: Digests) -> None:
    got = digests.tensors([ref for _, ref, _, _ in work.tensors])
    for name, ref, declared, ptr in work.tensors:
        if got.get(ref.name) != declared:
            findings.add(
                r7.R7_PAYLOAD_SHA,
                f"payload sha256 {got.get(ref.name)}, manifest says {declared}",
                file=name,
                tensor=ref.name,
                pointer=ptr,
            )
    files = digests.files(work.shards)
    for label, (name, declared) in work.shards.items():
        if files.get(label) is not None and files[label] != declared:
            findings.add(
                r7.R7_SHARD_SHA,
                f"{label} sha256 {files[label]}, manifest says {declared}",
                file=name,
                pointer="/shard_sha256",
            )


def _check_identity(lm: LayerManifest, findings: Findings) -> None:
    man, name, layer = lm.man, lm.name, lm.layer
    if is_json_int(man.get("layer")) and man["layer"] != layer:
        findings.add(
            r7.R7_MANIFEST_LAYER,
            f"layer {man['layer']}, file is for layer {layer}",
            file=name,
            pointer="/layer",
        )
    if isinstance(man.get("shard"), str) and man["shard"] != lm.label:
        findings.add(
            r7.R7_MANIFEST_LAYER,
            f"shard {man['shard']!r}, expected {lm.label!r}",
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


def _check_payload_names(
    ckpt: Checkpoint, names: str | list[str], where: tuple[str, str], findings: Findings
) -> None:
    """Each tensor that payload_sha256 names must be in the layer's shard."""
    name, label = where
    st = ckpt.shards.get(label)
    if st is None:
        return
    if isinstance(names, str):
        names = names.split("\n")
    held = st.tensors
    stray = [] if held.keys() >= set(names) else [t for t in names if t not in held]
    for t in stray[:MAX_MISSING]:
        findings.add(
            r7.R7_MANIFEST_LAYER,
            f"payload_sha256 names a tensor that {label} does not hold",
            file=name,
            tensor=t,
            pointer=pointer_join("/payload_sha256", t),
        )


def _check_bit_map(lm: LayerManifest, bm: dict, payload: R7Payload, findings: Findings) -> None:
    name = lm.name
    mine = payload.by_layer.get(lm.layer, {})
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
    units = lm.man.get("allocation_bit_units")
    if "allocation_bit_units" not in lm.bad and is_json_int(units):
        total = sum(v for v in bm.values() if is_json_int(v))
        if total != units:
            findings.add(
                r7.R7_ALLOCATION,
                f"allocation_bit_units {units}, bit_map sums to {total}",
                file=name,
                pointer="/allocation_bit_units",
            )
