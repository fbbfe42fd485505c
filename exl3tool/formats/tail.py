"""`config.json` → `hybrid_tr3_tail`, read once.

One block, three profiles: the legacy rank-sliced tail (docs/formats/r7.md §7.1), the MTP
layer an R7 checkpoint carries under it (§6), and the closed `exl3-msrt-base/1` profile of a
cartridge-capable base (docs/formats/msrt.md §5). The model keeps the block as written
(`raw`, for the checks' messages) and the fields the code branches on, typed; a field of the
wrong type reads as None. Models know no rules: the checks report what is wrong.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exl3tool.formats.msrt_spec import BASE_PROFILE as MSRT_BASE_PROFILE  # docs/formats/msrt.md §5
from exl3tool.io.paths import relative_path_problem
from exl3tool.io.strict_json import is_json_int

KEY = "hybrid_tr3_tail"
POINTER = "/hybrid_tr3_tail"
RANK_SLICED_FORMAT = "exl3-trellis"  # docs/formats/r7.md §7.1 `format`
# The integral K a uniform rank-sliced layer runs at, per runtime revision (docs/formats/r7.md
# §7.1: Exl3MoEMethod._prepare_rank_sliced_weights): the public revisions 3..6, the cartridge
# revision 2..6.
RANK_SLICED_K = {"public": range(3, 7), "cartridge": range(2, 7)}


def layer_range(value: Any) -> tuple[int, int] | None:
    """`[first, last]`: two non-negative JSON integers with last >= first, else None."""
    ok = (
        isinstance(value, list)
        and len(value) == 2
        and all(is_json_int(x) and x >= 0 for x in value)
    )
    return (value[0], value[1]) if ok and value[1] >= value[0] else None


def tail_layer_range(value: Any) -> tuple[int, int] | None:
    """A tail's `moe_layers` as the runtime reads it (Exl3Config._configure_rank_sliced:
    `int(first) >= 0`, `int(last) >= int(first)`): two items `runtime_k` reads, so ["3", "77"]
    is layers 3..77. The R7 block's `moe_layers` stays JSON integers (`layer_range`): its
    loader tests their type."""
    if not isinstance(value, list) or len(value) != 2:
        return None
    first, last = runtime_k(value[0]), runtime_k(value[1])
    if first is None or last is None or first < 0 or last < first:
        return None
    return first, last


def runtime_bits(bits: Any) -> float | None:
    """A tail's uniform `bits` as the runtime reads it (`float(bits)`: 4, 4.0, "4", " 4.0 "),
    else None. A bool is None: float() would read it as K 1 or 0, which no producer means."""
    if isinstance(bits, bool) or not isinstance(bits, int | float | str):
        return None
    if isinstance(bits, str):
        bits = bits.strip()
        if len(bits) > 64:
            return None
    try:
        return float(bits)
    except (ValueError, OverflowError):
        return None


def whole_k(bits: Any) -> int | None:
    """`bits` as a whole K (`runtime_bits`, finite and integral), else None."""
    x = runtime_bits(bits)
    if x is None or not math.isfinite(x) or x != int(x):
        return None
    return int(x)


def _positive_int(value: Any) -> int | None:
    """`tp` or `experts_per_layer` as the runtime reads it (`int(value)`), when positive."""
    n = runtime_k(value)
    return n if n is not None and n > 0 else None


@dataclass(frozen=True)
class Tail:
    """A `hybrid_tr3_tail` object and its typed fields."""

    raw: Mapping[str, Any]
    format: Any
    runtime_profile: Any
    bits: Any  # as written: a number, "mixed", or anything else
    k: int | None  # `bits` as a whole K
    moe_layers: tuple[int, int] | None  # as the runtime reads them (`tail_layer_range`)
    coverage: tuple[int, ...] | None  # `moe_layer_coverage` when a list of JSON integers
    experts_per_layer: int | None  # positive, as the runtime reads it (`_positive_int`)
    tp: int | None  # positive, as the runtime reads it (rank-sliced)
    compatibility_sha256: str | None
    compatibility_by_layer: Mapping[str, Any] | None

    def get(self, key: str, default: Any = None) -> Any:
        return self.raw.get(key, default)

    @property
    def is_msrt_base(self) -> bool:
        return self.runtime_profile == MSRT_BASE_PROFILE

    @property
    def is_rank_sliced_format(self) -> bool:
        """The runtime takes the rank-sliced path for this tail (`format` exl3-trellis)."""
        return self.format == RANK_SLICED_FORMAT

    @property
    def mixed(self) -> bool:
        return is_mixed_bits(self.bits)


def is_mixed_bits(bits: Any) -> bool:
    """The runtime's test of a tail's mixed bitrate (Exl3Config: `bits.strip().lower()`), so
    " Mixed" is mixed too."""
    return isinstance(bits, str) and bits.strip().lower() == "mixed"


def parse_tail(value: Any) -> Tail | None:
    """The model of a `hybrid_tr3_tail` value; None when it is not a JSON object.

    The legacy rank-sliced profile's numbers are read as its runtime reads them (`"4"` is 4);
    the `exl3-msrt-base/1` profile's are JSON numbers (its schema; the cartridge runtime that
    reads it is not public), so there `"4"` reads as None."""
    if not isinstance(value, dict):
        return None
    cov = value.get("moe_layer_coverage")
    root = value.get("compatibility_sha256")
    by_layer = value.get("compatibility_by_layer")
    base = value.get("runtime_profile") == MSRT_BASE_PROFILE
    bits, layers = value.get("bits"), value.get("moe_layers")
    epl, tp = value.get("experts_per_layer"), value.get("tp")
    return Tail(
        raw=value,
        format=value.get("format"),
        runtime_profile=value.get("runtime_profile"),
        bits=bits,
        k=whole_k(bits) if not base or type(bits) in (int, float) else None,
        moe_layers=layer_range(layers) if base else tail_layer_range(layers),
        coverage=tuple(cov) if isinstance(cov, list) and all(map(is_json_int, cov)) else None,
        experts_per_layer=_positive_int(epl) if not base or is_json_int(epl) else None,
        tp=_positive_int(tp) if not base or is_json_int(tp) else None,
        compatibility_sha256=root if isinstance(root, str) else None,
        compatibility_by_layer=by_layer if isinstance(by_layer, dict) else None,
    )


def raw_tail(config: Any) -> Any:
    """The `hybrid_tr3_tail` value of a config.json as written (None when absent)."""
    return config.get(KEY) if isinstance(config, dict) else None


def config_tail(config: Any) -> Tail | None:
    """The tail of a config.json; None when absent or not an object."""
    return parse_tail(raw_tail(config))


def runtime_k(value: Any) -> int | None:
    """A tier_bitmap K, a tail's layer index, `tp` or `experts_per_layer` as the runtime reads
    it (`int(value)`): a JSON integer, an integral float or a decimal string; None for what
    int() refuses or would change (a bool, 3.5, "x")."""
    if is_json_int(value):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):  # " 4", "+4", "4_0" as int() reads them
        digits = value.strip()
        if len(digits) > 64:  # no K, layer or count has more digits; int() of 10^6 would crawl
            return None
        try:
            return int(digits)
        except ValueError:
            return None
    return None


def layer_ks(entry: Any, experts: int) -> list[Any] | None:
    """The K of each expert of one tier_bitmap.json layer entry as the runtime takes it: its `k`
    list, or for the MTP overlay's form (no `k`, a `tail_tr3` of one item per expert) K 3 for
    every expert. None when neither has `experts` items (the runtime refuses to start)."""
    if not isinstance(entry, dict):
        return None
    ks = entry.get("k")
    overlay = entry.get("tail_tr3")
    if ks is None and isinstance(overlay, list | dict | str) and len(overlay) == experts:
        return [3] * experts
    return ks if isinstance(ks, list) and len(ks) == experts else None


def bitmap_reference(value: Any) -> tuple[str, str] | None:
    """(file, field) of a mixed tail's `bits_per_expert` as the runtime splits it
    (`reference.rsplit(":", 1)`), e.g. ("tier_bitmap.json", "k"); None when it has no `:`, an
    empty field, or a file that is not a relative path inside the checkpoint."""
    if not isinstance(value, str) or ":" not in value:
        return None
    name, field = value.rsplit(":", 1)
    if not field or relative_path_problem(name) is not None:
        return None
    return name, field


def bitmap_view(bitmap: Any, field: str) -> Any:
    """`bitmap` with each layer entry's `field` under `k` (what layer_ks reads)."""
    if field == "k" or not isinstance(bitmap, dict):
        return bitmap
    return {
        key: {"k": e.get(field), "tail_tr3": e.get("tail_tr3")} if isinstance(e, dict) else e
        for key, e in bitmap.items()
    }
