"""r7_manifests: the all-at-once test of the big maps (payload_sha256, bit_map) reports exactly
what testing each entry reports."""

from __future__ import annotations

import random

import pytest

from exl3tool.checks import r7_manifests
from exl3tool.checks.r7_manifests import manifest_schema_errors

HEX = "0123456789abcdef"
_BAD_SHAS = [
    lambda r: "".join(r.choice(HEX) for _ in range(63)),
    lambda r: "".join(r.choice(HEX) for _ in range(64)) + "\n",  # `$` lets one newline through
    lambda r: "a" * 64 + "\n" + "b" * 64,  # two digests in one value
    lambda r: "A" * 64,
    lambda r: 7,
    lambda r: None,
    lambda r: "",
]
_BAD_KS = [0, 9, -1, True, 4.0, "4", None]


def _manifest(seed: int) -> dict:
    r = random.Random(seed)
    n = r.randrange(0, 30)
    shas = {f"t{i}": "".join(r.choice(HEX) for _ in range(64)) for i in range(n)}
    ks = {f"p{i}": r.randrange(1, 9) for i in range(n)}
    for _ in range(r.choice([0, 0, 1, 3])):
        if shas:
            shas[r.choice(list(shas))] = r.choice(_BAD_SHAS)(r)
        if ks:
            ks[r.choice(list(ks))] = r.choice(_BAD_KS)
    return {"schema_version": 2, "layer": 3, "payload_sha256": shas, "bit_map": ks}


@pytest.mark.parametrize("seed", range(60))
def test_big_maps_all_at_once_equal_entry_by_entry(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    man = _manifest(seed)
    fast = manifest_schema_errors(man)
    monkeypatch.setattr(r7_manifests, "_all_ok", lambda key, values: False)
    assert fast == manifest_schema_errors(man)


def test_a_bad_entry_is_found_by_the_fast_test() -> None:
    good = "a" * 64
    assert r7_manifests._all_ok("payload_sha256", [good, good])
    assert not r7_manifests._all_ok("payload_sha256", [good + "\n" + good])
    assert not r7_manifests._all_ok("payload_sha256", [good + "\n"])
    assert not r7_manifests._all_ok("bit_map", [1, True])
    assert r7_manifests._all_ok("bit_map", [1, 8])
