"""Logical tensors of an artifact: physical names, shards and TP rank slices resolved away.

A tensor named `...{proj}.rank{r}.{field}` (legacy rank-sliced schema, docs/formats/r7.md
§7.1; MSRT bases and cartridges, docs/formats/msrt.md §3, §5, §8) is one slice of the logical
tensor `...{proj}.{field}`. Its logical bytes are the row-major bytes of the slices concatenated
on the split axis, so a logical tensor is a list of byte `Segment`s fed to one hasher in order:

| projection | split on axis | replicated (byte-identical on every rank) |
|---|---|---|
| gate/up | trellis (and cartridge `trellis_<label>`) axis 1, svh axis 0 | suh, mcg, mul1, scale_* |
| down | trellis axis 0, suh axis 0 | svh, mcg, mul1, scale_* |

A replicated tensor counts once (rank 0's copy); the other copies are `replicas`, to be hashed
and compared. Only rank 0 present (MSRT base, `layout: full`) means rank 0 holds the full tensor.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from operator import methodcaller

from exl3tool.formats.checkpoint import Checkpoint, TensorRef
from exl3tool.identity.engine import Segment, tensor_segment
from exl3tool.io.gcpause import paused_gc

RANKED_RE = re.compile(
    r"^(?P<prefix>model\.layers\.(?:0|[1-9][0-9]*)\.mlp\.experts\.(?:0|[1-9][0-9]*|shared_h)"
    r"\.(?P<proj>gate_proj|up_proj|down_proj))\.rank(?P<rank>0|[1-9][0-9]*)"
    r"\.(?P<field>[A-Za-z0-9][A-Za-z0-9_-]*)$"
)
_RANK = ".rank"  # in every name RANKED_RE accepts
_HAS_RANK = methodcaller("__contains__", _RANK)
_SPLIT: dict[tuple[str, str], int] = {
    ("gate_proj", "trellis"): 1,
    ("up_proj", "trellis"): 1,
    ("gate_proj", "svh"): 0,
    ("up_proj", "svh"): 0,
    ("down_proj", "trellis"): 0,
    ("down_proj", "suh"): 0,
}
_REPLICATED = frozenset(("suh", "svh", "mcg", "mul1", "scale", "su", "sv", "bias"))


@dataclass(frozen=True)
class PlanProblem:
    message: str
    tensor: str | None = None
    layer: int | None = None
    kind: str = "layout"  # "layout" (slices do not reassemble) | "replica" (copies differ)


class LogicalTensor:
    """A logical tensor: its bytes are `segments` fed to one hasher in order; `sources` are the
    physical tensors, in rank order. A tensor stored whole keeps only its TensorRef and makes
    its one segment when asked (a checkpoint may hold 10^6 of them)."""

    __slots__ = ("_segments", "_sources", "dtype", "name", "shape")

    def __init__(
        self,
        name: str,
        dtype: str,
        shape: tuple[int, ...],
        segments: tuple[Segment, ...],
        sources: tuple[TensorRef, ...],
    ) -> None:
        self.name, self.dtype, self.shape = name, dtype, shape
        self._segments: tuple[Segment, ...] | None = segments
        self._sources: tuple[TensorRef, ...] | TensorRef = sources

    @classmethod
    def stored(cls, name: str, ref: TensorRef) -> LogicalTensor:
        """The logical tensor of one tensor stored whole."""
        lt = cls.__new__(cls)
        lt.name, lt.dtype, lt.shape = name, ref.info.dtype, ref.info.shape
        lt._segments, lt._sources = None, ref
        return lt

    @property
    def segments(self) -> tuple[Segment, ...]:
        if self._segments is None:
            ref = self._sources
            assert isinstance(ref, TensorRef)
            return (tensor_segment(ref.shard, ref.info),)
        return self._segments

    @property
    def stored_ref(self) -> TensorRef | None:
        """The one stored tensor this logical tensor is, whole (None: made of segments)."""
        return self._sources if self._segments is None else None  # type: ignore[return-value]

    @property
    def sources(self) -> tuple[TensorRef, ...]:
        src = self._sources
        return (src,) if isinstance(src, TensorRef) else src

    @property
    def nbytes(self) -> int:
        if self._segments is None:
            return self._sources.info.nbytes  # type: ignore[union-attr]
        return sum(s.nbytes for s in self._segments)

    def _key(self) -> tuple[object, ...]:
        return (self.name, self.dtype, self.shape, self.segments, self.sources)

    def __eq__(self, other: object) -> bool:
        return type(other) is LogicalTensor and self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]  # mutable, like the dataclass it replaces

    def __repr__(self) -> str:
        return f"LogicalTensor({self.name!r}, {self.dtype!r}, {self.shape!r}, {self.segments!r})"


@dataclass
class LogicalPlan:
    tensors: dict[str, LogicalTensor] = field(default_factory=dict)  # sorted by logical name
    replicas: dict[str, tuple[TensorRef, ...]] = field(default_factory=dict)  # ranks >= 1
    problems: list[PlanProblem] = field(default_factory=list)
    world_size: int = 1  # largest rank count seen

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


def differing_copies(
    tensors: Mapping[str, LogicalTensor],
    replicas: Mapping[str, Sequence[TensorRef]],
    digest: Callable[[str, int | None], str | None],
) -> Iterator[tuple[str, TensorRef]]:
    """(logical name, copy) of each replicated copy whose dtype, shape or bytes differ from rank
    0's: the identity's ID007 and validate's RS012. `digest(name, i)` is that of copy `i` of
    `name`, or of rank 0's own copy for `i` None."""
    for name, refs in replicas.items():
        lt = tensors[name]
        first = digest(name, None)
        for i, r in enumerate(refs):
            if (r.info.dtype, r.info.shape) != (lt.dtype, lt.shape) or digest(name, i) != first:
                yield name, r


def field_kind(fld: str) -> str:
    """`trellis_<label>` / `scale_<label>` (cartridge stages) are trellis / scale."""
    for kind in ("trellis", "scale"):
        if fld == kind or fld.startswith(kind + "_"):
            return kind
    return fld


def split_axis(proj: str, fld: str) -> int | None:
    """The axis a rank slice cuts for this tensor, or None when it is replicated."""
    return _SPLIT.get((proj, field_kind(fld)))


def _layer(name: str) -> int | None:
    m = re.match(r"^model\.layers\.(0|[1-9][0-9]*)\.", name)
    return int(m.group(1)) if m else None


def _concat(
    name: str, refs: list[TensorRef], axis: int, problems: list[PlanProblem]
) -> LogicalTensor | None:
    first = refs[0].info
    shapes = [r.info.shape for r in refs]
    ok = all(
        r.info.dtype == first.dtype
        and len(s) == len(first.shape)
        and s[:axis] == first.shape[:axis]
        and s[axis + 1 :] == first.shape[axis + 1 :]
        for r, s in zip(refs, shapes, strict=True)
    )
    if not ok or len(first.shape) <= axis:
        problems.append(
            PlanProblem(
                f"rank slices do not fit together on axis {axis}: "
                + ", ".join(f"{r.info.dtype}{list(r.info.shape)}" for r in refs),
                tensor=name,
                layer=_layer(name),
            )
        )
        return None
    outer = math.prod(first.shape[:axis])
    segs: list[Segment] = []
    if outer == 0 or axis == 0:
        segs = [tensor_segment(r.shard, r.info) for r in refs]
    else:
        if any(r.info.nbytes % outer for r in refs):
            problems.append(PlanProblem("slices are not whole bytes per row", tensor=name))
            return None
        rows = [(tensor_segment(r.shard, r.info), r.info.nbytes // outer) for r in refs]
        for o in range(outer):
            for seg, inner in rows:
                s = seg.start + o * inner
                prev = segs[-1] if segs else None
                if prev is not None and prev.path == seg.path and prev.end == s:
                    segs[-1] = Segment(seg.path, prev.start, s + inner)
                else:
                    segs.append(Segment(seg.path, s, s + inner))
    shape = list(first.shape)
    shape[axis] = sum(s[axis] for s in shapes)
    return LogicalTensor(name, first.dtype, tuple(shape), tuple(segs), tuple(refs))


def _plain_tensors(plain: dict[str, TensorRef]) -> dict[str, LogicalTensor]:
    """One logical tensor per stored tensor without a rank segment."""
    stored = LogicalTensor.stored
    return {name: stored(name, ref) for name, ref in plain.items()}


def build_plan(ckpt: Checkpoint) -> LogicalPlan:
    """Resolve a checkpoint's tensors to logical tensors (no payload byte is read)."""
    with paused_gc():
        return _build_plan(ckpt)


def _build_plan(ckpt: Checkpoint) -> LogicalPlan:
    plan = LogicalPlan()
    ranked: dict[str, dict[int, TensorRef]] = {}
    plain: dict[str, TensorRef] = {}
    meta: dict[str, tuple[str, str]] = {}
    if not any(map(_HAS_RANK, ckpt.tensors)):  # no rank slice at all: one C-level pass
        plan.tensors = dict(sorted(_plain_tensors(ckpt.tensors).items()))
        return plan
    for name, ref in ckpt.tensors.items():
        m = RANKED_RE.match(name) if _RANK in name else None  # substring test: 10^6 names
        if m is None:
            plain[name] = ref
            continue
        logical = f"{m.group('prefix')}.{m.group('field')}"
        ranked.setdefault(logical, {})[int(m.group("rank"))] = ref
        meta[logical] = (m.group("proj"), m.group("field"))
    for logical in sorted(set(ranked) & set(plain)):
        plan.problems.append(
            PlanProblem(
                "stored both with and without a rank segment; the rank slices are ignored",
                tensor=logical,
                layer=_layer(logical),
            )
        )
    out = _plain_tensors(plain)
    world = max((max(r) + 1 for r in ranked.values()), default=1)
    plan.world_size = world
    for logical, by_rank in ranked.items():
        if logical in plain:
            continue
        proj, fld = meta[logical]
        # bounded by the slices present: `world` comes from a rank number in a tensor name
        missing = list(islice((r for r in range(world) if r not in by_rank), 8))
        if missing:
            more = world - len(by_rank) - len(missing)
            shown = f"{missing}" + (f" and {more} more" if more > 0 else "")
            plan.problems.append(
                PlanProblem(
                    f"rank slices {shown} are missing (world size {world})",
                    tensor=logical,
                    layer=_layer(logical),
                )
            )
        refs = [by_rank[r] for r in sorted(by_rank)]
        axis = split_axis(proj, fld)
        if axis is None and field_kind(fld) not in _REPLICATED:
            same = all(r.info.shape == refs[0].info.shape for r in refs)
            if not same:
                plan.problems.append(
                    PlanProblem(
                        f"unknown field {fld!r} differs in shape across ranks; "
                        "reassembled on axis 0",
                        tensor=logical,
                        layer=_layer(logical),
                    )
                )
                axis = 0
        if axis is None or len(refs) == 1:
            ref = refs[0]
            out[logical] = LogicalTensor(
                logical,
                ref.info.dtype,
                ref.info.shape,
                (tensor_segment(ref.shard, ref.info),),
                tuple(refs),
            )
            if len(refs) > 1:
                plan.replicas[logical] = tuple(refs[1:])
            continue
        lt = _concat(logical, refs, axis, plan.problems)
        if lt is not None:
            out[logical] = lt
    plan.tensors = dict(sorted(out.items()))
    return plan
