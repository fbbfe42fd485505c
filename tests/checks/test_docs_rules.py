"""docs/rules.md is generated from the registry and must not drift from it."""

from __future__ import annotations

from exl3tool.docs_gen import RULES_MD, render_rules_md
from exl3tool.rules.registry import all_rules


def test_committed_rules_doc_matches_the_registry() -> None:
    assert RULES_MD.read_text() == render_rules_md(), "run: python -m exl3tool.docs_gen"


def test_every_rule_is_listed_once() -> None:
    text = render_rules_md()
    for r in all_rules():
        assert text.count(f"| {r.code} |") == 1
