"""Every MSRT base rule (MB) triggered by one mutation each; a built base passes."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from exl3tool.checks.base import check_base
from exl3tool.checks.options import ValidateOptions
from exl3tool.formats import msrt_spec as spec
from exl3tool.formats.checkpoint import load_checkpoint
from exl3tool.identity.compat import root_digest
from exl3tool.rules.registry import Findings, all_rules
from exl3tool.synth.msrt import build_base, write_manifest_sha256
from exl3tool.synth.msrt_edit import rewrite_shard

SHARD = "model-layer-003.safetensors"
ROUTER = "model.layers.3.mlp.gate.weight"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return build_base(tmp_path_factory.mktemp("b") / "base", hidden=128, intermediate=256)


def run(d: Path, hash_: bool = True) -> Findings:
    f = Findings()
    assert check_base(load_checkpoint(d, f), f, ValidateOptions(hash=hash_)) == "msrt-base"
    return f


def cfg(fn: Callable[[dict], object], reseal: bool = True) -> Callable[[Path], None]:
    def mutate(d: Path) -> None:
        c = json.loads((d / "config.json").read_text())
        fn(c)
        (d / "config.json").write_text(json.dumps(c, indent=2))
        if reseal:
            write_manifest_sha256(d)

    return mutate


def tail(field: str, value) -> Callable[[Path], None]:
    return cfg(lambda c: c["hybrid_tr3_tail"].__setitem__(field, value))


def retail_map(fn: Callable[[dict], None]) -> Callable[[Path], None]:
    """Edit compatibility_by_layer and keep the root consistent with it."""

    def edit(c: dict) -> None:
        t = c["hybrid_tr3_tail"]
        fn(t["compatibility_by_layer"])
        t["compatibility_sha256"] = root_digest(t["bits"], t["compatibility_by_layer"])

    return cfg(edit)


def shard(fn: Callable[[dict], dict]) -> Callable[[Path], None]:
    def mutate(d: Path) -> None:
        rewrite_shard(d / SHARD, fn)
        idx = json.loads((d / "model.safetensors.index.json").read_text())
        from exl3tool.synth.msrt_edit import read_tensors

        wm = {k: v for k, v in idx["weight_map"].items() if v != SHARD}
        wm.update(dict.fromkeys(read_tensors(d / SHARD), SHARD))
        idx["weight_map"] = dict(sorted(wm.items()))
        idx.pop("metadata")
        (d / "model.safetensors.index.json").write_text(json.dumps(idx, indent=2))
        write_manifest_sha256(d)

    return mutate


def bk(c: str, proj: str = "gate_proj", e: int = 0) -> str:
    return spec.base_key(3, e, proj, c)


def rename_rank1(t: dict) -> dict:
    return {
        (k.replace(".rank0.", ".rank1.") if k.startswith(bk("").rstrip(".")) else k): v
        for k, v in t.items()
    }


CASES = [
    ("tp-field", "MB001", tail("tp", 2)),
    ("missing-field", "MB001", cfg(lambda c: c["hybrid_tr3_tail"].pop("experts_per_layer"))),
    ("codebook", "MB002", tail("codebook", "3inst")),
    ("tensor-schema", "MB002", tail("tensor_schema", "x")),
    ("moe-layers", "MB003", tail("moe_layers", [3, 5])),
    ("coverage", "MB003", tail("moe_layer_coverage", [3])),
    ("experts", "MB004", tail("experts_per_layer", 5)),
    ("experts-float", "MB004", tail("experts_per_layer", 1e300)),  # "integer" to the schema
    ("rank1", "MB005", shard(rename_rank1)),
    (
        "no-rank",
        "MB005",
        shard(
            lambda t: {k.replace(".rank0.", ".") if k == bk("svh") else k: v for k, v in t.items()}
        ),
    ),
    ("missing-suh", "MB006", shard(lambda t: {k: v for k, v in t.items() if k != bk("suh")})),
    (
        "missing-proj",
        "MB006",
        shard(lambda t: {k: v for k, v in t.items() if ".experts.1.down_proj." not in k}),
    ),
    ("suh-dtype", "MB007", shard(lambda t: {**t, bk("suh"): t[bk("suh")].astype(np.float32)})),
    ("mcg-shape", "MB007", shard(lambda t: {**t, bk("mcg"): np.zeros(1, np.int32)})),
    ("mcg-value", "MB008", shard(lambda t: {**t, bk("mcg"): np.array(0, np.int32)})),
    ("bits", "MB009", tail("bits", 3)),
    ("mixed-k", "MB009", shard(lambda t: {**t, bk("trellis"): np.zeros((8, 16, 48), np.int16)})),
    ("root", "MB010", tail("compatibility_sha256", "1" * 64)),
    ("layer-digest", "MB011", retail_map(lambda m: m.__setitem__("3", "1" * 64))),
    ("map-keys", "MB012", retail_map(lambda m: m.pop("4"))),
    ("quant", "MB013", cfg(lambda c: c["quantization_config"].__setitem__("bits", 3))),
    ("quant-missing", "MB013", cfg(lambda c: c.pop("quantization_config"))),
    (
        "tier",
        "MB014",
        lambda d: (
            (d / "tier_bitmap.json").write_text('{"3": {"k": [3, 2, 2, 2]}}'),
            write_manifest_sha256(d),
        ),
    ),
    ("unlisted", "MB015", lambda d: (d / "notes.txt").write_text("x")),
    ("listed-absent", "MB015", lambda d: (d / "tier_bitmap.json").unlink()),
    ("manifest-hash", "MB016", cfg(lambda c: c.__setitem__("vocab_size", 129), reseal=False)),
    ("geometry", "MB017", cfg(lambda c: c.__setitem__("hidden_size", 256))),
    ("no-manifest", "MB018", lambda d: (d / "MANIFEST.sha256").unlink()),
    ("router-dtype", "MB019", shard(lambda t: {**t, ROUTER: t[ROUTER].view(np.int16)})),
    ("router-rank", "MB019", shard(lambda t: {**t, ROUTER: t[ROUTER].reshape(4, 2, -1)})),
    ("router-experts", "MB019", shard(lambda t: {**t, ROUTER: t[ROUTER][:3]})),
]


@pytest.mark.parametrize(("code", "mutate"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_base_rule_triggers(base, tmp_path, code, mutate):
    d = tmp_path / "base"
    shutil.copytree(base, d)
    mutate(d)
    f = run(d)
    assert code in f.codes(), [(x.code, x.message) for x in f]


def test_valid_base_passes(base):
    assert not list(run(base)), [(x.code, x.message) for x in run(base)]


def test_layer_digest_needs_hash(base, tmp_path):
    """Recomputing the identity reads every payload: only under --hash (documented)."""
    d = tmp_path / "base"
    shutil.copytree(base, d)
    retail_map(lambda m: m.__setitem__("3", "1" * 64))(d)
    assert "MB011" not in run(d, hash_=False).codes()


def test_the_public_runtime_revision_cannot_serve_a_base(base):
    """MB020 only when the public revision is asked for: auto (the default) means the cartridge
    revision for a base, the only one that serves it."""
    from exl3tool.actions.validate import validate_path

    for runtime, expected in (("public", {"MB020"}), ("auto", set()), ("cartridge", set())):
        _, found = validate_path(base, ValidateOptions(runtime=runtime))
        assert {f.code for f in found if f.level.value == "error"} == expected, runtime


def test_every_mb_rule_has_a_trigger():
    # check-crashed (MB099) is triggered by tests/checks/test_boundary.py, MB020 by the runtime
    # option (test_the_public_runtime_revision_cannot_serve_a_base)
    codes = {r.code for r in all_rules() if r.family == "MB" and r.name != "check-crashed"}
    assert codes == {c[1] for c in CASES} | {"MB020"}
