"""The index read by its weight_map's groups (io/index_scan, `index_scan` of native/header_scan.c)
against the strict parse: what the scan gives is what the parse gives, it takes the plain forms
writers produce, and the loader finds the same with and without it."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exl3tool.formats import checkpoint
from exl3tool.io import index_scan
from exl3tool.io.strict_json import loads
from exl3tool.rules.registry import Findings
from exl3tool.synth.exl3 import build_exl3

needs_scan = pytest.mark.skipif(
    index_scan._native_index_scan is None or not index_scan._KEYED,
    reason="not built (tests/io/test_header_scan_native.py says whether that is a fault), "
    "EXL3TOOL_PURE_SCAN set, or PYTHONHASHSEED fixed",
)


def _pairs(data: bytes) -> tuple[list[tuple[str, str]], object] | None:
    """Every member of the weight_map (repeats kept) and the metadata, by the standard parser;
    None when the text is not JSON of that shape."""
    built: dict[int, tuple[dict, list]] = {}  # id of each object -> (it, its members)

    def hook(pairs: list) -> dict:
        obj = dict(pairs)
        built[id(obj)] = (obj, pairs)
        return obj

    try:
        doc = json.loads(data, object_pairs_hook=hook)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("weight_map"), dict):
        return None
    return list(built[id(doc["weight_map"])][1]), doc.get("metadata", index_scan._ABSENT)


def _groups(pairs: list[tuple[str, str]]) -> dict[str, tuple[int, int]]:
    out: dict[str, list[int]] = {}
    for name, label in pairs:
        g = out.setdefault(label, [0, 0])
        g[0] += 1
        g[1] = (g[1] + hash(name)) % (1 << 64)
    return {k: (c, s) for k, (c, s) in out.items()}


def _agrees(data: bytes) -> index_scan.IndexScan | None:
    """The scan of `data`, checked against the parse wherever it gives a value."""
    got = index_scan.scan_index(data)
    if got is None:
        return None
    parsed = _pairs(data)
    assert parsed is not None, data[:200]
    pairs, metadata = parsed
    _, issues = loads(data)
    # a repeated weight_map name is the loader's to find (its groups cannot match a header)
    assert all(i.kind == "duplicate" and i.pointer.startswith("/weight_map/") for i in issues)
    assert got.entries == len(pairs)
    assert got.groups == _groups(pairs)
    assert got.metadata == metadata or (got.metadata is metadata)
    return got


_NAME = st.text(st.sampled_from([*"abz.09_-/ :", '"', "\\", "\u00e9", "\n", "\x7f"]), max_size=8)
_META = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | _NAME,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_NAME, inner, max_size=3),
    max_leaves=6,
)


@needs_scan
@settings(max_examples=500, deadline=None)
@given(
    pairs=st.lists(st.tuples(_NAME, st.sampled_from(["a.safetensors", "b", "c/d"])), max_size=8),
    metadata=st.one_of(st.just(index_scan._ABSENT), _META),
    indent=st.sampled_from([None, 0, 2, "\t"]),
    ascii_only=st.booleans(),
    meta_first=st.booleans(),
    extra=st.sampled_from([None, "other", "metadata", "weight_map"]),
)
def test_what_the_scan_gives_is_what_the_parse_gives(
    pairs: list, metadata: object, indent: object, ascii_only: bool, meta_first: bool, extra: object
) -> None:
    wm = "{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in pairs) + "}"
    members = [f'"weight_map": {wm}']
    if metadata is not index_scan._ABSENT:
        meta = json.dumps(metadata, indent=indent, ensure_ascii=ascii_only)  # NaN, huge ints too
        members.insert(0 if meta_first else 1, f'"metadata": {meta}')
    if extra is not None:
        members.append(f'"{extra}": {{}}')
    sep = "," if indent is None else ",\n"
    data = ("{" + sep.join(members) + "}").encode()
    got = _agrees(data)
    plain = all(c.isascii() and c.isprintable() and c not in '"\\' for k, v in pairs for c in k + v)
    clean = metadata is index_scan._ABSENT or not loads(meta.encode())[1]
    if plain and clean and extra is None and ascii_only:
        assert got is not None  # the plain form is always taken


@needs_scan
@settings(max_examples=800, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), edits=st.integers(1, 4))
def test_an_edited_index_is_taken_only_as_the_parse_reads_it(seed: int, edits: int) -> None:
    """Bytes inserted, dropped or replaced anywhere in a plain index: the scan declines or
    agrees with the parse."""
    rng = random.Random(seed)
    doc = {
        "metadata": {"total_size": 1234, "format": "pt"},
        "weight_map": {f"model.layers.{i}.w": f"m-{i % 3}.safetensors" for i in range(6)},
    }
    data = bytearray(json.dumps(doc, indent=rng.choice([None, 2])).encode())
    for _ in range(edits):
        at = rng.randrange(len(data) + 1)
        byte = rng.choice(b'{}[]",:\\ \n\t0a.\x00\xc3\xa9')
        what = rng.randrange(3)
        if what == 0:
            data[at:at] = bytes([byte])
        elif what == 1:
            del data[at : at + 1]
        else:
            data[at : at + 1] = bytes([byte])
    _agrees(bytes(data))


# ---- the loader, with and without the scan --------------------------------------------------


def _state(root: Path, scan: object) -> tuple:
    real = checkpoint.scan_index
    checkpoint.scan_index = scan
    try:
        found = Findings()
        ckpt = checkpoint.load_checkpoint(root, found)
    finally:
        checkpoint.scan_index = real
    where = [(f.code, f.message, f.location) for f in found]
    sets = (ckpt.rejected_files, ckpt.damaged_shards, ckpt.rejected_tensors)
    return where, list(ckpt.tensors), list(ckpt.shards), *map(sorted, sets)


def _edit_index(root: Path, how: str) -> None:
    path = root / checkpoint.INDEX_NAME
    doc = json.loads(path.read_text())
    wm = doc["weight_map"]
    names, labels = list(wm), sorted(set(wm.values()))
    if how == "drop":
        del wm[names[0]]
    elif how == "add":
        wm["model.extra.w"] = labels[0]
    elif how == "move":
        wm[names[0]] = next(x for x in labels if x != wm[names[0]])
    elif how == "absent-shard":
        wm[names[0]] = "model-99999-of-99999.safetensors"
    elif how == "unreferenced":
        for name in [n for n in names if wm[n] == labels[-1]]:
            del wm[name]
    elif how == "total-size":
        doc["metadata"]["total_size"] += 1
    elif how == "repeat":
        text = json.dumps(doc, indent=2)
        first = f'"{names[0]}": "{wm[names[0]]}"'
        path.write_text(text.replace(first, f"{first},\n    {first}", 1))
        return
    elif how == "repeat-elsewhere":
        text = json.dumps(doc, indent=2)
        first = f'"{names[0]}": "{wm[names[0]]}"'
        other = next(x for x in labels if x != wm[names[0]])
        path.write_text(text.replace(first, f'"{names[0]}": "{other}",\n    {first}', 1))
        return
    elif how == "escaped":
        path.write_text(json.dumps(doc, indent=2).replace(".", "\\u002e", 1))
        return
    path.write_text(json.dumps(doc, indent=2))


EDITS = [
    "none",
    "drop",
    "add",
    "move",
    "absent-shard",
    "unreferenced",
    "total-size",
    "repeat",
    "repeat-elsewhere",
    "escaped",
]


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = build_exl3(tmp_path_factory.mktemp("ck") / "m", shards=3)
    assert (
        len(set(json.loads((root / checkpoint.INDEX_NAME).read_text())["weight_map"].values())) > 1
    )
    return root


@needs_scan
@pytest.mark.parametrize("how", EDITS)
def test_the_loader_finds_the_same_with_and_without_the_scan(
    sharded: Path, tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "m"
    shutil.copytree(sharded, root)
    _edit_index(root, how)
    took: list[bool] = []
    real = checkpoint._load_scanned

    def spy(*args: object) -> bool:
        took.append(real(*args))  # type: ignore[arg-type]
        return took[-1]

    monkeypatch.setattr(checkpoint, "_load_scanned", spy)
    scanned = _state(root, index_scan.scan_index)
    parsed = _state(root, lambda data: None)
    assert scanned == parsed
    # only a repeated name (a JSON issue) loads it all again; an escape is not scanned at all
    assert took == ([] if how == "escaped" else [False] if how.startswith("repeat") else [True])
    if how == "none":
        assert not scanned[0]


@needs_scan
@pytest.mark.parametrize("how", ["none", "total-size", "drop", "unreferenced"])
def test_only_an_index_the_shards_match_goes_without_its_weight_map(
    sharded: Path, tmp_path: Path, how: str
) -> None:
    """Matched by its groups, the weight_map is never built; a mismatch parses it."""
    root = tmp_path / "m"
    shutil.copytree(sharded, root)
    _edit_index(root, how)
    ckpt = checkpoint.load_checkpoint(root, Findings())
    matched = how in ("none", "total-size")
    assert ckpt.weight_map_matched is matched
    assert ckpt.index is not None and ("weight_map" in ckpt.index) is not matched


def _twin(name: str) -> str:
    """A name of two-byte characters whose stored bytes are those of the ASCII `name` (of even
    length): CPython's str hash is the same under every key."""
    raw = name.encode()
    return "".join(chr(raw[i] | raw[i + 1] << 8) for i in range(0, len(raw), 2))


def _raw_shard(path: Path, names: list[str]) -> None:
    header = {
        n: {"dtype": "F16", "shape": [1], "data_offsets": [2 * i, 2 * i + 2]}
        for i, n in enumerate(names)
    }
    text = json.dumps(header, ensure_ascii=False).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + bytes(2 * len(names)))


@pytest.mark.parametrize(
    "index, shards",
    [
        ('{"weight_map": {"ab": "a.safetensors"}}', {"a.safetensors": ["\u6261"]}),
        (
            '{"weight_map": {"ab": "a.safetensors", "ab": "a.safetensors"}}',
            {"a.safetensors": ["ab", "\u6261"]},
        ),
        (
            '{"weight_map": {"ab": "a.safetensors", "ab": "b.safetensors"}}',
            {"a.safetensors": ["ab"], "b.safetensors": ["\u6261"]},
        ),
    ],
)
def test_a_header_name_whose_hash_equals_an_index_names_under_any_key_is_no_match(
    tmp_path: Path, index: str, shards: dict[str, list[str]]
) -> None:
    """A shard name stored in two-byte characters with an ASCII index name's bytes hashes the
    same whatever the key: the groups must not take it for that name."""
    assert _twin("ab") == "\u6261" and hash("ab") == hash("\u6261")
    root = tmp_path / "m"
    root.mkdir()
    (root / checkpoint.INDEX_NAME).write_text(index)
    (root / "config.json").write_text("{}")
    for label, names in shards.items():
        _raw_shard(root / label, names)
    scanned = _state(root, index_scan.scan_index)
    assert scanned == _state(root, lambda data: None)
    assert scanned[0]  # CK004 / CK005 (and JS002 for the repeated name)


def test_the_scan_runs_under_a_random_hash_key(sharded: Path) -> None:
    """In a process whose string hash key is random (as the CLI's is, unless PYTHONHASHSEED
    fixes it) the scan is on where built, and loads the exact index by its groups."""
    code = (
        "import sys; from pathlib import Path\n"
        "from exl3tool.formats.checkpoint import load_checkpoint\n"
        "from exl3tool.io import index_scan\n"
        "from exl3tool.rules.registry import Findings\n"
        "built = index_scan._native_index_scan is not None\n"
        f"ckpt = load_checkpoint(Path({str(sharded)!r}), Findings())\n"
        "print(built, index_scan._KEYED, ckpt.weight_map_matched)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHASHSEED", "EXL3TOOL_PURE_SCAN")}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    built, keyed, matched = out.stdout.split()
    assert keyed == "True"
    assert matched == built  # where the C module is built (test_header_scan_native says so)


@needs_scan
def test_many_files_interleaved_are_grouped_like_the_parse() -> None:
    """20,000 files, their names interleaved (every member changes file): each group as the
    parse gives it, in the order the files first came."""
    pairs = [(f"t.{i}.{j}", f"f{i % 20000}") for j in range(2) for i in range(20000)]
    data = json.dumps({"weight_map": dict(pairs)}).encode()
    got = _agrees(data)
    assert got is not None and list(got.groups) == list(dict.fromkeys(v for _, v in pairs))
