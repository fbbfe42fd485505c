"""Rule selection (`select` / `ignore` / `severity`) with ruff's precedence, and its config keys."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exl3tool.actions.gate.config import from_mapping, load_config
from exl3tool.rules.errors import UsageError
from exl3tool.rules.registry import Finding, Findings, Severity, all_rules, family_of, get_rule
from exl3tool.rules.selection import RuleSelection

RULES = all_rules()
CODES = [r.code for r in RULES]
FAMILIES = sorted({family_of(c) for c in CODES})


def _findings(codes: list[str]) -> Findings:
    out = Findings()
    for c in codes:
        out.add(get_rule(c), f"a {c} finding", file="x")
    return out


def test_default_selection_keeps_every_finding_unchanged() -> None:
    fs = _findings(CODES)
    kept = RuleSelection().apply(fs)
    assert [f for f in kept] == [f for f in fs]


def test_family_select_and_code_ignore() -> None:
    sel = RuleSelection(select=("R7",), ignore=("R7023",))
    kept = sel.apply(_findings(["R7023", "R7024", "CA001", "R7001"])).codes()
    assert kept == {"R7024", "R7001"}


def test_code_select_beats_family_ignore() -> None:
    sel = RuleSelection(select=("R7023",), ignore=("R7",))
    assert sel.apply(_findings(["R7023", "R7024", "CA001"])).codes() == {"R7023"}


def test_ignore_beats_select_at_equal_specificity() -> None:
    assert not RuleSelection(select=("CA",), ignore=("CA",)).selects("CA001")
    assert not RuleSelection(select=("CA001",), ignore=("CA001",)).selects("CA001")
    assert not RuleSelection(select=("ALL",), ignore=("ALL",)).selects("CA001")


def test_ignore_alone_keeps_the_other_families() -> None:
    sel = RuleSelection(ignore=("CA", "ST001"))
    assert sel.apply(_findings(["CA001", "ST001", "ST002", "R7001"])).codes() == {"ST002", "R7001"}


def test_all_and_prefixes() -> None:
    sel = RuleSelection(select=("ALL",), ignore=("R70",))
    assert sel.selects("R7100") and not sel.selects("R7001") and sel.selects("CA001")


def test_severity_override_most_specific_key_wins() -> None:
    sel = RuleSelection(severity={"CA": "warning", "CA001": "info", "ALL": "error"})
    out = {f.code: f.level for f in sel.apply(_findings(["CA001", "CA002", "ST001"]))}
    assert out == {"CA001": Severity.INFO, "CA002": Severity.WARNING, "ST001": Severity.ERROR}
    relevelled = next(iter(sel.apply(_findings(["CA002"]))))
    assert relevelled.to_json()["severity"] == "warning"
    assert relevelled.rule.severity is Severity.ERROR  # the rule itself is unchanged


def test_a_warning_relevelled_to_error_counts_as_error() -> None:
    warn = next(r.code for r in RULES if r.severity is Severity.WARNING)
    kept = RuleSelection(severity={warn: "error"}).apply(_findings([warn]))
    assert kept.has_errors() and kept.count(Severity.WARNING) == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"select": ("ZZ",)},
        {"ignore": ("R7999",)},
        {"select": ("R",)},  # mixes the R7 and RS families
        {"select": ("",)},
        {"severity": {"QQ001": "warning"}},
        {"severity": {"CA001": "fatal"}},
    ],
)
def test_unknown_codes_and_levels_are_usage_errors(kwargs: dict) -> None:
    with pytest.raises(UsageError) as exc:
        RuleSelection(**kwargs)
    assert exc.value.exit_code == 2


def test_selectors_are_case_insensitive() -> None:
    assert RuleSelection(select=("r7023", "ca")).select == ("R7023", "CA")


def test_from_options_splits_commas_and_reads_code_equals_level() -> None:
    sel = RuleSelection.from_options(["R7,CA001"], ["R7023"], ["CA001=Warning"])
    assert sel.select == ("R7", "CA001") and sel.ignore == ("R7023",)
    assert sel.severity == {"CA001": Severity.WARNING}
    with pytest.raises(UsageError):
        RuleSelection.from_options(severity=["CA001"])


def test_cli_overrides_config() -> None:
    config = RuleSelection(select=("CA",), ignore=("CA001",), severity={"CA002": "info"})
    cli = RuleSelection(select=("ST",), ignore=("ST001",), severity={"CA002": "warning"})
    both = config.overridden_by(cli)
    assert both.select == ("ST",) and both.ignore == ("CA001", "ST001")
    assert both.severity == {"CA002": Severity.WARNING}
    assert config.overridden_by(RuleSelection()).select == ("CA",)


# --- properties against a brute-force reading of the precedence ---------------------------------

_selector = st.one_of(
    st.sampled_from(CODES),
    st.sampled_from(FAMILIES),
    st.just("ALL"),
    st.sampled_from(sorted({c[:-1] for c in CODES} | {c[:-2] for c in CODES})),
)


def _oracle(code: str, select: tuple[str, ...], ignore: tuple[str, ...]) -> bool:
    def spec(s: str) -> int:
        return 0 if s == "ALL" else len(s)

    def match(s: str) -> bool:
        return s == "ALL" or code.startswith(s)

    sel = [spec(s) for s in select if match(s)] if select else [0]
    ign = [spec(s) for s in ignore if match(s)]
    if not sel:
        return False
    return not ign or max(sel) > max(ign)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    st.lists(_selector, max_size=4).map(tuple),
    st.lists(_selector, max_size=4).map(tuple),
    st.sampled_from(CODES),
)
def test_selection_matches_the_precedence_rule(select, ignore, code) -> None:
    sel = RuleSelection(select=select, ignore=ignore)
    assert sel.selects(code) == _oracle(code, select, ignore)
    kept = sel.apply(_findings([code]))
    assert len(kept) == (1 if _oracle(code, select, ignore) else 0)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.lists(_selector, max_size=3).map(tuple), st.sampled_from(CODES))
def test_a_more_specific_code_selector_always_decides(broad, code) -> None:
    broad = tuple(s for s in broad if s == "ALL" or len(s) < len(code))
    assert RuleSelection(select=(code,), ignore=(*broad, family_of(code))).selects(code)
    assert not RuleSelection(select=(*broad, family_of(code)), ignore=(code,)).selects(code)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    st.lists(_selector, max_size=3).map(tuple),
    st.lists(_selector, max_size=3).map(tuple),
    st.dictionaries(_selector, st.sampled_from(list(Severity)), max_size=3),
)
def test_config_round_trip(select, ignore, severity) -> None:
    sel = RuleSelection(select=select, ignore=ignore, severity=severity)
    again = RuleSelection.from_config(sel.to_mapping())
    assert again == sel
    findings = _findings(CODES[::7])
    assert [f.to_json() for f in again.apply(findings)] == [
        f.to_json() for f in sel.apply(findings)
    ]


def _finding(code: str) -> Finding:
    return next(iter(_findings([code])))


# --- exl3tool.toml ------------------------------------------------------------------------------


def test_gate_config_reads_the_selection(tmp_path: Path) -> None:
    cfg = tmp_path / "exl3tool.toml"
    cfg.write_text(
        'select = ["R7", "CA"]\nignore = ["R7023"]\n\n[severity]\nCA001 = "warning"\n'
        '\n[[artifacts]]\npath = "x"\n'
    )
    findings = Findings()
    config = load_config(cfg, findings)
    assert not findings
    assert config.rules == RuleSelection(("R7", "CA"), ("R7023",), {"CA001": Severity.WARNING})
    assert config.rules.apply_one(_finding("CA001")).level is Severity.WARNING


def test_gate_config_without_selection_selects_everything(tmp_path: Path) -> None:
    config = from_mapping({"artifacts": []}, root=tmp_path, source=None, findings=Findings())
    assert config.rules.is_default


def test_gate_config_unknown_code_is_a_usage_error(tmp_path: Path) -> None:
    cfg = tmp_path / "exl3tool.toml"
    cfg.write_text('ignore = ["ZZ001"]\n')
    with pytest.raises(UsageError, match="ZZ001"):
        load_config(cfg, Findings())


@pytest.mark.parametrize(
    "data",
    [{"select": "R7"}, {"severity": {"CA001": "fatal"}}, {"ignore": [1]}, {"select": ["R7-"]}],
)
def test_gate_config_bad_shapes_are_schema_findings(tmp_path: Path, data: dict) -> None:
    findings = Findings()
    from_mapping(data, root=tmp_path, source=None, findings=findings)
    assert findings.codes() == {"GT001"}
