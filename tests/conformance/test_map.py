"""The runtime-conformance map (rules/conformance.py) against the registry, its generated page
and its fixtures: one artifact per runtime check, for which a predicting rule must fire."""

from __future__ import annotations

from pathlib import Path

import pytest
from conformance_fixtures import FIXTURES

from exl3tool.docs_gen import CONFORMANCE_MD
from exl3tool.rules import conformance as cmap
from exl3tool.rules.registry import all_rules

CODES = {r.code for r in all_rules()}
WITH_FIXTURE = [c for c in cmap.RUNTIME_CHECKS if c.fixture is not None]


def test_page_is_generated_from_the_map() -> None:
    assert CONFORMANCE_MD.read_text() == cmap.render_markdown(), "run: python -m exl3tool.docs_gen"


def test_every_predicting_rule_is_registered() -> None:
    named = {code for c in cmap.RUNTIME_CHECKS for code in c.rules}
    assert named <= CODES, sorted(named - CODES)
    assert set(cmap.RULE_OUTCOME) <= CODES, sorted(set(cmap.RULE_OUTCOME) - CODES)


def test_every_rule_has_an_outcome_by_family_or_by_code() -> None:
    unmapped = sorted(
        r.code for r in all_rules() if r.code not in cmap.RULE_OUTCOME and r.family not in
        cmap.FAMILY_OUTCOME
    )  # fmt: skip
    assert unmapped == [], "classify them in exl3tool/rules/conformance.py (FAMILY_OUTCOME)"


def test_checks_and_fixtures_correspond() -> None:
    functions = [c.function for c in cmap.RUNTIME_CHECKS]
    assert len(functions) == len(set(functions))
    for c in cmap.RUNTIME_CHECKS:
        assert (c.fixture is None) == (not c.rules), c.function
    assert sorted(c.fixture for c in WITH_FIXTURE) == sorted(FIXTURES)


@pytest.mark.parametrize("check", WITH_FIXTURE, ids=[c.fixture for c in WITH_FIXTURE])
def test_fixture_is_predicted(check: cmap.RuntimeCheck, tmp_path: Path, built) -> None:
    got = FIXTURES[check.fixture](tmp_path, built)
    assert got & set(check.rules), f"{check.function}: got {sorted(got)}"


def test_refusal_rules_of_a_check_predict_refusals() -> None:
    # a check that refuses is predicted by refusal rules; the only non-refusing check (rank
    # dropping) is predicted by contract rules
    for c in cmap.RUNTIME_CHECKS:
        outcomes = {cmap.outcome(code) for code in c.rules}
        if c.function == "Exl3Config.normalize_rank_sliced_weight_name":
            assert outcomes == {cmap.Outcome.CONTRACT}
        elif c.function == "Exl3Config.override_quantization_method":
            assert cmap.Outcome.REFUSAL in outcomes
        else:
            assert outcomes <= {cmap.Outcome.REFUSAL}, c.function
