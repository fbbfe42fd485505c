"""Every cartridge rule (CA, and the PA path rules on shards) triggered by one mutation each."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from exl3tool.checks.cartridge import check_cartridge
from exl3tool.checks.options import ValidateOptions
from exl3tool.formats import msrt_spec as spec
from exl3tool.rules import cartridge as ca
from exl3tool.rules.registry import Findings, all_rules
from exl3tool.synth.msrt import build_adapter, build_base
from exl3tool.synth.msrt_edit import refresh_shards, rewrite_shard

L3 = "model-layer-003-b000.safetensors"
L4 = "model-layer-004-b000.safetensors"
R1 = "model-layer-003-b000-rank1.safetensors"


def key(layer=3, expert=0, proj="gate_proj", rank=0, comp="trellis", label="k3") -> str:
    return spec.stage_key(layer, expert, proj, rank, comp, label)


@pytest.fixture(scope="module")
def art(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("msrt")
    base = build_base(root / "base", hidden=128, intermediate=256)
    sparse = [[0, 1, 2, 3], [0, 1, 2]]
    return {
        "base": base,
        "full": build_adapter(root / "full", base, experts=sparse),
        "sharded": build_adapter(
            root / "sharded", base, experts=sparse, layout="rank-sharded", world_size=2
        ),
        "unclosed": build_adapter(root / "unclosed", base, experts=[[0, 1], [0, 1, 2]]),
        "base3": build_base(root / "base3", layers=(3,), hidden=128, intermediate=256),
    }


def run(path: Path, **opts) -> Findings:
    f = Findings()
    assert check_cartridge(path, f, ValidateOptions(**opts)) == "cartridge"
    return f


def manifest(d: Path, fn: Callable[[dict], object]) -> None:
    p = d / spec.ADAPTER_CONFIG
    m = json.loads(p.read_text())
    fn(m)
    p.write_text(json.dumps(m, indent=2))


def tensors(d: Path, shard: str, fn: Callable[[dict], dict | None]) -> None:
    def edit(t: dict) -> dict:
        out = fn(t)
        return t if out is None else out

    rewrite_shard(d / shard, edit)
    refresh_shards(d)


def rename(old: str, new: str) -> Callable[[dict], dict]:
    return lambda t: {(new if k == old else k): v for k, v in t.items()}


def drop(*names: str) -> Callable[[dict], dict]:
    return lambda t: {k: v for k, v in t.items() if k not in names}


def setv(name: str, value: np.ndarray) -> Callable[[dict], None]:
    return lambda t: t.__setitem__(name, value)


def m_set(path: str, value) -> Callable[[Path], None]:
    """Mutation: set a manifest value by a /-separated path (list indices as ints)."""

    def fn(m: dict) -> None:
        parts = path.split("/")
        obj = m
        for p in parts[:-1]:
            obj = obj[int(p)] if isinstance(obj, list) else obj[p]
        last = parts[-1]
        if isinstance(obj, list):
            obj[int(last)] = value
        else:
            obj[last] = value

    return lambda d: manifest(d, fn)


def m_del(path: str) -> Callable[[Path], None]:
    def fn(m: dict) -> None:
        parts = path.split("/")
        obj = m
        for p in parts[:-1]:
            obj = obj[p]
        del obj[parts[-1]]

    return lambda d: manifest(d, fn)


def shards(d: Path, fn: Callable[[list], object]) -> None:
    manifest(d, lambda m: fn(m["shards"]))


def mkfifo_shard(d: Path) -> None:
    os.mkfifo(d / "fifo.safetensors")
    shards(d, lambda s: s.append({"path": "fifo.safetensors", "size": 1, "sha256": "0" * 64}))


def symlink_shard(d: Path) -> None:
    target = d.parent / f"{d.name}-outside.safetensors"
    shutil.move(d / L4, target)
    os.symlink(target, d / L4)


def duplicate_key(d: Path) -> None:
    from exl3tool.synth.msrt_edit import read_tensors

    extra = read_tensors(d / L3)[key()]
    tensors(d, L4, lambda t: {**t, key(): extra})


def scale_of(v: float) -> np.ndarray:
    return np.array(v, dtype=np.float32)


# (id, expected code, artifact, mutation of the copied adapter dir, validate options)
CASES: list[tuple[str, str, str, Callable[[Path], object], dict]] = [
    (
        "size",
        "CA004",
        "full",
        lambda d: shards(d, lambda s: s[0].__setitem__("size", s[0]["size"] + 1)),
        {},
    ),
    (
        "sha256",
        "CA005",
        "full",
        lambda d: shards(d, lambda s: s[0].__setitem__("sha256", "0" * 64)),
        {"hash": True},
    ),
    ("missing-shard", "PA001", "full", lambda d: (d / L4).unlink(), {}),
    ("symlink-shard", "PA002", "full", symlink_shard, {}),
    ("fifo-shard", "PA003", "full", mkfifo_shard, {}),
    (
        "escape",
        "PA004",
        "full",
        lambda d: shards(d, lambda s: s[0].__setitem__("path", "../x.safetensors")),
        {},
    ),
    (
        "absolute",
        "PA004",
        "full",
        lambda d: shards(d, lambda s: s[0].__setitem__("path", "/etc/passwd")),
        {},
    ),
    ("dup-path", "PA005", "full", lambda d: shards(d, lambda s: s.append(dict(s[0]))), {}),
    (
        "dup-path-dot",
        "PA005",
        "full",
        lambda d: shards(d, lambda s: s.append({**s[0], "path": "./" + L3})),
        {},
    ),
    ("schema-v2", "CA010", "full", m_set("schema", "fq-cartridge-adapter/2"), {}),
    ("extra-field", "CA011", "full", m_set("verified_signer", None), {}),
    ("missing-field", "CA011", "full", m_del("tool_version"), {}),
    ("c-format", "CA012", "full", m_set("format", "exl3"), {}),
    ("c-profile", "CA012", "full", m_set("runtime_profile", "exl3-msrt-additive/2"), {}),
    ("c-rotation", "CA012", "full", m_set("rotation_ownership", "adapter"), {}),
    ("c-lora", "CA012", "full", m_set("standard_lora_compatible", 0), {}),
    ("c-operation", "CA012", "full", m_set("runtime_operation", "base + stage"), {}),
    ("c-codebook", "CA012", "full", m_set("codebook", "3inst"), {}),
    ("c-mcg", "CA012", "full", m_set("mcg_multiplier", 1), {}),
    ("c-ownership", "CA012", "full", m_set("mcg_ownership", "base"), {}),
    ("c-scale-shape", "CA012", "full", m_set("scale_shape", [1]), {}),
    ("label-33", "CA013", "full", m_set("assembly", "a" * 33), {}),
    ("label-dash", "CA013", "full", m_set("assembly", "-x"), {}),
    ("label-underscore", "CA013", "full", m_set("base/label", "_x"), {}),
    ("label-dot", "CA013", "full", m_set("chain/0/label", "a.b"), {}),
    ("ids-bool", "CA014", "full", m_set("selected_experts", [True, 1]), {}),
    ("ids-dup", "CA014", "full", m_set("selected_layers", [3, 3, 4]), {}),
    ("ids-empty", "CA014", "full", m_set("selected_experts", []), {}),
    ("ids-negative", "CA014", "full", m_set("coverage/k3/3", [-1, 0]), {}),
    ("ids-float", "CA014", "full", m_set("selected_experts", [0, 1.0, 2, 3]), {}),
    ("created-no-tz", "CA015", "full", m_set("created_utc", "2025-01-01T00:00:00"), {}),
    ("created-garbage", "CA015", "full", m_set("created_utc", "yesterday"), {}),
    ("created-bad-date", "CA015", "full", m_set("created_utc", "2025-13-45T00:00:00Z"), {}),
    ("num-tensors-zero", "CA016", "full", m_set("num_tensors", 0), {}),
    ("campaign", "CA016", "full", m_del("campaign/block_size"), {}),
    ("source-assembly", "CA016", "full", m_set("source_assembly/path", "/abs"), {}),
    (
        "coverage-layer-key",
        "CA016",
        "full",
        lambda d: manifest(d, lambda m: m["coverage"]["k3"].__setitem__("03", [0])),
        {},
    ),
    ("base-k", "CA017", "full", m_set("base/k", 7), {}),
    ("base-layers", "CA017", "full", m_del("base/compatibility_by_layer/4"), {}),
    ("base-closed", "CA017", "full", m_set("base/manifest_sha256", "0" * 64), {}),
    ("chain-parent", "CA018", "full", m_set("chain/1/parent", "base"), {}),
    ("chain-first-parent", "CA018", "full", m_set("chain/0/parent", "other"), {}),
    ("chain-dup", "CA018", "full", m_set("chain/1/label", "k3"), {}),
    ("chain-empty", "CA018", "full", m_set("chain", []), {}),
    ("chain-k", "CA018", "full", m_set("chain/0/k", 7), {}),
    ("coverage-keys", "CA019", "full", m_set("coverage/k5", {"3": [0]}), {}),
    ("tp-full-ws", "CA020", "full", m_set("tensor_parallel/world_size", 2), {}),
    ("tp-ranks", "CA020", "sharded", m_set("tensor_parallel/ranks", [1, 0]), {}),
    (
        "tp-axis",
        "CA020",
        "full",
        m_set("tensor_parallel/axis_by_projection/down_proj", "output"),
        {},
    ),
    ("dup-key", "CA030", "full", duplicate_key, {}),
    (
        "aliased-key",
        "CA044",
        "full",
        lambda d: tensors(
            d, L3, lambda t: {**t, key().replace("experts.0.", "experts.00."): t[key()]}
        ),
        {},
    ),
    (
        "malformed",
        "CA031",
        "full",
        lambda d: tensors(d, L3, rename(key(), key().replace("rank0", "rankx"))),
        {},
    ),
    (
        "malformed-comp",
        "CA031",
        "full",
        lambda d: tensors(d, L3, rename(key(), key(comp="weight"))),
        {},
    ),
    (
        "suh-leftover",
        "CA032",
        "full",
        lambda d: tensors(d, L3, setv(key(comp="suh"), np.zeros(128, np.float16))),
        {},
    ),
    (
        "mul1-leftover",
        "CA032",
        "full",
        lambda d: tensors(d, L3, setv(key(comp="mul1"), np.array(0, np.int32))),
        {},
    ),
    ("no-scale", "CA033", "full", lambda d: tensors(d, L3, drop(key(comp="scale"))), {}),
    ("orphan-scale", "CA034", "full", lambda d: tensors(d, L3, drop(key())), {}),
    (
        "wrapped-layer",
        "CA035",
        "full",
        lambda d: tensors(d, L3, rename(key(), "language_model." + key())),
        {},
    ),
    ("coverage", "CA036", "full", m_set("coverage/k3/3", [0, 1, 2]), {}),
    ("selected", "CA037", "full", m_set("selected_experts", [0, 1, 2, 3, 5]), {}),
    ("closure", "CA038", "unclosed", lambda d: None, {}),
    ("all-sparse", "CA039", "full", m_set("chain/1/experts", "all"), {}),
    ("chain-experts", "CA039", "full", m_set("chain/1/experts", [0, 1]), {}),
    (
        "topology",
        "CA040",
        "sharded",
        lambda d: tensors(d, R1, drop(key(rank=1), key(rank=1, comp="scale"))),
        {},
    ),
    (
        "scales-differ",
        "CA041",
        "sharded",
        lambda d: tensors(d, R1, setv(key(rank=1, comp="scale"), scale_of(2.0))),
        {},
    ),
    (
        "num-tensors",
        "CA042",
        "full",
        lambda d: manifest(d, lambda m: m.__setitem__("num_tensors", m["num_tensors"] + 1)),
        {},
    ),
    (
        "rank-in-full",
        "CA050",
        "full",
        lambda d: tensors(
            d,
            L3,
            lambda t: {
                k.replace("experts.0.", "experts.0.").replace(".rank0.", ".rank1.")
                if ".experts.0." in k
                else k: v
                for k, v in t.items()
            },
        ),
        {},
    ),
    (
        "ranks-sharded",
        "CA050",
        "sharded",
        lambda d: manifest(d, lambda m: m["tensor_parallel"].update(world_size=3, ranks=[0, 1, 2])),
        {},
    ),
    (
        "unknown-stage",
        "CA051",
        "full",
        lambda d: tensors(d, L3, lambda t: {k.replace("_k4", "_k9"): v for k, v in t.items()}),
        {},
    ),
    (
        "expert-range",
        "CA052",
        "full",
        lambda d: tensors(
            d, L3, lambda t: {k.replace("experts.3.", "experts.7."): v for k, v in t.items()}
        ),
        {"base": "base"},
    ),
    (
        "trellis-dtype",
        "CA053",
        "full",
        lambda d: tensors(d, L3, setv(key(), np.zeros((8, 16, 16), np.int32))),
        {},
    ),
    (
        "trellis-rank",
        "CA053",
        "full",
        lambda d: tensors(d, L3, setv(key(), np.zeros((8, 256), np.int16))),
        {},
    ),
    (
        "trellis-k7",
        "CA053",
        "full",
        lambda d: tensors(d, L3, setv(key(), np.zeros((8, 16, 112), np.int16))),
        {},
    ),
    (
        "geometry-base",
        "CA054",
        "full",
        lambda d: tensors(d, L3, setv(key(), np.zeros((16, 8, 16), np.int16))),
        {"base": "base"},
    ),
    (
        "geometry-align",
        "CA054",
        "full",
        lambda d: tensors(d, L3, setv(key(), np.zeros((4, 16, 16), np.int16))),
        {},
    ),
    ("stage-k", "CA055", "full", m_set("chain/0/k", 2), {}),
    (
        "scale-dtype",
        "CA056",
        "full",
        lambda d: tensors(d, L3, setv(key(comp="scale"), np.array(1.0, np.float16))),
        {},
    ),
    (
        "scale-shape",
        "CA056",
        "full",
        lambda d: tensors(d, L3, setv(key(comp="scale"), np.ones(1, np.float32))),
        {},
    ),
    (
        "scale-zero",
        "CA057",
        "full",
        lambda d: tensors(d, L3, setv(key(comp="scale"), scale_of(0.0))),
        {},
    ),
    (
        "scale-nan",
        "CA057",
        "full",
        lambda d: tensors(d, L3, setv(key(comp="scale"), scale_of(np.nan))),
        {},
    ),
    (
        "scale-negative",
        "CA057",
        "full",
        lambda d: tensors(d, L3, setv(key(comp="scale"), scale_of(-1.0))),
        {},
    ),
    (
        "scale-1e-40",
        "CA058",
        "full",
        lambda d: tensors(d, L3, setv(key(comp="scale"), scale_of(1e-40))),
        {},
    ),
    (
        "incomplete",
        "CA059",
        "full",
        lambda d: tensors(d, L3, drop(key(proj="down_proj"), key(proj="down_proj", comp="scale"))),
        {},
    ),
    (
        "k-uniform",
        "CA060",
        "full",
        lambda d: tensors(d, L3, setv(key(), np.zeros((8, 16, 32), np.int16))),
        {},
    ),
    ("base-not-msrt", "CA070", "full", lambda d: None, {"base": "full"}),
    ("base-root", "CA071", "full", m_set("base/compatibility_sha256", "1" * 64), {"base": "base"}),
    (
        "base-layer",
        "CA072",
        "full",
        m_set("base/compatibility_by_layer/3", "1" * 64),
        {"base": "base"},
    ),
    ("base-k-match", "CA073", "full", m_set("base/k", 3), {"base": "base"}),
    ("base-layer-missing", "CA074", "full", lambda d: None, {"base": "base3"}),
    ("tp-size", "CA075", "sharded", lambda d: None, {"tp": 4}),
    ("tp-align", "CA076", "full", lambda d: None, {"tp": 4}),
]


@pytest.mark.parametrize(
    ("code", "which", "mutate", "opts"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_rule_triggers(art, tmp_path, code, which, mutate, opts):
    d = tmp_path / "adapter"
    shutil.copytree(art[which], d, symlinks=True)
    mutate(d)
    opts = {k: (art[v] if k == "base" else v) for k, v in opts.items()}
    f = run(d, **opts)
    assert code in f.codes(), [(x.code, x.message) for x in f]


@pytest.mark.parametrize("which", ["full", "sharded"])
def test_valid_artifacts_pass(art, which):
    f = run(art[which], base=art["base"], hash=True, tp=2)
    assert not list(f), [(x.code, x.message) for x in f]


def test_label_of_32_passes(art, tmp_path):
    d = tmp_path / "a"
    shutil.copytree(art["full"], d)
    m_set("assembly", "a" * 32)(d)
    assert not list(run(d))


def test_chain_experts_all_passes_when_dense(art, tmp_path):
    d = tmp_path / "a"
    shutil.copytree(art["full"], d)
    m_set("chain/0/experts", "all")(d)
    assert not list(run(d))


def test_adapter_path_symlink(art, tmp_path):
    link = tmp_path / "link"
    os.symlink(art["full"], link)
    assert "CA001" in run(link).codes()


def test_adapter_path_fifo(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    assert "CA002" in run(tmp_path / "fifo").codes()


@pytest.mark.parametrize("content", [b"[1, 2]", None, b"x" * (spec.MAX_MANIFEST_BYTES + 1)])
def test_adapter_config_unusable(art, tmp_path, content):
    d = tmp_path / "a"
    shutil.copytree(art["full"], d)
    if content is None:
        (d / spec.ADAPTER_CONFIG).unlink()
    else:
        (d / spec.ADAPTER_CONFIG).write_bytes(content)
    assert "CA003" in run(d).codes()


def test_total_size_limit(art, monkeypatch):
    monkeypatch.setattr(spec, "MAX_TOTAL_BYTES", 1000)
    assert "CA006" in run(art["full"]).codes()


def test_unlisted_entry_file(art, tmp_path):
    d = tmp_path / "a"
    shutil.copytree(art["full"], d)
    shutil.copy(d / L3, d / "extra.safetensors")
    assert "CA007" in run(d / "extra.safetensors").codes()
    assert not list(run(d / L3))


def test_every_ca_rule_has_a_trigger():
    triggered = {c[1] for c in CASES} | {"CA001", "CA002", "CA003", "CA006", "CA007"}
    tested_elsewhere = {"CA043", "CA099"}  # tests/cartridge/test_cartridge_tp.py, test_boundary
    codes = {r.code for r in all_rules() if r.family == "CA"}
    assert codes - triggered - tested_elsewhere == set()
    assert ca.CA_REASSEMBLY.code in tested_elsewhere


def test_garbage_manifest_values_never_crash(art, tmp_path):
    """Wrong types everywhere: only findings, no exception."""
    d = tmp_path / "a"
    shutil.copytree(art["full"], d)
    m = json.loads((d / spec.ADAPTER_CONFIG).read_text())
    for field in spec.ADAPTER_FIELDS:
        for value in (None, 1, "x.y", [], {}, [None], {"a": None}):
            mm = dict(m)
            mm[field] = value
            (d / spec.ADAPTER_CONFIG).write_text(json.dumps(mm))
            f = run(d)
            valid = (field, value) in [
                ("producer_verified_signer", None),
                ("tool_version", "x.y"),
                ("scale_shape", []),
                ("assembly", None),  # the runtime reads str(None), the label "None"
                ("assembly", 1),
            ]
            assert f.has_errors() != valid, (field, value)


@pytest.mark.parametrize(
    ("value", "codes"),
    [
        (20261204, set()),
        (True, set()),
        (None, set()),
        (1.5, {"CA013"}),
        (-1, {"CA013"}),
        (10**18, set()),
        ([1], {"CA016"}),
    ],
)
def test_a_non_string_assembly_is_read_as_the_runtime_reads_it(art, tmp_path, value, codes):
    # the runtime's one reading: _LABEL_RE.fullmatch(str(config.get("assembly")))
    d = tmp_path / "a"
    shutil.copytree(art["full"], d)
    m_set("assembly", value)(d)
    assert {f.code for f in run(d)} == codes
