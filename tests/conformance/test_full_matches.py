"""Strings the runtime matches whole (`re.fullmatch`): a digest, a label or a layer key with a
trailing newline is refused there, so it is here too. JSON Schema reads `$` as ECMA-262 does
(the end of the string); Python's `$` also matches before a final newline."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from checks_fixtures import edit_json
from conformance_paths import EXAMPLES
from hypothesis import given
from hypothesis import strategies as st

from exl3tool.actions.validate import validate_path
from exl3tool.checks.digests import sha_ok
from exl3tool.checks.options import ValidateOptions
from exl3tool.io.schemas import ecma_regex

HEX = "0123456789abcdef"


def codes(path: Path) -> list[str]:
    _ref, findings = validate_path(path, ValidateOptions())
    return [f.code for f in findings]


def _cartridge(tmp_path: Path, edit) -> Path:
    root = tmp_path / "cart"
    shutil.copytree(EXAMPLES / "cartridge-k3k4", root)
    edit_json(root / "adapter_config.json", edit)
    return root


@pytest.mark.parametrize(
    ("field", "code"),
    [("signer_pubkey", "CA016"), ("recipe_sha256", "CA016")],
)
@pytest.mark.parametrize("tail", ["\n", ""])
def test_campaign_digest_with_a_trailing_newline(
    tmp_path: Path, field: str, code: str, tail: str
) -> None:
    root = _cartridge(
        tmp_path, lambda m: m["campaign"].update({field: m["campaign"][field] + tail})
    )
    assert (code in codes(root)) is bool(tail)


@pytest.mark.parametrize("tail", ["\n", ""])
def test_assembly_label_with_a_trailing_newline(tmp_path: Path, tail: str) -> None:
    root = _cartridge(tmp_path, lambda m: m.update(assembly=m["assembly"] + tail))
    assert ("CA013" in codes(root)) is bool(tail)


def test_ecma_dollar_is_the_end_of_the_string() -> None:
    digest = ecma_regex("^[0-9a-f]{64}$")
    assert digest.search("a" * 64)
    assert not digest.search("a" * 64 + "\n")
    # `$` inside a class or escaped is a character, not an anchor
    assert ecma_regex("^[$]x$").search("$x") and not ecma_regex("^[$]x$").search("$x\n")
    assert ecma_regex(r"^a\$$").search("a$")
    assert ecma_regex("^[^]]$").search("a") and not ecma_regex("^[^]]$").search("]")
    # the path pattern of the adapter schema
    path = ecma_regex(r"^(?!/)(?!.*(?:^|/)\.\.(?:/|$)).+$")
    assert path.search("a/b.safetensors") and not path.search("a/b.safetensors\n")
    assert not path.search("a/..") and not path.search("/a")


@given(st.text(alphabet=HEX, min_size=64, max_size=64), st.sampled_from(["", "\n", " ", "\r\n"]))
def test_sha256_values_are_matched_whole(digest: str, tail: str) -> None:
    assert sha_ok(digest + tail) is (tail == "")
