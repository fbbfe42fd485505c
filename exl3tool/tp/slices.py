"""Value types of a slicing plan: one tensor slice, its byte layout, a rank's list, the plan."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from exl3tool.io.dtypes import BITS
from exl3tool.rules import tp as tp_rules
from exl3tool.rules.errors import Exl3ToolError
from exl3tool.rules.registry import Findings

MODES = ("tensor", "expert")
LAYOUTS = ("per-rank", "rank-sliced")


T = TypeVar("T")


class _once(Generic[T]):
    """`functools.cached_property` without its lock (taken on every first access before
    Python 3.12; 10^5 slices pay for it): the value is stored in the instance's __dict__,
    which then shadows this descriptor."""

    def __init__(self, fn: Callable[[Any], T]) -> None:
        self.fn = fn
        self.name = fn.__name__

    def __get__(self, obj: Any, owner: Any = None) -> T:
        if obj is None:
            return self  # type: ignore[return-value]
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


@dataclass(frozen=True)
class ByteLayout:
    """Where a slice's bytes live in its source payload: `count` runs of `run` bytes, the
    first at `offset`, consecutive runs `stride` bytes apart (row-major strided copy)."""

    offset: int
    run: int
    count: int
    stride: int

    @property
    def nbytes(self) -> int:
        return self.run * self.count

    @property
    def contiguous(self) -> bool:
        return self.count <= 1 or self.run == self.stride


@dataclass(frozen=True)
class TensorSlice:
    """One tensor of a rank: `source[start:stop]` on `axis` (axis None: the whole tensor).
    Shape, size and layout are computed once (the writer asks for them per block)."""

    source: str
    target_name: str
    axis: int | None
    start: int
    stop: int
    replicated: bool
    dtype: str
    source_shape: tuple[int, ...]

    @_once
    def shape(self) -> tuple[int, ...]:
        if self.axis is None:
            return self.source_shape
        s = list(self.source_shape)
        s[self.axis] = self.stop - self.start
        return tuple(s)

    @property
    def itemsize(self) -> int:
        return BITS[self.dtype] // 8

    @_once
    def nbytes(self) -> int:
        if self.axis is None:
            return math.prod(self.source_shape) * BITS[self.dtype] // 8
        return math.prod(self.shape) * self.itemsize

    @_once
    def layout(self) -> ByteLayout:
        """Byte layout relative to the start of the source payload."""
        if self.axis is None:
            n = self.nbytes
            return ByteLayout(0, n, 1, n)
        s, a = self.source_shape, self.axis
        inner = math.prod(s[a + 1 :]) * self.itemsize
        return ByteLayout(
            self.start * inner, (self.stop - self.start) * inner, math.prod(s[:a]), s[a] * inner
        )

    def to_json(self) -> dict:
        return {
            "source": self.source,
            "axis": self.axis,
            "start": self.start,
            "stop": self.stop,
            "replicated": self.replicated,
        }


_new = object.__new__


def new_slice(
    source: str,
    target_name: str,
    axis: int | None,
    start: int,
    stop: int,
    replicated: bool,
    dtype: str,
    source_shape: tuple[int, ...],
    shape: tuple[int, ...],
    nbytes: int,
) -> TensorSlice:
    """`TensorSlice(source, ..., source_shape)` whose `shape` and `nbytes` the caller already
    computed (they must be the ones the class would compute): its fields written to the
    instance's __dict__, not through the frozen dataclass's object.__setattr__ per field (a
    plan of 10^5 slices saved ~1 us each). Equal to, and hashed as, the constructor's."""
    s = _new(TensorSlice)
    d = s.__dict__
    d["source"] = source
    d["target_name"] = target_name
    d["axis"] = axis
    d["start"] = start
    d["stop"] = stop
    d["replicated"] = replicated
    d["dtype"] = dtype
    d["source_shape"] = source_shape
    d["shape"] = shape
    d["nbytes"] = nbytes
    return s


@dataclass(frozen=True)
class Reported:
    """A tensor that no rule could split, replicated whole (TP003)."""

    tensor: str
    reason: str


@dataclass
class RankPlan:
    rank: int
    slices: list[TensorSlice] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.slices)


@dataclass
class SlicePlan:
    kind: str
    tp: int
    mode: str
    layout: str
    ranks: list[RankPlan]
    reported: list[Reported] = field(default_factory=list)
    source_order: list[str] = field(default_factory=list)  # source tensors in pass order
    cartridge_only: dict[int, int] = field(default_factory=dict)  # rank-sliced layer -> its K

    def findings(self) -> Findings:
        out = Findings()
        for r in self.reported:
            out.add(tp_rules.TP_REPLICATED, r.reason, tensor=r.tensor)
        if self.cartridge_only:
            layer, k = next(iter(self.cartridge_only.items()))
            more = len(self.cartridge_only) - 1
            out.add(
                tp_rules.TP_CARTRIDGE_K,
                f"layer {layer} is uniform K={k}"
                + (f" ({more} more layer{'s' if more > 1 else ''})" if more else "")
                + ": the public runtime revisions serve K 3..6, only the cartridge revision loads it",
                tensor=f"model.layers.{layer}.mlp.experts",
            )
        return out

    def summary(self) -> dict:
        return {
            "kind": self.kind,
            "tp": self.tp,
            "mode": self.mode,
            "layout": self.layout,
            "ranks": [
                {
                    "rank": r.rank,
                    "tensors": len(r.slices),
                    "bytes": r.nbytes,
                    "replicated_tensors": sum(1 for s in r.slices if s.replicated),
                    "replicated_bytes": sum(s.nbytes for s in r.slices if s.replicated),
                }
                for r in self.ranks
            ],
            "reported": [{"tensor": r.tensor, "reason": r.reason} for r in self.reported],
        }


class PlanRefused(Exl3ToolError):
    """The plan is impossible (TP001/TP002/TP009 findings); nothing is written."""

    exit_code = 1

    def __init__(self, findings: Findings) -> None:
        self.findings = findings
        first = next(iter(findings))
        more = f" (and {len(findings) - 1} more)" if len(findings) > 1 else ""
        super().__init__(f"{first.code} {first.location.tensor or ''}: {first.message}{more}")
