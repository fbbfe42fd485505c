"""Properties: whatever JSON a manifest (or one of its fields) holds, the checks never raise, and a
value the format forbids (docs/formats/msrt.md §4) is an error finding."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exl3tool.checks.cartridge import check_cartridge
from exl3tool.checks.cartridge_manifest import check_manifest
from exl3tool.checks.options import ValidateOptions
from exl3tool.formats import msrt_spec as spec
from exl3tool.rules.registry import Findings

EXAMPLE_DIR = Path(__file__).resolve().parents[2] / "examples" / "cartridge-k3k4"
EXAMPLE = json.loads((EXAMPLE_DIR / spec.ADAPTER_CONFIG).read_text())

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


# §4: which other values a field may legally hold (typed from the document, not the schema).
# Every field not listed here admits no value but the example's: a constant (rows 1, 5-13), a
# closed object or list that must agree with the rest of the manifest, or a date-time (row 24;
# the generated strings are at most 8 characters, shorter than any RFC 3339 date-time).
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
LEGAL = {
    # row 2, read as the runtime reads it: _LABEL_RE.fullmatch(str(value)) (20261204 passes)
    "assembly": lambda v: not isinstance(v, dict | list) and bool(_LABEL.fullmatch(str(v))),
    "num_tensors": lambda v: type(v) is int and v >= 1,  # row 16 (the count needs the shards)
    # row 17: non-empty unique ints >= 0 (equal to the experts of the keys: a tensor rule)
    "selected_experts": lambda v: (
        isinstance(v, list)
        and len(v) > 0
        and all(type(e) is int and e >= 0 for e in v)
        and len(set(v)) == len(v)
    ),
    "producer_verified_signer": lambda v: (
        v is None or (isinstance(v, str) and bool(_SHA256.match(v)))
    ),
    "tool_version": lambda v: isinstance(v, str) and v != "",  # row 23
}


def _must_fail(field: str, value: object) -> bool:
    """Whether §4 forbids `value` in `field` of the example manifest."""
    if field in LEGAL:
        return not LEGAL[field](value)
    # == conflates 1 with 1.0 and 0 with False; such values are left to the unit tests
    return value != EXAMPLE[field]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(field=st.sampled_from(spec.ADAPTER_FIELDS), value=json_values)
def test_field_replaced_by_any_json(field, value):
    m = dict(EXAMPLE)
    m[field] = value
    f = Findings()
    check_manifest(m, f)
    if _must_fail(field, value):
        assert f.has_errors(), (field, value)
    if value == EXAMPLE[field] and type(value) is type(EXAMPLE[field]):
        assert not f.has_errors()


@settings(max_examples=100, deadline=None, derandomize=True)
@given(value=st.dictionaries(st.text(max_size=6), json_values, max_size=6))
def test_whole_manifest_any_object(value):
    """A random object is not a manifest: 24 required fields (§4), so always errors."""
    f = Findings()
    check_manifest(value, f)
    assert f.has_errors()
    assert all(x.location.pointer is not None for x in f)


@pytest.mark.parametrize("text", ["null", "[]", "3", '"adapter"', "true", "{", ""])
def test_manifest_that_is_not_an_object_is_a_finding(tmp_path: Path, text: str) -> None:
    root = Path(shutil.copytree(EXAMPLE_DIR, tmp_path / "c"))
    (root / spec.ADAPTER_CONFIG).write_text(text)
    findings = Findings()
    check_cartridge(root, findings, ValidateOptions())
    assert findings.has_errors()
    assert any(x.location.file and x.location.file.endswith(spec.ADAPTER_CONFIG) for x in findings)


def test_example_manifest_is_clean():
    f = Findings()
    check_manifest(EXAMPLE, f)
    assert not list(f)
