"""The one --layers grammar: ranges, keywords, and every malformed spec a usage error."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exl3tool.io.layer_spec import LayerSpec, parse_layer_spec
from exl3tool.rules.errors import UsageError


def test_ranges_and_keywords() -> None:
    assert parse_layer_spec("3-5,7, 9 ") == LayerSpec(frozenset({3, 4, 5, 7, 9}), frozenset())
    assert parse_layer_spec("0,other", ("other",)) == LayerSpec(
        frozenset({0}), frozenset({"other"})
    )
    assert parse_layer_spec("all", ("all",)).keywords == {"all"}


@pytest.mark.parametrize("bad", ["5-3", "x", "1,,2", "-1", "3-", "²", "other", "1.5", ""])
def test_malformed_specs_are_usage_errors(bad: str) -> None:
    with pytest.raises(UsageError, match="--layers"):
        parse_layer_spec(bad)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.text(max_size=12))
def test_any_text_parses_or_is_a_usage_error(text: str) -> None:
    try:
        spec = parse_layer_spec(text, ("other",))
    except UsageError:
        return
    for part in text.split(","):  # accepted: every part is a keyword, a number or a range
        part = part.strip()
        assert part == "other" or all(p.strip().isascii() for p in part.split("-"))
    assert all(i >= 0 for i in spec.layers)
