"""exl3tool's own logical identity of any artifact (schemas/exl3tool-identity-1.schema.json).

tensor = H(logical payload bytes)                       H = blake3 (default) or sha256
layer  = H(b"exl3tool-identity/1:layer\\n" + canonical_json(
           {"algorithm": A, "layer": "<L>", "tensors": [[name, dtype, shape, tensor], ...]}))
root   = H(b"exl3tool-identity/1:root\\n" + canonical_json({"algorithm": A, "layers": {L: layer}}))

Tensors are listed by logical name (rank segments removed, slices reassembled; `logical`),
so file names, shard boundaries, header layout and TP slicing do not enter any digest. Tensors
outside `layers.<N>.` belong to the pseudo-layer "other".
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from exl3tool.formats.checkpoint import Checkpoint
from exl3tool.formats.names import layer_of
from exl3tool.identity.engine import (
    Known,
    Segment,
    check_algo,
    hash_segments,
    hash_segments_twice,
    new_hasher,
    shard_stamps,
    tensor_segment,
)
from exl3tool.identity.logical import LogicalPlan, PlanProblem, build_plan, differing_copies
from exl3tool.io.gcpause import paused_gc
from exl3tool.io.layer_spec import parse_layer_spec
from exl3tool.io.safetensors import FileStamp
from exl3tool.io.strict_json import canonical_json

SCHEMA = "exl3tool-identity/1"
LAYER_DOMAIN = b"exl3tool-identity/1:layer\n"
ROOT_DOMAIN = b"exl3tool-identity/1:root\n"
OTHER = "other"


class TensorDigest(NamedTuple):
    dtype: str
    shape: tuple[int, ...]
    digest: str


@dataclass
class Identity:
    algorithm: str
    tensors: dict[str, TensorDigest] = field(default_factory=dict)  # logical name -> digest
    layers: dict[str, str] = field(default_factory=dict)
    root: str = ""
    selection: str | None = None  # the --layers spec, when only some layers were hashed
    compatibility: Any = None  # compat.CompatIdentity when the experts qualify
    problems: list[PlanProblem] = field(default_factory=list)

    def layer_tensors(self, key: str) -> list[str]:
        return [n for n in self.tensors if layer_key(n) == key]

    def to_json(self, per_tensor: bool = True) -> dict[str, Any]:
        """The record (schemas/exl3tool-identity-1.schema.json); `per_tensor=False` leaves its
        "tensors" and "types" maps empty (report/identity streams them)."""
        items = self.tensors.items() if per_tensor else ()
        doc: dict[str, Any] = {
            "schema": SCHEMA,
            "algorithm": self.algorithm,
            "tensors": {n: t.digest for n, t in items},
            "types": {n: {"dtype": t.dtype, "shape": list(t.shape)} for n, t in items},
            "layers": dict(self.layers),
            "root": self.root,
        }
        if self.selection is not None:
            doc["selection"] = self.selection
        if self.compatibility is not None and self.compatibility.root is not None:
            doc["compatibility"] = self.compatibility.to_json()
        return doc


def layer_key(name: str) -> str:
    if name.startswith("model.layers."):  # the usual name, without a regex search (10^6 names)
        end = name.find(".", 13)
        digits = name[13:end]
        if end > 13 and digits.isascii() and digits.isdigit():
            return digits if digits[0] != "0" else str(int(digits))
    layer = layer_of(name)
    return OTHER if layer is None else str(layer)


def _key_order(key: str) -> tuple[int, int]:
    return (1, 0) if key == OTHER else (0, int(key))


def parse_layers(spec: str) -> frozenset[str]:
    """`3-5,7,other` -> {"3", "4", "5", "7", "other"} (the grammar of io/layer_spec)."""
    parsed = parse_layer_spec(spec, (OTHER,))
    return frozenset(map(str, parsed.layers)) | parsed.keywords


def _layer_digest(algo: str, key: str, names: list[str], tensors: Mapping[str, Any]) -> str:
    """H(LAYER_DOMAIN + canonical JSON of the layer's rows [name, dtype, shape, digest])."""
    h = new_hasher(algo)
    h.update(LAYER_DOMAIN + _layer_json(algo, key, names, tensors))
    return h.hexdigest()


def _escaped(text: str) -> bool:
    """Whether canonical JSON escapes a character of `text` (ensure_ascii: anything but
    printable ASCII, and the quote and the backslash); text without one is copied verbatim."""
    return not (text.isascii() and text.isprintable()) or '"' in text or "\\" in text


def _layer_json(algo: str, key: str, names: list[str], tensors: Mapping[str, Any]) -> bytes:
    """`canonical_json({"algorithm": algo, "layer": key, "tensors": rows})`, built by string
    formatting when no text in it needs an escape (every real checkpoint: a third of the JSON
    encoder's time per row); tests/identity/test_id_fast.py proves the bytes equal."""
    rows = [(n, *tensors[n]) for n in names]
    dtypes = {r[1] for r in rows}
    if not all(type(d) is str for d in dtypes) or _escaped("".join([algo, key, *names, *dtypes])):
        return canonical_json({"algorithm": algo, "layer": key, "tensors": rows})
    kinds: dict[tuple[str, tuple[int, ...]], str] = {}
    out: list[str] = []
    for name, dtype, shape, digest in rows:
        kind = kinds.get((dtype, shape))
        if kind is None:
            if not all(type(d) is int for d in shape) or type(digest) is not str:
                return canonical_json({"algorithm": algo, "layer": key, "tensors": rows})
            kind = kinds[(dtype, shape)] = f'"{dtype}",[{",".join(map(str, shape))}]'
        out.append(f'["{name}",{kind},"{digest}"]')
    return f'{{"algorithm":"{algo}","layer":"{key}","tensors":[{",".join(out)}]}}'.encode()


def root_digest(algo: str, layers: Mapping[str, str]) -> str:
    h = new_hasher(algo)
    h.update(ROOT_DOMAIN + canonical_json({"algorithm": algo, "layers": dict(layers)}))
    return h.hexdigest()


def fold(algo: str, tensors: Mapping[str, TensorDigest]) -> tuple[dict[str, str], str]:
    """Layer digests (ordered by layer number, "other" last) and the root of tensor digests."""
    groups: dict[str, list[str]] = {}
    names: list[str] = []
    prefix: str | None = None  # "model.layers.<N>." of the run of names being grouped
    for name in tensors:  # usually sorted: a layer's names come in one run
        if prefix is not None and name.startswith(prefix):
            names.append(name)  # layer_key(name) is that of the run's first name
            continue
        names = groups.setdefault(layer_key(name), [])
        names.append(name)
        end = name.find(".", 13) if name.startswith("model.layers.") else -1
        digits = name[13:end]
        ok = end > 13 and digits.isascii() and digits.isdigit()
        prefix = name[: end + 1] if ok else None
    layers = {
        k: _layer_digest(algo, k, sorted(groups[k]), tensors)
        for k in sorted(groups, key=_key_order)
    }
    return layers, root_digest(algo, layers)


def select(plan: LogicalPlan, layers: Collection[str] | None) -> LogicalPlan:
    """The part of a plan in `layers` (all of it for None)."""
    if layers is None:
        return plan
    keep = {n: t for n, t in plan.tensors.items() if layer_key(n) in layers}
    reps = {n: r for n, r in plan.replicas.items() if n in keep}
    probs = [p for p in plan.problems if p.tensor is None or layer_key(p.tensor) in layers]
    return LogicalPlan(keep, reps, probs, plan.world_size)


def planned_bytes(plan: LogicalPlan, algo: str, compat: bool | None = None) -> int:
    """Bytes `compute_identity` will hash for this (selected) plan: sizes a progress bar."""
    n = plan.nbytes + sum(r.info.nbytes for refs in plan.replicas.values() for r in refs)
    if algo != "sha256" and compat is not False:
        from exl3tool.identity.compat import prepare

        cp = prepare(plan)
        if cp.k is not None and (compat or not cp.problems):
            n += cp.nbytes
    return n


def identity_jobs(plan: LogicalPlan) -> list[tuple[Any, tuple[Segment, ...]]]:
    """What `compute_identity` hashes: (logical name, segments) per tensor and
    ((name, i), segment) per replicated copy; `identity_from_digests` takes the digests."""
    return [(n, tuple(segs)) for n, segs in _iter_jobs(plan)]


def _iter_jobs(plan: LogicalPlan) -> Iterator[tuple[Any, tuple[Segment, ...]]]:
    """`identity_jobs` one at a time (the engine keeps only what it needs of each)."""
    new = tuple.__new__  # Segment(...) without NamedTuple's Python-level __new__ (10^6 tensors)
    for n, t in plan.tensors.items():
        ref = t.stored_ref
        if ref is None:
            yield n, t.segments
        else:
            st, info = ref.shard, ref.info
            base = st.data_start
            yield n, (new(Segment, (st.path, base + info.begin, base + info.end)),)
    for name, refs in plan.replicas.items():
        for i, r in enumerate(refs):
            yield (name, i), (tensor_segment(r.shard, r.info),)


def identity_from_digests(
    plan: LogicalPlan, digests: Mapping[Any, str], algo: str, *, selection: str | None = None
) -> Identity:
    """Fold the digests of `identity_jobs(plan)` into an Identity (replica problems included;
    no compatibility block)."""
    ident = Identity(algo, selection=selection, problems=list(plan.problems))
    new = tuple.__new__  # TensorDigest(...) without NamedTuple's Python-level __new__
    ident.tensors = {
        n: new(TensorDigest, (t.dtype, t.shape, digests[n])) for n, t in plan.tensors.items()
    }

    def digest(name: str, i: int | None) -> str:
        return digests[name] if i is None else digests[(name, i)]

    for name, r in differing_copies(plan.tensors, plan.replicas, digest):
        ident.problems.append(
            PlanProblem(
                f"replicated copy {r.name} in {r.file} differs from rank 0's copy",
                tensor=name,
                layer=layer_of(name),
                kind="replica",
            )
        )
    ident.layers, ident.root = fold(algo, ident.tensors)
    return ident


def compute_identity(
    ckpt: Checkpoint | None,
    *,
    algo: str = "blake3",
    layers: Collection[str] | None = None,
    selection: str | None = None,
    threads: int | None = None,
    progress: Any = None,
    compat: bool | None = None,
    plan: LogicalPlan | None = None,
    known: Known | None = None,
    stamps: dict[Path, FileStamp] | None = None,
) -> Identity:
    """Hash every logical tensor of `ckpt` (only `layers` when given) and fold the digests.

    `compat`: None adds the MSRT compatibility block when the experts qualify, True adds it
    whenever K is known (problems kept in it), False skips it. With `algo="sha256"` it costs
    nothing: the tensor digests are reused. `plan` replaces `ckpt` when already built.
    `known`: digests hashed ahead (identity/early), taken for shards with their `stamps`
    (those of `ckpt`'s shards by default: each file's stamp when its header was read).
    """
    check_algo(algo)
    if plan is None:
        assert ckpt is not None
        plan = build_plan(ckpt)
    plan = select(plan, layers)
    with paused_gc():  # per-tensor records, digests and the block's: no cycle among them
        return _identity(ckpt, plan, algo, selection, threads, progress, compat, known, stamps)


def _identity(
    ckpt: Checkpoint | None,
    plan: LogicalPlan,
    algo: str,
    selection: str | None,
    threads: int | None,
    progress: Any,
    compat: bool | None,
    known: Known | None,
    stamps: dict[Path, FileStamp] | None,
) -> Identity:
    if stamps is None and ckpt is not None:
        stamps = shard_stamps(ckpt.shards.values())
    block = _compat_block(ckpt, plan, compat)
    if block is not None and block is not _DROPPED and block.tensors and algo != "sha256":
        also = {lt.name for lt in block.tensors}  # their sha256 from the same reads
        digests, sha = hash_segments_twice(
            _iter_jobs(plan), algo, "sha256", also, threads, progress, stamps, known
        )
    else:
        jobs = _iter_jobs(plan)
        digests, sha = hash_segments(jobs, algo, threads, progress, stamps, known), None
    ident = identity_from_digests(plan, digests, algo, selection=selection)
    if compat is not False and block is not _DROPPED:
        from exl3tool.identity.compat import compat_identity

        if algo == "sha256":
            sha = {n: t.digest for n, t in ident.tensors.items()}
        if block is None:  # an MSRT base with stray ranks: the runtime's view, rank0 only
            c = compat_identity(ckpt, threads=threads, progress=progress)
        else:
            c = compat_identity(
                None, threads=threads, progress=progress, plan=plan, sha256=sha, prepared=block
            )
        if c.root is not None and (compat or not c.problems):
            ident.compatibility = c
    return ident


def _compat_block(ckpt: Checkpoint | None, plan: LogicalPlan, compat: bool | None) -> Any:
    """The compatibility block's prepared plan when it is computed from `plan` (its tensors
    then get their sha256 in the identity's own pass); None when it comes from the runtime's
    view of the checkpoint instead; `_DROPPED` when it is not wanted or could only be dropped
    (`compat` None and problems found before any hashing: `compute_identity` keeps a block
    with problems only when asked for it)."""
    if compat is False:
        return _DROPPED
    from exl3tool.identity.compat import prepare, stray_ranks

    if ckpt is not None and stray_ranks(ckpt):
        return None
    block = prepare(plan)
    if block.k is None or (compat is None and block.problems):
        return _DROPPED
    return block


_DROPPED: Any = object()
