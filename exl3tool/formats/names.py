"""Tensor naming conventions of EXL3, R7, rank-sliced and MSRT artifacts."""

from __future__ import annotations

import re
from dataclasses import dataclass
from operator import methodcaller

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
EXL3_FIELDS = ("trellis", "suh", "svh", "su", "sv", "mcg", "mul1", "bias")

# model.layers.{L}.mlp.experts.{E}.{proj}[.rank{r}].{field}
EXPERT_RE = re.compile(
    r"^model\.layers\.(?P<layer>0|[1-9][0-9]*)\.mlp\.experts\.(?P<expert>0|[1-9][0-9]*)"
    r"\.(?P<proj>gate_proj|up_proj|down_proj)(?:\.rank(?P<rank>[0-9]+))?\.(?P<field>[A-Za-z0-9_]+)$"
)
# EXPERT_RE without its field: what the name before its last dot must be (`expert_prefix`)
EXPERT_PREFIX_RE = re.compile(
    r"model\.layers\.(?P<layer>0|[1-9][0-9]*)\.mlp\.experts\.(?P<expert>0|[1-9][0-9]*)"
    r"\.(?P<proj>gate_proj|up_proj|down_proj)(?:\.rank(?P<rank>[0-9]+))?"
)
_FIELD_RE = re.compile(r"[A-Za-z0-9_]+")
# Every name EXPERT_RE accepts, and every prefix EXPERT_PREFIX_RE does, holds this: names
# without it are no routed expert's, told apart by a substring test in C (10^6 names).
EXPERT_MARK = ".mlp.experts."
has_expert_mark = methodcaller("__contains__", EXPERT_MARK)
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


def is_encoder_tower(name: str) -> bool:
    """Whether a module or tensor name lies in a vision encoder tower (Qwen-VL `visual`,
    `vision_tower`, `vision_model`), which has its own geometry and is not the text decoder."""
    return "vision" in name or "visual" in name


def split_field(name: str) -> tuple[str, str]:
    """`a.b.c.trellis` -> (`a.b.c`, `trellis`)."""
    prefix, _, last = name.rpartition(".")
    return prefix, last


class ExpertPrefixes:
    """`parse_expert` of many names, parsed once per `{prefix}` (the name before its last dot:
    a projection's trellis, markers and vectors share one). The same answers: a name whose
    field is a plain token parses exactly when its prefix does."""

    def __init__(self) -> None:
        # prefix -> (layer, expert, proj, rank), or None when it is no expert's
        self._prefixes: dict[str, tuple[int, int, str, int | None] | None] = {}
        self._plain: dict[str, bool] = {}  # field -> a plain token (EXPERT_RE's field group)

    def _parse(self, name: str) -> tuple[tuple[int, int, str, int | None] | None, str]:
        prefix, _, field = name.rpartition(".")
        plain = self._plain.get(field)
        if plain is None:
            plain = self._plain[field] = _FIELD_RE.fullmatch(field) is not None
        if not plain:  # e.g. a trailing newline, which EXPERT_RE's `$` lets through
            en = parse_expert(name)
            if en is None:
                return None, field
            return (en.layer, en.expert, en.proj, en.rank), en.field
        if prefix in self._prefixes:
            return self._prefixes[prefix], field
        hit = self._prefixes[prefix] = _parse_prefix(prefix)
        return hit, field

    def parse(self, name: str) -> tuple[int, int | None, str] | None:
        """(layer, rank, field) of an expert tensor's name, or None."""
        hit, field = self._parse(name)
        return None if hit is None else (hit[0], hit[3], field)

    def logical(self, name: str) -> tuple[str, int | None, str] | None:
        """(prefix, rank, field) of an expert tensor's name, or None: `ExpertName.prefix` (the
        rank segment removed), `.rank` and `.field` of `parse_expert(name)`."""
        hit, field = self._parse(name)
        if hit is None:
            return None
        return f"model.layers.{hit[0]}.mlp.experts.{hit[1]}.{hit[2]}", hit[3], field

    def parts(self, name: str) -> tuple[int, int, str, str] | None:
        """(layer, expert, proj, field) of an expert tensor's name, or None."""
        hit, field = self._parse(name)
        return None if hit is None else (hit[0], hit[1], hit[2], field)


def _parse_prefix(prefix: str) -> tuple[int, int, str, int | None] | None:
    m = EXPERT_PREFIX_RE.fullmatch(prefix)
    if m is None:
        return None
    rank = m.group("rank")
    return int(m["layer"]), int(m["expert"]), m["proj"], None if rank is None else int(rank)
