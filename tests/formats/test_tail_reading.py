"""How a `hybrid_tr3_tail`'s numbers are read: as the legacy profile's runtime reads them
(float(bits), int() of the rest), but as JSON numbers in the exl3-msrt-base/1 profile."""

from __future__ import annotations

import pytest

from exl3tool.formats.msrt_spec import BASE_PROFILE
from exl3tool.formats.tail import parse_tail, runtime_k

WRITTEN_AS_STRINGS = {"bits": "2", "moe_layers": ["3", " 4"], "experts_per_layer": "8", "tp": "2"}


def test_the_legacy_profile_reads_numbers_as_its_runtime_does() -> None:
    tail = parse_tail({"format": "exl3-trellis", **WRITTEN_AS_STRINGS})
    assert tail is not None
    assert (tail.k, tail.moe_layers, tail.experts_per_layer, tail.tp) == (2, (3, 4), 8, 2)


def test_the_msrt_base_profile_keeps_json_numbers() -> None:
    # its schema wants numbers and the runtime that reads it is not public: "2" stays unread,
    # so a cartridge is not matched against a K the base never declared as a number
    tail = parse_tail({"runtime_profile": BASE_PROFILE, **WRITTEN_AS_STRINGS})
    assert tail is not None
    assert (tail.k, tail.moe_layers, tail.experts_per_layer, tail.tp) == (None, None, None, None)
    tail = parse_tail({"runtime_profile": BASE_PROFILE, "bits": 2.0, "moe_layers": [3, 4],
                       "experts_per_layer": 8})  # fmt: skip
    assert tail is not None and (tail.k, tail.moe_layers, tail.experts_per_layer) == (2, (3, 4), 8)


@pytest.mark.parametrize(
    ("value", "read"),
    [(4, 4), (4.0, 4), ("4", 4), (" +4 ", 4), ("4_0", 40), ("0" * 63 + "2", 2), ("1" * 65, None),
     (4.5, None), (True, None), ("4.0", None), ("x", None), (None, None), ([4], None)],
)  # fmt: skip
def test_runtime_k_reads_what_int_reads_unchanged(value: object, read: int | None) -> None:
    assert runtime_k(value) == read
