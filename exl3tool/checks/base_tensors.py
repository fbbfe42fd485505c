"""The routed-expert tensors of an `exl3-msrt-base/1` base (docs/formats/msrt.md §5-§6.1):
rank0 storage, four components per (expert, projection), trellis geometry, F16 vectors, the mcg
marker, one uniform K equal to `bits`, layer coverage, experts per layer and the routers."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from exl3tool.checks.routers import check_routers
from exl3tool.formats import msrt_spec as spec
from exl3tool.formats.checkpoint import Checkpoint, TensorRef
from exl3tool.formats.names import PROJECTIONS, parse_expert
from exl3tool.io.views import TensorReader
from exl3tool.rules import base as mb
from exl3tool.rules.registry import Findings

PTR = "/hybrid_tr3_tail"
Slot = tuple[int, int, str]  # (layer, expert, projection)


@dataclass
class _Seen:
    """What the tensors hold: experts per layer, and the first trellis of each K."""

    layers: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))
    ks: dict[int, str] = field(default_factory=dict)


def check_tensors(
    ckpt: Checkpoint, tail: dict[str, Any], k: int | None, findings: Findings
) -> None:
    comps = _components(ckpt, findings)
    seen = _Seen()
    hidden, inter, n_experts = spec.base_sizes(ckpt.config)
    with TensorReader() as rd:
        for (layer, expert, proj), parts in sorted(comps.items()):
            seen.layers[layer].add(expert)
            prefix = f"model.layers.{layer}.mlp.experts.{expert}.{proj}.rank0"
            missing = [c for c in spec.BASE_COMPONENTS if c not in parts]
            if missing:
                findings.add(mb.MB_INCOMPLETE, f"lacks {', '.join(missing)}", tensor=prefix)
            t = _check_trellis(parts.get("trellis"), proj, (hidden, inter), seen, findings)
            _check_vectors(parts, t, findings)
            if "mcg" in parts:
                _check_mcg(parts["mcg"], rd, findings)
    # A shard that could not be read (absent, cut, not safetensors) hides its tensors: its own
    # finding is the root cause, and what its absence makes "incomplete" or "uncovered" here
    # would only repeat it with the wrong advice (regenerate the configs).
    if not ckpt.incomplete:
        _check_complete(comps, seen, findings)
    _check_uniform_k(seen, k, findings)
    if not ckpt.incomplete:
        _check_layer_fields(tail, sorted(seen.layers), findings)
    raw = tail.get("experts_per_layer")
    # the schema's "integer" also takes an integral float (4.0, 1e300): held to the layers too
    epl = int(raw) if type(raw) is float and raw.is_integer() else raw
    experts = epl if type(epl) is int else n_experts
    check_routers(ckpt, sorted(seen.layers), experts, hidden, rule=mb.MB_ROUTER, findings=findings)
    if type(epl) is int:
        for layer, es in sorted(seen.layers.items()):
            # bounded by what the layer holds, never by the declared count (issue 15)
            if len(es) != epl or not all(0 <= e < epl for e in es):
                findings.add(
                    mb.MB_EXPERTS,
                    f"layer {layer} holds experts {sorted(es)}, experts_per_layer is {raw!r}",
                    file="config.json",
                    tensor=f"model.layers.{layer}.mlp.experts",
                    pointer=PTR + "/experts_per_layer",
                )


def _components(ckpt: Checkpoint, findings: Findings) -> dict[Slot, dict[str, TensorRef]]:
    """rank0 base components by (layer, expert, proj); every other expert tensor is a finding."""
    comps: dict[Slot, dict[str, TensorRef]] = defaultdict(dict)
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
    return comps


def _check_trellis(
    t: TensorRef | None,
    proj: str,
    sizes: tuple[int | None, int | None],
    seen: _Seen,
    findings: Findings,
) -> TensorRef | None:
    """The trellis when its dtype and rank are usable (I16 [.., .., 16·K]), else None."""
    if t is None:
        return None
    sh = t.info.shape
    if t.info.dtype != "I16" or len(sh) != 3 or sh[2] % 16:
        findings.add(
            mb.MB_COMPONENT, f"trellis is {t.info.dtype}{list(sh)}", file=t.file, tensor=t.name
        )
        return None
    seen.ks.setdefault(sh[2] // 16, t.name)
    hidden, inter = sizes
    if hidden and inter:
        want = spec.trellis_shape(proj, hidden, inter, sh[2] // 16)
        if sh != want:
            findings.add(
                mb.MB_GEOMETRY,
                f"shape {list(sh)}, config.json sizes (hidden {hidden}, intermediate {inter}) give {list(want)}",
                file=t.file,
                tensor=t.name,
            )
    return t


def _check_vectors(parts: dict[str, TensorRef], t: TensorRef | None, findings: Findings) -> None:
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


def _check_mcg(m: TensorRef, rd: TensorReader, findings: Findings) -> None:
    if m.info.dtype != "I32" or m.info.shape != ():
        findings.add(
            mb.MB_COMPONENT,
            f"mcg is {m.info.dtype}{list(m.info.shape)}, expected I32 []",
            file=m.file,
            tensor=m.name,
        )
    elif bytes(rd.payload(m.shard, m.info)) != spec.MCG_MARKER_BYTES:
        findings.add(mb.MB_MCG, "mcg marker is not 0xCBAC1FED", file=m.file, tensor=m.name)


def _check_complete(comps: dict[Slot, Any], seen: _Seen, findings: Findings) -> None:
    for layer in sorted({layer for layer, _e, _p in comps}):
        for expert in sorted(seen.layers[layer]):
            missing = [p for p in PROJECTIONS if (layer, expert, p) not in comps]
            if missing:
                findings.add(
                    mb.MB_INCOMPLETE,
                    f"expert lacks {', '.join(missing)}",
                    tensor=f"model.layers.{layer}.mlp.experts.{expert}",
                )


def _check_uniform_k(seen: _Seen, k: int | None, findings: Findings) -> None:
    ks = seen.ks
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
            pointer=PTR + "/bits",
        )


def _check_layer_fields(tail: dict[str, Any], seen_layers: list[int], findings: Findings) -> None:
    cov = tail.get("moe_layer_coverage")
    if isinstance(cov, list) and cov != seen_layers:
        findings.add(
            mb.MB_LAYERS,
            f"moe_layer_coverage {cov} but tensors hold layers {seen_layers}",
            file="config.json",
            pointer=PTR + "/moe_layer_coverage",
        )
    ml = tail.get("moe_layers")
    if seen_layers and isinstance(ml, list) and ml != [seen_layers[0], seen_layers[-1]]:
        findings.add(
            mb.MB_LAYERS,
            f"moe_layers {ml} must be [min, max] = {[seen_layers[0], seen_layers[-1]]}",
            file="config.json",
            pointer=PTR + "/moe_layers",
        )
