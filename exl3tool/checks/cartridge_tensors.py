"""Key index and per-layer tensor rules (docs/formats/msrt.md §3, §7, §9 C and D).

Reads headers and the 4-byte scale payloads only. Geometry against the base sizes is checked when
the caller passes them (`Geometry`); without a base, shapes are checked for 128-alignment and for
consistency across experts.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from exl3tool.checks.cartridge_manifest import coverage_sets, ints
from exl3tool.formats import msrt_spec as spec
from exl3tool.formats.cartridge import Cartridge, StageKey, parse_key
from exl3tool.formats.cartridge_tables import FP32_MAX
from exl3tool.formats.names import PROJECTIONS
from exl3tool.io.views import TensorReader
from exl3tool.rules import cartridge as ca
from exl3tool.rules.registry import Findings

_PROTOTYPE_RE = re.compile(r"\.(suh|svh|mcg|mul1)_[^.]*$")


@dataclass(frozen=True)
class Geometry:
    """Logical sizes from the base config.json (§3 geometry, rule 26)."""

    hidden: int
    intermediate: int
    num_experts: int | None = None


def _add(findings: Findings, cart: Cartridge, r, msg: str, key: str) -> None:
    ref = cart.keys.get(key)
    findings.add(r, msg, file=ref.shard.label if ref else None, tensor=key)


def _parse_all(cart: Cartridge, findings: Findings) -> list[StageKey]:
    """Rules 17, 19, 24: keep the well-formed, canonical trellis/scale keys of chain stages."""
    chain = set(cart.chain_labels)
    good = []
    seen: dict[tuple, str] = {}
    for name in cart.keys:
        key = parse_key(name)
        if key is None or key.component in spec.PROTOTYPE_COMPONENTS:
            if _PROTOTYPE_RE.search(name) or (key and key.component in spec.PROTOTYPE_COMPONENTS):
                _add(findings, cart, ca.CA_PROTOTYPE_KEY,
                     "Malformed MSRT cartridge key: per-stage suh/svh/mcg/mul1 companions are the "
                     "obsolete prototype layout", name)  # fmt: skip
            else:
                _add(findings, cart, ca.CA_MALFORMED_KEY, "Malformed MSRT cartridge key", name)
            continue
        if key.component not in spec.STAGE_COMPONENTS or not spec.LABEL_RE.fullmatch(key.label):
            _add(findings, cart, ca.CA_MALFORMED_KEY,
                 f"Malformed MSRT cartridge key (component {key.component!r}, label {key.label!r})",
                 name)  # fmt: skip
            continue
        if key.layer is None:
            _add(findings, cart, ca.CA_LAYER_NAME,
                 f"Invalid MSRT cartridge layer name {key.layer_part!r}: must be "
                 "model.layers.{L}.mlp.experts", name)  # fmt: skip
            continue
        if key.label not in chain:
            _add(findings, cart, ca.CA_UNKNOWN_STAGE,
                 f"tensor stages are absent from adapter_config.json chain: {key.label!r}", name)  # fmt: skip
            continue
        # the runtime reads the expert and rank numbers as integers and stores one tensor per
        # (expert, rank, ...): "experts.07" after "experts.7" silently replaces it
        same = (key.layer, key.expert, key.proj, key.rank, key.component, key.label)
        first = seen.setdefault(same, name)
        if first != name:
            _add(findings, cart, ca.CA_ALIASED_KEY,
                 f"names the same stage tensor as {first} once its numbers are read; the "
                 "runtime keeps only one of them", name)  # fmt: skip
            continue
        good.append(key)
    return good


def _check_pairs(cart: Cartridge, keys: list[StageKey], findings: Findings) -> None:
    """Rule 18: trellis and scale come in pairs."""
    names = {k.name for k in keys}
    for k in keys:
        other = "scale" if k.component == "trellis" else "trellis"
        partner = spec.stage_key(k.layer or 0, k.expert, k.proj, k.rank, other, k.label)
        if partner not in names:
            if k.component == "trellis":
                _add(findings, cart, ca.CA_NO_SCALE, "has no scalar scale companion", k.name)
            else:
                _add(findings, cart, ca.CA_ORPHAN_SCALE, "Orphaned MSRT cartridge scale", k.name)


def _check_ranks(cart: Cartridge, keys: list[StageKey], findings: Findings) -> None:
    """Rules 21, 23: ranks equal the manifest; every rank has the same topology and scales."""
    tp = cart.field("tensor_parallel")
    declared = ints(tp.get("ranks")) if isinstance(tp, dict) else None
    layout = cart.layout
    observed = sorted({k.rank for k in keys})
    if layout == "full" and observed and observed != [0]:
        findings.add(
            ca.CA_RANKS,
            f"full layout must contain only rank0; tensors hold ranks {observed}",
            file=spec.ADAPTER_CONFIG,
            pointer="/tensor_parallel",
        )
    elif (
        layout == "rank-sharded"
        and declared is not None
        and observed
        and observed != sorted(declared)
    ):
        findings.add(
            ca.CA_RANKS,
            f"tensor ranks {observed} do not match adapter_config ranks {sorted(declared)}",
            file=spec.ADAPTER_CONFIG,
            pointer="/tensor_parallel/ranks",
        )
    if layout != "rank-sharded" or len(observed) < 2:
        return
    topo: dict[int, set[tuple]] = defaultdict(set)
    for k in keys:
        topo[k.rank].add((k.layer, k.label, k.expert, k.proj, k.component))
    ref_rank = observed[0]
    for r in observed[1:]:
        diff = topo[r] ^ topo[ref_rank]
        if diff:
            first = sorted(diff, key=str)[0]
            findings.add(
                ca.CA_TOPOLOGY,
                f"rank {r} and rank {ref_rank} differ in {len(diff)} tensors (e.g. {first}): "
                "inconsistent stage topology",
                file=spec.ADAPTER_CONFIG,
            )
    scales: dict[tuple, dict[int, bytes]] = defaultdict(dict)
    with TensorReader() as rd:
        for k in keys:
            if k.component == "scale":
                ref = cart.keys[k.name]
                scales[(k.layer, k.label, k.expert, k.proj)][k.rank] = bytes(
                    rd.payload(ref.shard, ref.info)
                )
    for (layer, label, expert, proj), by_rank in sorted(scales.items(), key=str):
        if len(set(by_rank.values())) > 1:
            name = spec.stage_key(layer, expert, proj, min(by_rank), "scale", label)
            _add(findings, cart, ca.CA_SCALES_DIFFER,
                 f"scales differ across TP ranks {sorted(by_rank)}", name)  # fmt: skip


def _check_sets(cart: Cartridge, keys: list[StageKey], findings: Findings) -> None:
    """Rule 20: coverage, selected_layers and selected_experts equal what the trellis keys hold."""
    observed: dict[str, dict[int, set[int]]] = defaultdict(lambda: defaultdict(set))
    for k in keys:
        if k.component == "trellis":
            observed[k.label][k.layer].add(k.expert)  # type: ignore[index]
    obs = {label: {L: set(es) for L, es in layers.items()} for label, layers in observed.items()}
    cov = coverage_sets(cart.manifest or {})
    if cov is not None:
        for label in sorted(set(cov) | set(obs)):
            want, have = cov.get(label, {}), obs.get(label, {})
            if want != have:
                diff = sorted(
                    f"layer {L}: manifest {sorted(want.get(L, ()))} tensors {sorted(have.get(L, ()))}"
                    for L in set(want) | set(have)
                    if want.get(L) != have.get(L)
                )
                findings.add(
                    ca.CA_COVERAGE,
                    f"stage {label}: tensors do not match adapter_config.json coverage ({'; '.join(diff[:3])})",
                    file=spec.ADAPTER_CONFIG,
                    pointer=f"/coverage/{label}",
                )
    layers = {L for st in obs.values() for L in st}
    experts = {e for st in obs.values() for es in st.values() for e in es}
    for field_name, seen in (("selected_layers", layers), ("selected_experts", experts)):
        declared = ints(cart.field(field_name))
        if declared is not None and set(declared) != seen:
            findings.add(
                ca.CA_SELECTED,
                f"tensors hold {sorted(seen)}; do not match adapter_config.json {field_name} {sorted(declared)}",
                file=spec.ADAPTER_CONFIG,
                pointer=f"/{field_name}",
            )


def _check_count(cart: Cartridge, findings: Findings) -> None:
    """Rule 22: every key of every listed shard counts."""
    declared = cart.field("num_tensors")
    shards = cart.field("shards")
    if type(declared) is not int or not isinstance(shards, list) or len(cart.shards) != len(shards):
        return  # a shard is missing: its own finding says so
    count = sum(len(h.tensors) for h in cart.shards.values())
    if count != declared:
        findings.add(
            ca.CA_NUM_TENSORS,
            f"shards hold {count} keys, num_tensors says {declared}",
            file=spec.ADAPTER_CONFIG,
            pointer="/num_tensors",
        )


def expected_trellis_shape(
    proj: str, geo: Geometry, k: int, layout: str | None, world: int | None
) -> tuple[int, int, int]:
    """§3: full logical shape, or the per-rank shape of a rank-sharded cartridge."""
    inter = geo.intermediate
    if layout == "rank-sharded" and world:
        inter = spec.ceil128(geo.intermediate) // world
    return spec.trellis_shape(proj, geo.hidden, inter, k)


def _check_tensors(
    cart: Cartridge, keys: list[StageKey], findings: Findings, geo: Geometry | None
) -> None:
    """Rules 25-30."""
    chain_k = cart.chain_k()
    ks: dict[tuple, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
    shapes: dict[tuple, set[tuple[int, int]]] = defaultdict(set)
    with TensorReader() as rd:
        for k in keys:
            info = cart.keys[k.name].info
            if geo is not None and geo.num_experts is not None and k.expert >= geo.num_experts:
                _add(findings, cart, ca.CA_EXPERT_RANGE,
                     f"expert {k.expert} is outside [0, {geo.num_experts}) of the base", k.name)  # fmt: skip
            if k.component == "scale":
                _check_scale(cart, rd, k, findings)
                continue
            if info.dtype != "I16" or len(info.shape) != 3 or info.shape[2] % 16:
                _add(findings, cart, ca.CA_TRELLIS_DTYPE,
                     f"Invalid MSRT cartridge trellis: {info.dtype}{list(info.shape)} (needs int16 "
                     "[tiles_in, tiles_out, 16*K])", k.name)  # fmt: skip
                continue
            kk = info.shape[2] // 16
            if kk not in spec.STAGE_K:
                _add(findings, cart, ca.CA_TRELLIS_DTYPE,
                     f"Invalid MSRT cartridge trellis: K={kk} outside 1..6", k.name)  # fmt: skip
                continue
            declared = chain_k.get(k.label)
            if declared is not None and declared != kk:
                _add(findings, cart, ca.CA_STAGE_K,
                     f"chain stage {k.label} declares K={declared} but tensor contains K={kk}", k.name)  # fmt: skip
            ks[(k.layer, k.label, k.proj, k.rank)][kk].append(k.name)
            a, b = info.shape[0], info.shape[1]
            if geo is not None:
                want = expected_trellis_shape(k.proj, geo, kk, cart.layout, cart.world_size)
                if tuple(info.shape) != want:
                    _add(findings, cart, ca.CA_TRELLIS_GEOMETRY,
                         f"shape {list(info.shape)} must equal {list(want)}: the 128-aligned logical "
                         f"shape of {k.proj} (hidden {geo.hidden}, intermediate {geo.intermediate}, "
                         f"layout {cart.layout})", k.name)  # fmt: skip
            elif a % 8 or b % 8:
                _add(findings, cart, ca.CA_TRELLIS_GEOMETRY,
                     f"shape {list(info.shape)} is not a 128-aligned logical shape", k.name)  # fmt: skip
            else:
                shapes[(k.layer, k.proj, k.rank)].add((a, b) if k.proj != "down_proj" else (b, a))
    for (layer, label, proj, rank), by_k in sorted(ks.items(), key=str):
        if len(by_k) > 1:
            first = sorted(by_k.items())[-1][1][0]
            _add(findings, cart, ca.CA_K_UNIFORM,
                 f"layer {layer} stage {label} {proj} rank {rank}: K values {sorted(by_k)}; packed "
                 "cartridge stage bitrate must be uniform across experts", first)  # fmt: skip
    if geo is None:
        by_layer: dict[tuple, set] = defaultdict(set)
        for (layer, _proj, rank), s in shapes.items():
            by_layer[(layer, rank)] |= s
        for (layer, rank), s in sorted(by_layer.items()):
            if len(s) > 1:
                findings.add(
                    ca.CA_TRELLIS_GEOMETRY,
                    f"layer {layer} rank {rank}: experts/projections disagree on the (hidden, "
                    f"intermediate) tile geometry {sorted(s)}",
                    file=spec.ADAPTER_CONFIG,
                )


def _check_scale(cart: Cartridge, rd: TensorReader, k: StageKey, findings: Findings) -> None:
    """Rule 28: float32 0-dim, finite, > 0, finite FP32 inverse."""
    ref = cart.keys[k.name]
    if ref.info.dtype != "F32" or ref.info.shape != ():
        _add(findings, cart, ca.CA_SCALE_DTYPE,
             f"scale is {ref.info.dtype}{list(ref.info.shape)}, must be float32 []", k.name)  # fmt: skip
        return
    value = float(np.frombuffer(rd.payload(ref.shard, ref.info), "<f4")[0])
    if not math.isfinite(value) or value <= 0:
        _add(findings, cart, ca.CA_SCALE_VALUE, f"scale {value!r} must be finite and > 0", k.name)
        return
    inv = 1.0 / value
    if not math.isfinite(inv) or inv > FP32_MAX:
        _add(findings, cart, ca.CA_INVERSE_SCALE,
             f"scale {value!r}: inverse scale is not finite in FP32", k.name)  # fmt: skip


def _check_complete(cart: Cartridge, keys: list[StageKey], findings: Findings) -> None:
    """Rule 29: each (layer, stage, expert, rank) has gate, up and down."""
    projs: dict[tuple, set[str]] = defaultdict(set)
    for k in keys:
        if k.component == "trellis":
            projs[(k.layer, k.label, k.expert, k.rank)].add(k.proj)
    for (layer, label, expert, rank), have in sorted(projs.items(), key=str):
        missing = [p for p in PROJECTIONS if p not in have]
        if missing:
            name = spec.stage_key(layer, expert, sorted(have)[0], rank, "trellis", label)
            _add(findings, cart, ca.CA_INCOMPLETE,
                 f"Incomplete MSRT cartridge expert stages: layer {layer} stage {label} expert "
                 f"{expert} rank {rank} lacks {', '.join(missing)}", name)  # fmt: skip


def check_tensors(
    cart: Cartridge, findings: Findings, geo: Geometry | None = None
) -> list[StageKey]:
    """Every §9 C and D rule; returns the well-formed keys."""
    keys = _parse_all(cart, findings)
    _check_pairs(cart, keys, findings)
    _check_ranks(cart, keys, findings)
    _check_sets(cart, keys, findings)
    _check_count(cart, findings)
    _check_tensors(cart, keys, findings, geo)
    _check_complete(cart, keys, findings)
    return keys
