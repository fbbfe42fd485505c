"""Rule families as data: a code's prefix and the title `exl3tool rules`, docs/rules.md and SARIF show.

A family is a rule code without its 3-digit number (`registry.family_of`: R7023 -> R7).
"""

from __future__ import annotations

from types import MappingProxyType

FAMILY_TITLES = MappingProxyType(
    {
        "ST": "safetensors structure",
        "JS": "JSON documents",
        "PA": "paths",
        "CK": "checkpoint container",
        "EX": "EXL3 linears and tensor_storage",
        "R7": "R7 checkpoints",
        "RS": "rank-sliced (hybrid_tr3_tail) profile",
        "MB": "MSRT bases (exl3-msrt-base/1)",
        "CA": "MSRT cartridges",
        "DC": "trellis decode",
        "ID": "byte identities",
        "TP": "tensor-parallel slicing",
        "GT": "pre-publish gate (exl3tool check)",
        "PL": "boot plan (exl3tool plan)",
        "VS": "verify-swap runs (memory, rank processes)",
    }
)


# The format page that a family's bare section citations refer to (docs/formats/index.md).
FAMILY_DOCS = MappingProxyType(
    {
        **dict.fromkeys(("EX", "DC", "TP"), "docs/formats/exl3.md"),
        **dict.fromkeys(("R7", "RS", "ST", "JS", "PA", "CK", "GT"), "docs/formats/r7.md"),
        **dict.fromkeys(("CA", "MB", "ID", "VS"), "docs/formats/msrt.md"),
    }
)


def family_title(family: str) -> str:
    """The title of a family; an unlisted one reads "<prefix> rules"."""
    return FAMILY_TITLES.get(family, f"{family} rules")
