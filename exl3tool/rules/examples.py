"""One concrete example per rule: a fragment of an artifact that triggers it (like ruff's docs).

Keys are rule codes; tests/rules/test_examples.py checks that every registered rule has one and
that no example names an unknown code. docs/rules.md shows them.
"""

from __future__ import annotations

from types import MappingProxyType

EXAMPLES = MappingProxyType({})
