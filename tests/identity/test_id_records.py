"""identity/compare at record scale: the C-level shortcuts say what the per-name paths say."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exl3tool.identity import compare
from exl3tool.identity.fast import Identity, TensorDigest, fold
from exl3tool.rules.registry import Findings


def _hex(i: int) -> str:
    return hashlib.sha256(str(i).encode()).hexdigest()


_VALUES = st.one_of(
    st.integers(0, 50).map(_hex),
    st.text("0123456789abcdefABCDEF g\u00e9", min_size=63, max_size=65),
    st.integers(),
    st.none(),
    st.just(_hex(1).upper()),
    st.just(_hex(2)[:-1] + "\u0660"),
)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.dictionaries(st.text(max_size=5), _VALUES, max_size=6) | st.lists(st.integers()))
def test_hex_map_is_the_per_value_test(value: object) -> None:
    want = isinstance(value, dict) and all(compare._is_hex(d) for d in value.values())
    assert compare._hex_map(value) is want


def _type_ok(t: object) -> bool:
    return (
        type(t) is dict
        and set(t) == {"dtype", "shape"}
        and type(t["dtype"]) is str
        and type(t["shape"]) is list
        and all(type(d) is int and d >= 0 for d in t["shape"])
    )


_SHARED = {"dtype": "F16", "shape": [2, 3]}
_DIMS = st.lists(st.integers(-1, 5) | st.booleans() | st.floats(0, 1), max_size=3)
_TYPES = st.one_of(
    st.fixed_dictionaries(
        {"dtype": st.sampled_from(["F16", 1, None]), "shape": _DIMS | st.integers()}
    ),
    st.fixed_dictionaries({"dtype": st.just("I16")}, optional={"x": st.integers()}),
    st.just(_SHARED),
    st.integers(),
    st.lists(st.integers(), max_size=2),
)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.dictionaries(st.text(max_size=5), _TYPES, max_size=6) | st.lists(st.integers()))
def test_types_map_is_the_per_value_test(value: object) -> None:
    want = isinstance(value, dict) and all(_type_ok(t) for t in value.values())
    assert compare._types_map(value) is want


def _identity(n: int) -> Identity:
    ident = Identity("blake3")
    for i in range(n):
        name = f"model.layers.{i % 3}.w{i}.trellis" if i % 4 else f"model.norm{i}"
        ident.tensors[name] = TensorDigest("I16" if i % 4 else "F16", (2, i % 5, 48), _hex(i))
    ident.layers, ident.root = fold("blake3", ident.tensors)
    return ident


_EDITS = st.lists(
    st.tuples(
        st.sampled_from(["digest", "drop", "add", "dtype", "shape", "type-extra", "type-drop",
                         "type-not-dict", "types-drop-all", "reorder", "shape-float"]),
        st.integers(0, 11),
    ),
    max_size=3,
)  # fmt: skip


def _edited(record: dict, edits: list[tuple[str, int]]) -> dict:
    rec = copy.deepcopy(record)
    names = list(rec["tensors"])
    for what, i in edits:
        name = names[i % len(names)]
        t, y = rec["tensors"], rec["types"]
        if what == "digest" and name in t:
            t[name] = _hex(1000 + i)
        elif what == "drop":
            t.pop(name, None)
            y.pop(name, None)
        elif what == "add":
            t[f"extra{i}"] = _hex(i)
        elif what in ("dtype", "shape", "type-extra", "shape-float") and isinstance(
            y.get(name), dict
        ):
            key, val = {"dtype": ("dtype", "BF16"), "shape": ("shape", [9]),
                        "type-extra": ("x", 1), "shape-float": ("shape", None)}[what]  # fmt: skip
            if what == "shape-float":
                val = [float(d) for d in y[name]["shape"]]
            y[name][key] = val
        elif what == "type-drop":
            y.pop(name, None)
        elif what == "type-not-dict":
            y[name] = ["dtype", "shape"]
        elif what == "types-drop-all":
            rec["types"] = {}
        elif what == "reorder":
            rec["tensors"] = dict(reversed(list(t.items())))
    return rec


def _findings(record: dict, ident: Identity) -> list[tuple[str, str, str | None]]:
    out = Findings()
    compare.check(record, ident, out, "x")
    return sorted((f.code, f.message, f.location.tensor) for f in out)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.integers(1, 12), _EDITS)
def test_check_shortcut_gives_the_per_name_findings(n: int, edits: list) -> None:
    ident = _identity(n)
    record = _edited(json.loads(json.dumps(ident.to_json())), edits)
    with pytest.MonkeyPatch.context() as mp:
        got = _findings(record, ident)
        mp.setattr(compare, "_same_tensors", lambda *_a: False)
        assert got == _findings(record, ident)
    same = compare._same_tensors(record["tensors"], record["types"], ident)
    if same:  # taken only where the per-name path has nothing to say of any tensor
        assert not [f for f in got if f[2] is not None]
    if not edits:
        assert same and got == []


def test_equal_records_diff_to_nothing_and_differences_are_found() -> None:
    a = json.loads(json.dumps(_identity(10).to_json()))
    d = compare.diff(a, copy.deepcopy(a))
    assert d.identical and not (d.tensors_changed or d.tensors_only_a or d.types_changed)
    b = copy.deepcopy(a)
    name = next(n for n in b["types"] if n.endswith(".trellis"))
    b["types"][name]["shape"] = [2, 1, 64]
    d = compare.diff(a, b)
    assert d.types_changed and d.k_changed and not d.tensors_changed


def test_a_record_edited_by_hand_is_not_identical() -> None:
    """A tensor digest changed and the root kept: diff names the tensor and exits 1."""
    a = json.loads(json.dumps(_identity(6).to_json()))
    b = copy.deepcopy(a)
    name = next(iter(b["tensors"]))
    b["tensors"][name] = _hex(99)
    d = compare.diff(a, b)
    assert d.roots[0] == d.roots[1] and d.tensors_changed == [name]
    assert not d.identical
    c = copy.deepcopy(a)
    c["types"][name]["dtype"] = "BF16"
    assert not compare.diff(a, c).identical
