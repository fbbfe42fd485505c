"""report/identity: the streamed identity record is json.dumps(indent=2) of it, byte for byte."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from exl3tool.identity.compat import CompatIdentity
from exl3tool.identity.fast import Identity, TensorDigest
from exl3tool.report.identity import identity_json_chunks

_NAMES = st.text(
    st.characters(codec="utf-8", exclude_categories=["Cs"]) | st.sampled_from('"\\\n\x00/.~'),
    max_size=12,
)
_DIGEST = st.text("0123456789abcdef", min_size=1, max_size=8)
_TYPES = st.tuples(st.sampled_from(["F16", "I16", "U8", "BF16"]), st.lists(st.integers(0, 2**40), max_size=3).map(tuple))  # fmt: skip


@st.composite
def _identities(draw: st.DrawFn) -> Identity:
    ident = Identity(draw(st.sampled_from(["blake3", "sha256"])))
    for name in draw(st.lists(_NAMES, max_size=30, unique=True)):
        dtype, shape = draw(_TYPES)
        ident.tensors[name] = TensorDigest(dtype, shape, draw(_DIGEST))
    ident.layers = draw(st.dictionaries(st.sampled_from(["0", "3", "other"]), _DIGEST))
    ident.root = draw(_DIGEST)
    ident.selection = draw(st.none() | st.sampled_from(["1-3", "other"]))
    if draw(st.booleans()):
        ident.compatibility = CompatIdentity(4, {"0": draw(_DIGEST)}, draw(_DIGEST))
    return ident


@settings(max_examples=300, deadline=None, derandomize=True)
@given(_identities(), st.integers(1, 5))
def test_the_pieces_are_the_indented_record(ident: Identity, lines: int) -> None:
    got = "".join(identity_json_chunks(ident, lines=lines))
    assert got == json.dumps(ident.to_json(), indent=2) + "\n"
    assert json.loads(got) == ident.to_json()


def test_pieces_are_bounded() -> None:
    ident = Identity("blake3", root="r")
    for i in range(100):
        ident.tensors[f"t{i}"] = TensorDigest("F16", (i, 2), f"{i:064x}")
    pieces = list(identity_json_chunks(ident, lines=10))
    assert len(pieces) >= 20 and max(map(len, pieces)) < 2000
    assert "".join(pieces) == json.dumps(ident.to_json(), indent=2) + "\n"
