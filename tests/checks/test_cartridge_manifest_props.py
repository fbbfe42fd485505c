"""Property: the manifest checks never raise, whatever JSON a field holds (only findings)."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from exl3tool.checks.cartridge_manifest import check_manifest
from exl3tool.formats import msrt_spec as spec
from exl3tool.rules.registry import Findings

EXAMPLE = json.loads(
    (
        Path(__file__).resolve().parents[2] / "examples" / "cartridge-k3k4" / spec.ADAPTER_CONFIG
    ).read_text()
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(field=st.sampled_from(spec.ADAPTER_FIELDS), value=json_values)
def test_field_replaced_by_any_json(field, value):
    m = dict(EXAMPLE)
    m[field] = value
    f = Findings()
    check_manifest(m, f)
    if field in spec.ADAPTER_CONSTANTS and value != EXAMPLE[field]:
        assert f.has_errors()


@settings(max_examples=100, deadline=None)
@given(value=json_values)
def test_whole_manifest_any_json(value):
    check_manifest(value, Findings())


def test_example_manifest_is_clean():
    f = Findings()
    check_manifest(EXAMPLE, f)
    assert not list(f)
