"""exl3tool's logical identity: invariant to shards, names and rank slicing; sensitive to bytes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import blake3
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from identity_fixtures import expert_tensors, flip_byte, rank_slice, write_checkpoint, write_shard

from exl3tool.formats.checkpoint import load_checkpoint
from exl3tool.identity.fast import Identity, compute_identity, layer_key, parse_layers
from exl3tool.identity.logical import build_plan
from exl3tool.rules.errors import UsageError
from exl3tool.rules.registry import Findings


def ident(path: Path, **kw: object) -> Identity:
    return compute_identity(load_checkpoint(path, Findings(), need_config=False), **kw)


@pytest.fixture(scope="module")
def full() -> dict[str, np.ndarray]:
    return expert_tensors([0, 2], 2, k=3, seed=7)


def same(a: Identity, b: Identity) -> None:
    assert a.tensors == b.tensors
    assert a.layers == b.layers
    assert a.root == b.root


@pytest.mark.parametrize("algo", ["blake3", "sha256"])
def test_invariant_under_resharding(tmp_path: Path, full: dict, algo: str) -> None:
    write_checkpoint(tmp_path / "a", full, shards=1)
    rev = dict(reversed(list(full.items())))  # other order inside files, too
    write_checkpoint(tmp_path / "b", rev, shards=4, prefix="other-name")
    a, b = ident(tmp_path / "a", algo=algo), ident(tmp_path / "b", algo=algo)
    same(a, b)
    assert set(a.layers) == {"0", "2", "other"}


@pytest.mark.parametrize("world", [2, 4])
def test_invariant_under_rank_slicing(tmp_path: Path, full: dict, world: int) -> None:
    write_checkpoint(tmp_path / "full", full, shards=2)
    write_checkpoint(tmp_path / "sliced", rank_slice(full, world), shards=3)
    a, b = ident(tmp_path / "full"), ident(tmp_path / "sliced")
    assert b.problems == []
    same(a, b)
    assert a.compatibility.root == b.compatibility.root


def test_tensor_digest_is_hash_of_logical_bytes(tmp_path: Path, full: dict) -> None:
    write_checkpoint(tmp_path / "s", rank_slice(full, 2))
    name = "model.layers.2.mlp.experts.1.up_proj.trellis"
    want = {"blake3": blake3.blake3, "sha256": hashlib.sha256}
    for algo, h in want.items():
        got = ident(tmp_path / "s", algo=algo).tensors[name]
        assert got.digest == h(full[name].tobytes()).hexdigest()
        assert (got.dtype, got.shape) == ("I16", full[name].shape)


def test_header_only_changes_change_nothing(tmp_path: Path, full: dict) -> None:
    write_checkpoint(tmp_path / "a", full, shards=2)
    (tmp_path / "b").mkdir()
    with open(tmp_path / "b" / "renamed.safetensors", "wb") as fh:
        from exl3tool.io.st_writer import write_arrays

        write_arrays(fh, full, metadata={"format": "pt", "note": "other metadata"})
    same(ident(tmp_path / "a"), ident(tmp_path / "b"))


def _payload_offsets(path: Path) -> list[tuple[Path, str, int, int]]:
    ckpt = load_checkpoint(path, Findings(), need_config=False)
    return [(r.shard.path, n, *r.shard.span(n)) for n, r in ckpt.tensors.items() if r.info.nbytes]


@pytest.mark.parametrize("sliced", [False, True])
def test_one_flipped_byte_changes_one_tensor_one_layer_and_root(
    tmp_path: Path, full: dict, sliced: bool
) -> None:
    tensors = rank_slice(full, 2) if sliced else full
    rng = np.random.default_rng(3)
    spans = _payload_offsets(write_checkpoint(tmp_path / "ref", tensors, shards=2))
    ref = ident(tmp_path / "ref")
    for trial in range(6):
        d = write_checkpoint(tmp_path / f"t{trial}", tensors, shards=2)
        path, name, lo, hi = spans[rng.integers(len(spans))]
        flip_byte(d / path.name, int(rng.integers(lo, hi)))
        got = ident(d)
        changed = [n for n in ref.tensors if ref.tensors[n] != got.tensors[n]]
        layers = [k for k in ref.layers if ref.layers[k] != got.layers[k]]
        logical = name.replace(".rank0.", ".").replace(".rank1.", ".")
        if got.problems:  # a replicated copy: its ranks now disagree
            assert [p.kind for p in got.problems] == ["replica"]
            if ".rank1." in name:  # the logical tensor is rank 0's copy
                assert changed == [] and layers == []
                continue
        assert changed == [logical]
        assert layers == [layer_key(logical)]
        assert got.root != ref.root


def test_replica_mismatch_reported(tmp_path: Path, full: dict) -> None:
    t = rank_slice(full, 2)
    t["model.layers.0.mlp.experts.0.gate_proj.rank1.suh"] = np.ones(128, np.float16)
    write_checkpoint(tmp_path / "s", t)
    got = ident(tmp_path / "s")
    assert [(p.kind, p.tensor) for p in got.problems] == [
        ("replica", "model.layers.0.mlp.experts.0.gate_proj.suh")
    ]


def test_missing_and_misfit_slices(tmp_path: Path, full: dict) -> None:
    t = rank_slice(full, 2)
    del t["model.layers.0.mlp.experts.0.down_proj.rank1.trellis"]
    t["model.layers.2.mlp.experts.0.gate_proj.rank1.trellis"] = np.zeros((3, 8, 48), np.int16)
    write_checkpoint(tmp_path / "s", t)
    plan = build_plan(load_checkpoint(tmp_path / "s", Findings()))
    msgs = {p.tensor: p.message for p in plan.problems}
    assert "missing" in msgs["model.layers.0.mlp.experts.0.down_proj.trellis"]
    assert "do not fit" in msgs["model.layers.2.mlp.experts.0.gate_proj.trellis"]


def test_threads_and_algorithms(tmp_path: Path, full: dict) -> None:
    write_checkpoint(tmp_path / "a", full, shards=3)
    b1, b2 = ident(tmp_path / "a", threads=1), ident(tmp_path / "a", threads=3)
    same(b1, b2)
    s = ident(tmp_path / "a", algo="sha256")
    assert s.root != b1.root
    assert all(len(t.digest) == 64 for t in s.tensors.values())
    # sha256 tensor digests are the compatibility records' digests
    assert s.compatibility.root == b1.compatibility.root


def test_layer_selection(tmp_path: Path, full: dict) -> None:
    write_checkpoint(tmp_path / "a", full)
    whole = ident(tmp_path / "a")
    part = ident(tmp_path / "a", layers=parse_layers("2"), selection="2")
    assert set(part.layers) == {"2"} and part.layers["2"] == whole.layers["2"]
    assert part.to_json()["selection"] == "2"
    assert part.compatibility.layers == {"2": whole.compatibility.layers["2"]}


def test_parse_layers() -> None:
    assert parse_layers("3-5,7,other") == {"3", "4", "5", "7", "other"}
    for bad in ("5-3", "x", "1,,2", "-1"):
        with pytest.raises(UsageError):
            parse_layers(bad)


def test_json_matches_schema(tmp_path: Path, full: dict) -> None:
    import jsonschema

    schema = json.loads(
        (Path(__file__).parents[2] / "exl3tool/schemas/exl3tool-identity-1.schema.json").read_text()
    )
    write_checkpoint(tmp_path / "a", full)
    doc = ident(tmp_path / "a", layers=parse_layers("0,other"), selection="0,other").to_json()
    jsonschema.Draft202012Validator(schema).validate(doc)
    assert "compatibility" in doc


def test_no_compat_block_without_uniform_k(tmp_path: Path, full: dict) -> None:
    t = dict(full)
    t["model.layers.0.mlp.experts.0.up_proj.trellis"] = np.zeros((8, 16, 64), np.int16)
    write_shard(tmp_path / "m.safetensors", t)
    got = ident(tmp_path / "m.safetensors")
    assert got.compatibility is None and "compatibility" not in got.to_json()


def test_cartridge_layouts_share_one_identity(tmp_path: Path) -> None:
    from exl3tool.synth import msrt

    base = msrt.build_base(tmp_path / "base", layers=(3,), experts=2)
    full = msrt.build_adapter(tmp_path / "full", base)
    sharded = msrt.build_adapter(tmp_path / "rs", base, layout="rank-sharded", world_size=2)
    a, b = ident(full), ident(sharded)
    assert b.problems == [] and len(a.tensors) == len(b.tensors) > 0
    same(a, b)
    assert not any(".rank" in n for n in b.tensors)


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("model.layers.12.mlp.gate.weight", "12"),
        ("model.layers.007.x", "7"),
        ("model.layers.0.x", "0"),
        ("model.layers.1a.layers.3.x", "3"),
        ("model.layers.5", "other"),
        ("model.layers..x", "other"),
        ("model.layers.\u0663.x", "other"),  # a non-ASCII digit is no layer number
        ("x.layers.4.y", "4"),
        ("lm_head.weight", "other"),
    ],
)
def test_layer_key_fast_path_agrees_with_the_pattern(name: str, key: str) -> None:
    from exl3tool.formats.names import layer_of

    layer = layer_of(name)
    assert layer_key(name) == key == ("other" if layer is None else str(layer))


def test_fold_groups_runs_of_names_like_layer_key_does() -> None:
    """fold reads a layer's key once per run of names sharing "model.layers.<N>.": any order
    and any mix of names give the groups of layer_key per name."""
    import random

    from exl3tool.identity.engine import new_hasher
    from exl3tool.identity.fast import LAYER_DOMAIN, TensorDigest, _key_order, fold, root_digest
    from exl3tool.io.strict_json import canonical_json

    def _layer_hex(key: str, rows: list) -> str:  # the definition, with the JSON encoder
        body = {"algorithm": "blake3", "layer": key, "tensors": rows}
        h = new_hasher("blake3")
        h.update(LAYER_DOMAIN + canonical_json(body))
        return h.hexdigest()

    names = [
        "model.layers.1.a", "model.layers.1.b", "model.layers.01.c", "model.layers.10.a",
        "model.layers.1", "model.layers.1a.layers.3.x", "model.layers.3.z", "x.layers.1.y",
        "model.layers.2.a", "model.layers.\u0663.x", "lm_head.weight", "model.layers..x",
        "model.layers.1.layers.2.q", "model.layers.007.w",
    ]  # fmt: skip
    rng = random.Random(5)
    for order in (sorted(names), names, *(rng.sample(names, len(names)) for _ in range(20))):
        tensors = {
            n: TensorDigest("U8", (i,), new_hasher("blake3").hexdigest())
            for i, n in enumerate(order)
        }
        groups: dict[str, list[str]] = {}
        for n in tensors:
            groups.setdefault(layer_key(n), []).append(n)
        want = {
            k: _layer_hex(k, [(n, *tensors[n]) for n in sorted(groups[k])])
            for k in sorted(groups, key=_key_order)
        }
        assert fold("blake3", tensors) == (want, root_digest("blake3", want))


_names = st.text(min_size=1, max_size=12) | st.from_regex(
    r"model\.layers\.[0-9]{1,3}\.[a-z_.]{1,12}", fullmatch=True
)
_rows = st.dictionaries(
    _names,
    st.tuples(
        st.sampled_from(["F16", "BF16", "I16", "I32", "U8"]) | st.text(max_size=4),
        st.lists(st.integers(0, 2**48), max_size=3).map(tuple),
        st.text("0123456789abcdef", min_size=64, max_size=64),
    ),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(
    rows=_rows,
    key=st.sampled_from(["0", "17", "other"]),
    algo=st.sampled_from(["blake3", "sha256"]),
)
def test_layer_json_is_the_canonical_json_of_the_rows(rows: dict, key: str, algo: str) -> None:
    """The formatted fast path and the JSON encoder give the same bytes for any names (escapes
    included: those take the encoder), dtypes, shapes and digests."""
    from exl3tool.identity.fast import _layer_json
    from exl3tool.io.strict_json import canonical_json

    names = sorted(rows)
    want = canonical_json(
        {"algorithm": algo, "layer": key, "tensors": [(n, *rows[n]) for n in names]}
    )
    assert _layer_json(algo, key, names, rows) == want
