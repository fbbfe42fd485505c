"""Tensor naming conventions of EXL3, R7, rank-sliced and MSRT artifacts."""

from __future__ import annotations

import re
from dataclasses import dataclass

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
EXL3_FIELDS = ("trellis", "suh", "svh", "su", "sv", "mcg", "mul1", "bias")

# model.layers.{L}.mlp.experts.{E}.{proj}[.rank{r}].{field}
EXPERT_RE = re.compile(
    r"^model\.layers\.(?P<layer>0|[1-9][0-9]*)\.mlp\.experts\.(?P<expert>0|[1-9][0-9]*)"
    r"\.(?P<proj>gate_proj|up_proj|down_proj)(?:\.rank(?P<rank>[0-9]+))?\.(?P<field>[A-Za-z0-9_]+)$"
)
R7_SHARED_RE = re.compile(
    r"^model\.layers\.(?P<layer>0|[1-9][0-9]*)\.mlp\.experts\.r7_shared\.(?P<field>gate_up_suh|down_svh)$"
)
LAYER_RE = re.compile(r"(?:^|\.)layers\.(?P<layer>[0-9]+)\.")


@dataclass(frozen=True)
class ExpertName:
    layer: int
    expert: int
    proj: str
    rank: int | None
    field: str

    @property
    def prefix(self) -> str:
        """Logical linear prefix (rank segment removed)."""
        return f"model.layers.{self.layer}.mlp.experts.{self.expert}.{self.proj}"

    @property
    def logical(self) -> str:
        return f"{self.prefix}.{self.field}"


def parse_expert(name: str) -> ExpertName | None:
    m = EXPERT_RE.match(name)
    if m is None:
        return None
    rank = m.group("rank")
    return ExpertName(
        int(m.group("layer")),
        int(m.group("expert")),
        m.group("proj"),
        int(rank) if rank is not None else None,
        m.group("field"),
    )


def layer_of(name: str) -> int | None:
    """The decoder layer index named by `layers.<N>.` in a tensor name, if any."""
    m = LAYER_RE.search(name)
    return int(m.group("layer")) if m else None


def split_field(name: str) -> tuple[str, str]:
    """`a.b.c.trellis` -> (`a.b.c`, `trellis`)."""
    prefix, _, last = name.rpartition(".")
    return prefix, last
