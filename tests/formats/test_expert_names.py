"""formats/names: ExpertPrefixes answers what parse_expert answers, name by name."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from exl3tool.formats.names import EXPERT_MARK, ExpertPrefixes, has_expert_mark, parse_expert

_PARTS = st.sampled_from(
    ["model", "layers", "mlp", "experts", "0", "3", "07", "12", "gate_proj", "up_proj",
     "down_proj", "rank0", "rank01", "rank", "trellis", "suh", "svh", "mcg", "mul1", "bias",
     "r7_shared", "x-y", "", "trellis\n", "suh\n", "\n", "é"]
)  # fmt: skip


def _reference(name: str) -> tuple[int, int | None, str] | None:
    en = parse_expert(name)
    return None if en is None else (en.layer, en.rank, en.field)


_FIELDS = st.sampled_from(["trellis", "suh", "svh", "mcg", "mul1", "bias", "x-y", "", "é",
                           "trellis\n", "suh\n", "rank3", "rank01"])  # fmt: skip


@st.composite
def _names(draw: st.DrawFn) -> str:
    head = "model.layers.{}.mlp.experts.{}.{}".format(
        draw(st.sampled_from(["0", "3", "12", "03", "x"])),
        draw(st.sampled_from(["0", "5", "255", "05", "r7_shared"])),
        draw(st.sampled_from(["gate_proj", "up_proj", "down_proj", "o_proj"])),
    )
    shape = draw(st.sampled_from(["field", "field", "rank", "rank", "bare", "two", "noise"]))
    if shape == "noise":
        return ".".join(draw(st.lists(_PARTS, max_size=9)))
    rank = draw(st.sampled_from(["rank0", "rank1", "rank01", "rank", "rankx"]))
    tail = {
        "field": [draw(_FIELDS)],
        "rank": [rank, draw(_FIELDS)],
        "bare": [],
        "two": [draw(_FIELDS), draw(_FIELDS)],
    }[shape]
    return ".".join([head, *tail])


@settings(max_examples=500, deadline=None, derandomize=True)
@given(st.lists(_names(), min_size=1, max_size=12))
def test_expert_prefixes_agree_with_parse_expert(names: list[str]) -> None:
    cache = ExpertPrefixes()  # shared across the names: answers from its cache must agree too
    for name in names + names:
        assert cache.parse(name) == _reference(name), name
        en = parse_expert(name)
        assert cache.parts(name) == (en and (en.layer, en.expert, en.proj, en.field)), name
        if en is not None:  # what `compat.prepare` relies on to skip other names unparsed
            assert has_expert_mark(name) and EXPERT_MARK in name, name


def test_expert_prefixes_examples() -> None:
    cache = ExpertPrefixes()
    assert cache.parse("model.layers.3.mlp.experts.7.up_proj.trellis") == (3, None, "trellis")
    assert cache.parse("model.layers.3.mlp.experts.7.up_proj.rank2.suh") == (3, 2, "suh")
    assert cache.parse("model.layers.3.mlp.experts.7.up_proj.rank2") == (3, None, "rank2")
    assert cache.parse("model.layers.3.mlp.experts.7.up_proj.svh\n") == (3, None, "svh")
    assert cache.parse("model.layers.03.mlp.experts.7.up_proj.svh") is None


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(_PARTS, max_size=10), st.lists(_PARTS, max_size=4))
def test_no_name_without_the_mark_parses(head: list[str], tail: list[str]) -> None:
    """A name without `.mlp.experts.` (here: the mark's dots or words dropped or changed) is
    never an expert's, however the rest reads."""
    for name in (".".join(head + tail), ".".join(["model", "layers", "3", *tail])):
        if not has_expert_mark(name):
            assert parse_expert(name) is None, name
            assert ExpertPrefixes().parts(name) is None, name
    near = "model.layers.3.mlp_experts.7.up_proj.trellis"
    assert not has_expert_mark(near) and parse_expert(near) is None
