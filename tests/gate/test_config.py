"""exl3tool.toml / [tool.exl3tool]: loading, schema findings (GT001), usage errors."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exl3tool.actions.gate.config import discover, from_mapping, load_config
from exl3tool.io.schemas import schema
from exl3tool.rules.errors import InputError, UsageError
from exl3tool.rules.registry import Findings

GOOD = """
schema = "exl3tool-config/1"
hash = false
tp = [2, 4]
verify_swap = [2]
threads = 2

[[artifacts]]
name = "base"
path = "models/base"
role = "base"

[[artifacts]]
path = "models/cart"
base = "base"
identity = "ids/cart.json"
verify_swap = true
"""


def test_schema_is_valid_draft_2020_12() -> None:
    jsonschema.Draft202012Validator.check_schema(schema("exl3tool-config-1.schema.json"))


def test_loads_exl3tool_toml(tmp_path: Path) -> None:
    (tmp_path / "exl3tool.toml").write_text(GOOD)
    findings = Findings()
    cfg = load_config(tmp_path / "exl3tool.toml", findings)
    assert not findings
    assert (cfg.hash, cfg.tp, cfg.verify_swap, cfg.threads) == (False, (2, 4), (2,), 2)
    base, cart = cfg.artifacts
    assert (base.label, base.role) == ("base", "base")
    assert (cart.label, cart.base, cart.verify_swap, cart.tp) == ("models/cart", "base", True, None)
    assert cfg.resolve(cart.path) == tmp_path.resolve() / "models/cart"


def test_loads_tool_table_of_pyproject(tmp_path: Path) -> None:
    body = "\n".join(
        line.replace("[[artifacts]]", "[[tool.exl3tool.artifacts]]") for line in GOOD.splitlines()
    )
    head, _, rest = body.partition("[[tool")
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[tool.exl3tool]\n' + head + "[[tool" + rest
    )
    findings = Findings()
    cfg = load_config(tmp_path / "pyproject.toml", findings)
    assert not findings and len(cfg.artifacts) == 2 and cfg.tp == (2, 4)
    assert discover(tmp_path) == tmp_path / "pyproject.toml"


def test_discover_prefers_exl3tool_toml(tmp_path: Path) -> None:
    assert discover(tmp_path) is None
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    assert discover(tmp_path) is None  # no [tool.exl3tool]
    (tmp_path / "exl3tool.toml").write_text("")
    assert discover(tmp_path) == tmp_path / "exl3tool.toml"


@pytest.mark.parametrize(
    ("text", "pointer"),
    [
        ("hsah = true", "/"),
        ('tp = ["2"]', "/tp/0"),
        ("tp = [0]", "/tp/0"),
        ("tp = [2, 2]", "/tp"),
        ("verify_swap = []", "/verify_swap"),
        ("strict = 1", "/strict"),
        ('[[artifacts]]\nname = "a"', "/artifacts/0"),
        ('[[artifacts]]\npath = "a"\nrole = "model"', "/artifacts/0/role"),
        ('[[artifacts]]\npath = "a"\nkind = "gguf"', "/artifacts/0/kind"),
        ('[[artifacts]]\npath = "a"\nrole = "base"\nbase = "b"', "/artifacts/0/role"),
        ('[[artifacts]]\npath = "a"\nname = "../x"', "/artifacts/0/name"),
        ('[[artifacts]]\npath = "a"\nname = "x"\n[[artifacts]]\npath = "b"\nname = "x"',
         "/artifacts/1/name"),
    ],
)  # fmt: skip
def test_schema_violations_are_gt001_findings(tmp_path: Path, text: str, pointer: str) -> None:
    (tmp_path / "exl3tool.toml").write_text(text)
    findings = Findings()
    load_config(tmp_path / "exl3tool.toml", findings)
    assert findings.codes() == {"GT001"}
    assert pointer in {f.location.pointer for f in findings}
    assert all(f.location.file == str(tmp_path / "exl3tool.toml") for f in findings)


@pytest.mark.parametrize("body", [b"tp = [2", b"a = 1\na = 2", b"\xff\xfe"])
def test_malformed_toml_is_a_usage_error(tmp_path: Path, body: bytes) -> None:
    (tmp_path / "exl3tool.toml").write_bytes(body)
    with pytest.raises(UsageError, match="not valid TOML"):
        load_config(tmp_path / "exl3tool.toml", Findings())


def test_a_missing_file_is_unreadable_input_a_missing_table_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read") as exc:  # exit 3, like identity --check
        load_config(tmp_path / "exl3tool.toml", Findings())
    assert exc.value.exit_code == 3
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    with pytest.raises(UsageError, match=r"\[tool.exl3tool\]"):
        load_config(tmp_path / "pyproject.toml", Findings())


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 2000) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                ["path", "tp", "hash", "artifacts", "base", "role", "name", "kind", "x"]
            ),
            children,
            max_size=5,
        )
    ),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(_json)
def test_any_document_gives_a_config_or_findings_never_a_crash(data: object) -> None:
    findings = Findings()
    cfg = from_mapping(data, root=Path("."), source=None, findings=findings)
    if findings:
        assert findings.codes() == {"GT001"}
    else:
        assert all(isinstance(a.path, str) for a in cfg.artifacts)


@pytest.mark.parametrize("body", ["tool = 1\n", "tool = [1, 2]\n", 'tool = "x"\n'])
def test_a_pyproject_whose_tool_is_no_table_is_no_config(tmp_path: Path, body: str) -> None:
    """`tool` that is not a table holds no [tool.exl3tool] (it was a TypeError traceback)."""
    (tmp_path / "pyproject.toml").write_text(body)
    assert discover(tmp_path) is None
    with pytest.raises(UsageError, match=r"\[tool.exl3tool\]"):
        load_config(tmp_path / "pyproject.toml", Findings())
