"""Properties of the R7 block check and the hybrid_tr3_tail model and check: any JSON never
raises, and a value the document forbids is an error. The predicates are typed from
docs/formats/r7.md §2.1 and §7.1, not taken from the code under test."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from exl3tool.checks.payload import FiniteCheck, RandomAccessReader, Scan
from exl3tool.checks.r7_block import BLOCK_SCHEMA, check_block, surely_valid
from exl3tool.checks.rank_sliced import TENSOR_SCHEMA, TailContext, check_tail
from exl3tool.formats.checkpoint import Checkpoint
from exl3tool.formats.experts import ExpertTable
from exl3tool.formats.tail import parse_tail
from exl3tool.io.schemas import schema, schema_errors
from exl3tool.rules import r7
from exl3tool.rules.registry import Findings

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-3, 80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=10,
)
# near misses of the list-valued fields: short lists of small ints, bools and floats
NEAR = st.lists(st.integers(-2, 6) | st.booleans() | st.sampled_from([3.0, 4.5]), max_size=3)
VALUES = JSON | NEAR
GOOD_BLOCK = {
    "schema": "r7-complete-v2-checkpoint-v1",
    "codebook": "mcg",
    "bits": "mixed_tensor",
    "moe_layers": [1, 2],
    "k_values": [3, 4, 5],
}
GOOD_TAIL = {
    "format": "exl3-trellis",
    "bits": 4.0,
    "codebook": "mcg",
    "experts_per_layer": 4,
    "moe_layers": [3, 3],
    "tensor_schema": "model.layers.{L}.mlp.experts.{E}.{proj}.rank{r}.{trellis|suh|svh|mcg}",
    "tp": 1,
}


def _json_int(v: object) -> bool:
    return type(v) is int  # docs/formats/r7.md §2.1: true/false and 3.0 are not JSON integers


def _int_reading(v: object) -> int | None:
    """The tail's int() reading (Exl3Config._configure_rank_sliced), where it takes `v`
    unchanged: a JSON integer, an integral float, a string int() reads; not a bool or 3.5."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return int(v) if v.is_integer() else None
    if isinstance(v, str) and len(v.strip()) <= 64:  # no K, layer or count is longer
        try:
            return int(v)
        except ValueError:
            return None
    return None


def _float_reading(v: object) -> float | None:
    """The tail's float(bits) reading (not a bool: K 1 or 0 is nobody's bitrate)."""
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        return None
    if isinstance(v, str) and len(v.strip()) > 64:
        return None
    try:
        return float(v)
    except (ValueError, OverflowError):
        return None


def _tail_layers_legal(v: object) -> bool:
    if not isinstance(v, list) or len(v) != 2:
        return False
    first, last = map(_int_reading, v)
    return first is not None and last is not None and 0 <= first <= last


def _block_legal(key: str, v: object) -> bool:
    """docs/formats/r7.md §2.1: the values the five validated fields may hold."""
    if key == "moe_layers":
        return (
            isinstance(v, list)
            and len(v) == 2
            and all(_json_int(x) and x >= 0 for x in v)
            and v[1] >= v[0]
        )
    if key == "k_values":
        return (
            isinstance(v, list) and len(v) > 0 and all(_json_int(k) and k in (3, 4, 5) for k in v)
        )
    return v == GOOD_BLOCK[key] and type(v) is str


def test_the_good_block_and_tail_are_clean() -> None:
    f = Findings()
    block = check_block(dict(GOOD_BLOCK), "q.json", "/r7_routed_experts", f)
    assert block is not None and not list(f)
    assert (block.first, block.last, block.k_values) == (1, 2, frozenset({3, 4, 5}))
    # no tensors: every rank slice is missing (RS_MISSING); the fields themselves are clean
    assert {f.code for f in _tail_findings(GOOD_TAIL).errors()} == {r7.RS_MISSING.code}


@settings(max_examples=300, deadline=None, derandomize=True)
@given(key=st.sampled_from(sorted(GOOD_BLOCK)), value=VALUES)
def test_block_field_replaced_by_any_json(key: str, value: object) -> None:
    f = Findings()
    block = check_block({**GOOD_BLOCK, key: value}, "q.json", "/r7_routed_experts", f)
    if _block_legal(key, value):
        assert not f.has_errors(), (key, value)
    else:
        assert f.has_errors(), (key, value)
        assert all(x.location.pointer.startswith("/r7_routed_experts") for x in f)
    assert (block is None) == (key == "moe_layers" and not _block_legal(key, value))


@settings(max_examples=100, deadline=None, derandomize=True)
@given(value=JSON)
def test_block_that_is_not_a_valid_object(value: object) -> None:
    f = Findings()
    block = check_block(value, "q.json", "/r7_routed_experts", f)
    assert f.has_errors()  # any random value lacks a required field or is no object
    assert block is None or _block_legal("moe_layers", value.get("moe_layers"))


OPTIONAL = {  # the block's optional fields, each with a value of its schema type
    "marker": "CODEX_ROUND7",
    "feature_version": 1,
    "tp_slice_quantum": 128,
    "bit_map_manifests": ["a.json"],
    "codebook_overrides": {},
    "unknown_field": [1.5],
}


@settings(max_examples=600, deadline=None, derandomize=True)
@given(
    key=st.sampled_from(sorted(GOOD_BLOCK) + sorted(OPTIONAL) + ["tp_slice_quantum"]),
    value=VALUES | st.sampled_from([0, 1, 3, 4, 5, 128, "mcg", True, 3.0, [3], [0, 0], [1, 2, 3]]),
    optional=st.booleans(),
    drop=st.booleans(),
)
def test_surely_valid_block_has_no_schema_error(
    key: str, value: object, optional: bool, drop: bool
) -> None:
    """The jsonschema-free test never calls a block valid that the schema faults (so the
    findings are the same with or without it), and it does call the usual blocks valid."""
    block: dict = {**GOOD_BLOCK, **(OPTIONAL if optional else {})}
    if drop:
        block.pop(key, None)
    else:
        block[key] = value
    if surely_valid(schema(BLOCK_SCHEMA), block):
        assert schema_errors(BLOCK_SCHEMA, block) == []


@settings(max_examples=200, deadline=None, derandomize=True)
@given(value=JSON)
def test_surely_valid_of_any_json(value: object) -> None:
    if surely_valid(schema(BLOCK_SCHEMA), value):
        assert schema_errors(BLOCK_SCHEMA, value) == []


def test_usual_blocks_are_surely_valid() -> None:
    sch = schema(BLOCK_SCHEMA)
    assert surely_valid(sch, dict(GOOD_BLOCK))
    assert surely_valid(sch, {**GOOD_BLOCK, **OPTIONAL})
    assert not surely_valid(sch, {**GOOD_BLOCK, "moe_layers": [1.0, 2]})  # jsonschema decides
    assert not surely_valid({**sch, "unknownKeyword": 1}, dict(GOOD_BLOCK))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(value=JSON)
def test_tail_model_of_any_json(value: object) -> None:
    tail = parse_tail(value)
    if not isinstance(value, dict):
        assert tail is None
        return
    assert tail is not None and tail.raw is value
    if tail.k is not None:
        assert type(tail.k) is int and tail.k == _float_reading(value["bits"])
    assert (tail.moe_layers is not None) == _tail_layers_legal(value.get("moe_layers"))
    for key in ("tp", "experts_per_layer"):
        n = _int_reading(value.get(key))
        assert getattr(tail, key) == (n if n is not None and n > 0 else None)


def _tail_findings(tail: object) -> Findings:
    ckpt = Checkpoint(root=Path("/nonexistent"))
    ctx = TailContext("config.json", "/hybrid_tr3_tail", 128, 256, 4)
    findings = Findings()
    with RandomAccessReader() as reader:
        check_tail(ckpt, tail, ExpertTable(), ctx, Scan(findings, reader, FiniteCheck()))
    return findings


def _tail_legal(key: str, v: object) -> bool:
    """docs/formats/r7.md §7.1 for the model above (4 experts, no runtime TP); range and count must match it."""
    if key == "bits":
        x = _float_reading(v)
        return v == "mixed" or (x is not None and x > 0)
    if key in ("format", "codebook", "tensor_schema"):
        return v == GOOD_TAIL[key]
    if key == "experts_per_layer":
        return _int_reading(v) == 4
    if key == "tp":
        n = _int_reading(v)
        return n is not None and n >= 1
    return _tail_layers_legal(v)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(key=st.sampled_from(sorted(GOOD_TAIL)), value=VALUES)
def test_tail_field_replaced_by_any_json(key: str, value: object) -> None:
    findings = _tail_findings({**GOOD_TAIL, key: value})
    field_errors = [f for f in findings.errors() if f.code != r7.RS_MISSING.code]
    if not _tail_legal(key, value):
        assert field_errors, (key, value)  # beyond the slices missing from the empty table
        assert all(f.location.file == "config.json" for f in field_errors)


def test_tail_schema_constant_is_the_documents() -> None:
    assert GOOD_TAIL["tensor_schema"] == TENSOR_SCHEMA
    assert _tail_findings([1, 2]).codes() == {r7.RS_FIELD.code}
