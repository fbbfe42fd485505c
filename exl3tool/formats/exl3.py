"""EXL3 linear groups: `{prefix}.trellis/.suh/.svh` (+ marker, bias, legacy su/sv).

docs/formats/exl3.md §1: K = trellis.shape[-1] / 16; integer 1..8, or 1.5/2.5/3.5 with mul1 only.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field

from exl3tool.formats.checkpoint import TensorRef
from exl3tool.formats.names import EXL3_FIELDS, split_field

MCG_MARKER = -877912083  # 0xCBAC1FED as int32
MUL1_MARKER = -2082680531  # 0x83DCD12D as int32
MCG_MULTIPLIER = 0xCBAC1FED
MUL1_MULTIPLIER = 0x83DCD12D
HALF_K = (1.5, 2.5, 3.5)


def k_of_last_dim(last: int) -> float | int | None:
    """K for a trellis last dimension, or None when it is not 16*K for any K of the format."""
    if last % 8:
        return None
    if not last % 16:
        return last // 16 if 1 <= last // 16 <= 8 else None
    half = last / 16  # an exact half: last is an odd multiple of 8
    return half if half in HALF_K else None


def codebook_of(parts: Container[str]) -> str:
    """Codebook selected by marker presence (docs/formats/exl3.md §4): mcg, mul1 or 3inst.
    `parts`: a linear's fields, or the field suffixes a tensor_storage record lists."""
    if "mcg" in parts:
        return "mcg"
    if "mul1" in parts:
        return "mul1"
    return "3inst"


@dataclass
class LinearGroup:
    """The tensors of one EXL3 linear, keyed by field name."""

    prefix: str
    parts: dict[str, TensorRef] = field(default_factory=dict)

    @property
    def trellis(self) -> TensorRef | None:
        return self.parts.get("trellis")

    @property
    def is_exl3(self) -> bool:
        return "trellis" in self.parts or {"suh", "svh"} <= self.parts.keys()

    @property
    def k(self) -> float | int | None:
        t = self.trellis
        if t is None or len(t.info.shape) != 3:
            return None
        return k_of_last_dim(t.info.shape[-1])

    @property
    def codebook(self) -> str:
        return codebook_of(self.parts)

    @property
    def in_features(self) -> int | None:
        t = self.trellis
        return t.info.shape[0] * 16 if t is not None and len(t.info.shape) == 3 else None

    @property
    def out_features(self) -> int | None:
        t = self.trellis
        return t.info.shape[1] * 16 if t is not None and len(t.info.shape) == 3 else None


def group_linears(
    tensors: dict[str, TensorRef], tables: list[str] | None = None
) -> dict[str, LinearGroup]:
    """Group tensors whose last name segment is an EXL3 field; keep only groups with a trellis
    or an suh/svh pair (other `.weight`/`.bias` modules are not EXL3). A quantized embedding
    table (`is_quantized_table`) is no linear: its prefix goes to `tables` when given."""
    groups: dict[str, LinearGroup] = {}
    signs: list[str] = []
    for name, ref in tensors.items():
        prefix, fld = split_field(name)
        if fld in EXL3_FIELDS:
            groups.setdefault(prefix, LinearGroup(prefix)).parts[fld] = ref
        elif fld == "signs":
            signs.append(prefix)
    for prefix in signs:
        group = groups.get(prefix)
        if group is not None and is_quantized_table(group):
            del groups[prefix]
            if tables is not None:
                tables.append(prefix)
    return {p: g for p, g in groups.items() if g.is_exl3}


def is_quantized_table(group: LinearGroup) -> bool:
    """Rows of a table as exllamav3 quantizes an embedding (convert.py -eb) or an n-gram table:
    a module named as one, a rank-2 trellis beside `<prefix>.signs` (checked by the caller), no
    suh/svh/su/sv. A projection that looks so is a broken linear, and checked as one."""
    t = group.trellis
    vectors = {"suh", "svh", "su", "sv"} & group.parts.keys()
    name = group.prefix.rsplit(".", 1)[-1]
    table = ("embed" in name or "ngram" in name) and not name.endswith("_proj")
    return table and t is not None and len(t.info.shape) == 2 and not vectors
