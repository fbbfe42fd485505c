"""A cartridge-capable base's config.json, parsed once (docs/formats/msrt.md §5-§6).

The profile joins the model sizes (`hidden_size`, the MoE intermediate size, the routed expert
count) with the typed `hybrid_tr3_tail` of `formats.tail`. It knows no rules: `checks/base*.py`
report what is wrong with it, `checks/cartridge.py` matches cartridges against it and the
runtime sizes its tables from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exl3tool.formats.msrt_spec import base_sizes
from exl3tool.formats.tail import Tail, config_tail


@dataclass(frozen=True)
class BaseProfile:
    """Sizes and the closed profile of an `exl3-msrt-base/1` config.json (None where absent)."""

    tail: Tail
    hidden: int | None
    intermediate: int | None  # the full MoE intermediate size
    experts: int | None  # routed experts from the model config
    top_k: int | None  # num_experts_per_tok

    @property
    def k(self) -> int | None:
        """The uniform base K (`bits`, §1.3: 2..6)."""
        return self.tail.k

    @property
    def root(self) -> str | None:
        return self.tail.compatibility_sha256

    @property
    def by_layer(self) -> Mapping[str, Any]:
        return self.tail.compatibility_by_layer or {}

    @property
    def layers(self) -> tuple[int, ...] | None:
        """`moe_layer_coverage`, sorted (§5: the exact list of MoE layers)."""
        cov = self.tail.coverage
        return tuple(sorted(cov)) if cov is not None else None

    @property
    def experts_per_layer(self) -> int | None:
        """The profile's `experts_per_layer` when it is an int, else the config's count."""
        epl = self.tail.get("experts_per_layer")
        return epl if type(epl) is int else self.experts


def read_base_profile(config: Any) -> BaseProfile | None:
    """The profile of a config.json; None unless its tail is `exl3-msrt-base/1`."""
    tail = config_tail(config)
    if tail is None or not tail.is_msrt_base:
        return None
    hidden, inter, experts = base_sizes(config)
    top_k = config.get("num_experts_per_tok")
    return BaseProfile(tail, hidden, inter, experts, top_k if type(top_k) is int else None)
