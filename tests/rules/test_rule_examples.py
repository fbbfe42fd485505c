"""Every rule has a concrete example and a family title (ruff-like catalogue), shown in the docs."""

from __future__ import annotations

import json
import re

from typer.testing import CliRunner

from exl3tool.cli.main import app
from exl3tool.docs_gen import render_rules_md
from exl3tool.report.sarif import _descriptor
from exl3tool.rules.examples import EXAMPLES
from exl3tool.rules.families import FAMILY_DOCS, FAMILY_TITLES
from exl3tool.rules.registry import all_rules, family_of

RULES = all_rules()
CODE = re.compile(r"\b(?:R7|[A-Z]{2})\d{3}\b")


def test_every_rule_has_an_example() -> None:
    missing = [r.code for r in RULES if not r.example.strip()]
    assert missing == [], "add an example per new rule to exl3tool/rules/examples.py"
    assert all(r.example == EXAMPLES[r.code] for r in RULES)


def test_no_example_for_an_unknown_code() -> None:
    codes = {r.code for r in RULES}
    assert set(EXAMPLES) - codes == set()
    named = {c for text in EXAMPLES.values() for c in CODE.findall(text)}
    assert named <= codes


def test_examples_are_one_short_line() -> None:
    for code, text in EXAMPLES.items():
        assert "\n" not in text and 10 <= len(text) <= 100, code


def test_every_family_has_a_title_and_a_page() -> None:
    families = {family_of(r.code) for r in RULES}
    assert families <= set(FAMILY_TITLES)
    assert set(FAMILY_DOCS) <= set(FAMILY_TITLES)
    assert all(p.startswith("docs/formats/") for p in FAMILY_DOCS.values())


def test_rules_md_shows_titles_and_examples() -> None:
    text = render_rules_md()
    assert "## R7: R7 checkpoints" in text and "| example |" in text
    r = next(r for r in RULES if r.code == "R7023")
    assert f"| {r.example} |" in text.replace("\\|", "|")
    assert "[docs/formats/r7.md](formats/r7.md)" in text


def test_rules_json_carries_example_and_family_title() -> None:
    result = CliRunner().invoke(app, ["rules", "--family", "CA", "--format", "json"])
    assert result.exit_code == 0, result.output
    items = json.loads(result.stdout)
    assert items and all(i["family"] == "CA" and i["example"] for i in items)
    assert {i["family_title"] for i in items} == {FAMILY_TITLES["CA"]}


def test_rules_text_has_a_heading_row_per_family() -> None:
    result = CliRunner().invoke(app, ["rules", "--family", "DC"], env={"COLUMNS": "100"})
    assert result.exit_code == 0 and FAMILY_TITLES["DC"] in result.stdout


def test_sarif_descriptor_tags_the_family_title() -> None:
    r = RULES[0]
    assert _descriptor(r)["properties"]["tags"] == [r.family, FAMILY_TITLES[r.family]]
