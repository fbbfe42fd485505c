"""The runtime-compatible MSRT base identity (docs/formats/msrt.md §6), always sha256.

layer  = sha256(canonical_json({"schema": "fq-msrt-base-layer-compatibility/1", "k": K,
                                "layer": L, "tensors": [records sorted by name]}))
root   = sha256(canonical_json({"schema": "fq-msrt-base-compatibility/2", "k": K,
                                "layers": {"<L>": layer, ...}}))

Records are over LOGICAL routed-expert tensors (`.rank0` removed); a legacy rank-sliced artifact
is reassembled logically first (`identity.logical`), so the identity is layout-free (§6.2).
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import compress
from operator import itemgetter
from typing import Any

from exl3tool.formats.checkpoint import Checkpoint
from exl3tool.formats.exl3 import MCG_MARKER, k_of_last_dim
from exl3tool.formats.names import PROJECTIONS, ExpertPrefixes, has_expert_mark, parse_expert
from exl3tool.formats.tail import config_tail
from exl3tool.io.strict_json import canonical_json

LAYER_SCHEMA = "fq-msrt-base-layer-compatibility/1"
ROOT_SCHEMA = "fq-msrt-base-compatibility/2"
COMPONENTS = ("trellis", "suh", "svh", "mcg")
K_RANGE = range(2, 7)  # §6.2: k is an int 2..6
MCG_BYTES = MCG_MARKER.to_bytes(4, "little", signed=True)  # ed1faccb


@dataclass(frozen=True)
class Problem:
    """Why the identity is incomplete or not runtime-compatible (the caller picks a rule)."""

    message: str
    tensor: str | None = None
    layer: int | None = None


@dataclass
class CompatIdentity:
    k: int | None
    layers: dict[str, str] = field(default_factory=dict)
    root: str | None = None
    problems: list[Problem] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"schema": ROOT_SCHEMA, "k": self.k, "layers": self.layers, "root": self.root}


def tensor_record(name: str, dtype: str, shape: Iterable[int], sha256: str) -> dict[str, Any]:
    """§6.1 record of one logical tensor."""
    return {"name": name, "dtype": dtype, "shape": list(shape), "sha256": sha256}


def layer_digest(layer: int, k: int, records: Iterable[Mapping[str, Any]]) -> str:
    """§6.2 per-layer digest; records are sorted by name here."""
    body = {
        "schema": LAYER_SCHEMA,
        "k": k,
        "layer": int(layer),
        "tensors": sorted(
            (r if type(r) is dict else dict(r) for r in records), key=itemgetter("name")
        ),
    }
    return hashlib.sha256(canonical_json(body)).hexdigest()


def root_digest(k: int, layers: Mapping[str | int, str]) -> str:
    """§6.2 root; canonical JSON sorts the layer keys as strings ("10" < "3")."""
    body = {"schema": ROOT_SCHEMA, "k": k, "layers": {str(L): d for L, d in layers.items()}}
    return hashlib.sha256(canonical_json(body)).hexdigest()


def _uniform_k(ks: set[Any], k: int | None, problems: list[Problem]) -> int | None:
    if not ks:
        problems.append(Problem("no routed-expert trellis tensors"))
        return k
    if None in ks:
        problems.append(Problem("a trellis has no valid K (last dim is not 16*K)"))
        ks = ks - {None}
    if len(ks) > 1:
        problems.append(Problem(f"experts do not share one K: {sorted(ks, key=float)}"))
        return k
    (found,) = ks or {None}
    if k is not None and found is not None and found != k:
        problems.append(Problem(f"K {k} was asked for but the experts have K {found}"))
        return k
    if not isinstance(found, int) or found not in K_RANGE:
        problems.append(Problem(f"K {found} is outside the identity's int range 2..6"))
        return k
    return found


_COMPONENT_SPEC = {"trellis": ("I16", 3), "suh": ("F16", 1), "svh": ("F16", 1), "mcg": ("I32", 0)}


def _check_components(
    by_linear: dict[tuple[int, int], dict[str, dict[str, Any]]], problems: list[Problem]
) -> None:
    """§6.1: every expert has all three projections with all four components (`by_linear`:
    (layer, expert) -> proj -> component -> its logical tensor)."""
    for (layer, expert), projs in sorted(by_linear.items()):
        for proj in PROJECTIONS:
            parts = projs.get(proj, {})
            missing = [c for c in COMPONENTS if c not in parts]
            if missing:
                prefix = f"model.layers.{layer}.mlp.experts.{expert}.{proj}"
                problems.append(
                    Problem(f"{prefix} lacks {', '.join(missing)}", tensor=prefix, layer=layer)
                )
            for comp, lt in parts.items():
                dtype, ndim = _COMPONENT_SPEC[comp]
                if lt.dtype != dtype or len(lt.shape) != ndim:
                    problems.append(
                        Problem(
                            f"{comp} is {lt.dtype}{list(lt.shape)}, the identity expects "
                            f"{dtype} with {ndim} dimensions",
                            tensor=lt.name,
                            layer=layer,
                        )
                    )


# (layer, expert, proj, field) of a routed-expert name, as `parse_expert` reads it
Parts = tuple[int, int, str, str]


@dataclass
class CompatPlan:
    """What the §6 identity will hash: the chosen logical tensors (with their parsed names),
    K, and problems so far."""

    tensors: list[Any]  # logical.LogicalTensor, routed-expert components only
    k: int | None
    problems: list[Problem]
    parts: list[Parts] = field(default_factory=list)  # of each of `tensors`

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


def prepare(plan: Any, k: int | None = None) -> CompatPlan:
    """Select the routed-expert components of a `logical.LogicalPlan` and check §6.1 structure."""
    problems = [Problem(p.message, p.tensor, p.layer) for p in plan.problems]
    chosen: list[Any] = []
    parts: list[Parts] = []
    ks: set[Any] = set()
    by_linear: dict[tuple[int, int], dict[str, dict[str, Any]]] = {}
    names = ExpertPrefixes()
    tensors = plan.tensors  # logical name -> tensor; only a marked name can parse
    for lt in compress(tensors.values(), map(has_expert_mark, tensors)):
        got = names.parts(lt.name)
        if got is None:
            continue
        layer, expert, proj, fld = got
        if fld not in COMPONENTS:
            problems.append(
                Problem(
                    f"{fld} is not a component of an MSRT base expert",
                    tensor=lt.name,
                    layer=layer,
                )
            )
            continue
        chosen.append(lt)
        parts.append(got)
        by_linear.setdefault((layer, expert), {}).setdefault(proj, {})[fld] = lt
        if fld == "trellis":
            ks.add(k_of_last_dim(lt.shape[-1]) if len(lt.shape) == 3 else None)
    _check_components(by_linear, problems)
    return CompatPlan(chosen, _uniform_k(ks, k, problems), problems, parts)


def compat_identity(
    ckpt: Checkpoint | None,
    *,
    k: int | None = None,
    threads: int | None = None,
    progress: Any = None,
    plan: Any = None,
    sha256: Mapping[str, str] | None = None,
    prepared: CompatPlan | None = None,
) -> CompatIdentity:
    """Compute the §6 identity from the routed-expert tensors of a checkpoint.

    Works for an MSRT base (`.rank0.` names), a plain EXL3/R7 artifact whose experts have a
    uniform K, and a legacy rank-sliced artifact (slices are reassembled). Defects become
    `problems`; digests are still computed for what is present when K is known.
    `plan` reuses an `identity.logical.LogicalPlan` (then `ckpt` may be None); `sha256` reuses
    payload digests already computed by logical name; `prepared`: `prepare(plan, k)`, done.
    """
    from exl3tool.identity.engine import hash_segments, shard_stamps
    from exl3tool.identity.logical import build_plan

    if plan is None:
        assert ckpt is not None
        plan = build_plan(runtime_view(ckpt))
    cp = prepared if prepared is not None else prepare(plan, k)
    ident = CompatIdentity(cp.k, problems=cp.problems)
    if cp.k is None or not cp.tensors:
        return ident
    known = dict(sha256 or {})
    todo = [lt for lt in cp.tensors if lt.name not in known]
    if todo:
        known.update(
            hash_segments(
                ((lt.name, lt.segments) for lt in todo),
                "sha256",
                threads,
                progress,
                shard_stamps(ckpt.shards.values()) if ckpt is not None else None,
            )
        )
    records: dict[int, list[dict[str, Any]]] = {}
    for lt, (layer, _, _, fld) in zip(cp.tensors, cp.parts, strict=True):
        digest = known[lt.name]
        if fld == "mcg" and digest != _MCG_SHA and lt.nbytes == 4:
            cp.problems.append(Problem("mcg marker is not 0xCBAC1FED", tensor=lt.name, layer=layer))
        records.setdefault(layer, []).append(tensor_record(lt.name, lt.dtype, lt.shape, digest))
    ident.layers = {str(L): layer_digest(L, cp.k, recs) for L, recs in sorted(records.items())}
    ident.root = root_digest(cp.k, ident.layers)
    return ident


_MCG_SHA = hashlib.sha256(MCG_BYTES).hexdigest()


def stray_ranks(ckpt: Checkpoint) -> list[str]:
    """Expert tensors of an MSRT base stored under a rank other than 0 (MB005)."""
    tail = config_tail(ckpt.config)
    if tail is None or not tail.is_msrt_base:
        return []
    out = []
    for name in ckpt.tensors:
        en = parse_expert(name) if ".rank" in name else None
        if en is not None and en.rank not in (None, 0):
            out.append(name)
    return out


def runtime_view(ckpt: Checkpoint) -> Checkpoint:
    """The tensors the runtime loads from a base: it drops every rank >= 1 name and computes the
    identity over rank0 (docs/formats/msrt.md §5), so a stray `.rank1.` tensor is MB005, not
    a different identity. Other artifacts are returned unchanged."""
    stray = set(stray_ranks(ckpt))
    if not stray:
        return ckpt
    kept = {n: r for n, r in ckpt.tensors.items() if n not in stray}
    return dataclasses.replace(ckpt, tensors=kept)


_BASE_CACHE: dict[tuple[Any, ...], CompatIdentity] = {}
_BASE_CACHE_SIZE = 4
_BASE_LOCK = threading.Lock()
_BASE_LOCKS: dict[tuple[Any, ...], threading.Lock] = {}


def cached_compat_identity(
    ckpt: Checkpoint, *, k: int, threads: int | None = None
) -> CompatIdentity:
    """`compat_identity` of a base, computed once per process while none of its shards changes.

    `verify-swap` stages a cartridge up to three times against the same base (load, swap,
    rollback), and staging verifies the base's identity from its bytes: hundreds of GB each
    time on a real base. The key holds every shard's (dev, inode, size, mtime_ns, ctime_ns)
    from when its header was read, so any write to a shard (which moves its ctime) recomputes.
    """
    key = (
        str(ckpt.root.resolve()),
        k,
        tuple(sorted((label, st.stamp) for label, st in ckpt.shards.items())),
    )
    with _BASE_LOCK:  # stagings run on threads (verify-swap): one computes, the others wait
        lock = _BASE_LOCKS.setdefault(key, threading.Lock())
    with lock:
        hit = _BASE_CACHE.get(key)
        if hit is None:
            hit = compat_identity(ckpt, k=k, threads=threads)
            with _BASE_LOCK:
                while len(_BASE_CACHE) >= _BASE_CACHE_SIZE:
                    old = next(iter(_BASE_CACHE))
                    _BASE_CACHE.pop(old)
                    _BASE_LOCKS.pop(old, None)
                _BASE_CACHE[key] = hit
    return hit
