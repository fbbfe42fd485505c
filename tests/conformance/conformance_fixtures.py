"""One fixture per runtime check of `exl3tool.rules.conformance.RUNTIME_CHECKS`: an artifact the
serving runtime refuses at that check. Each builder writes its artifact under `tmp` and returns
the rule codes exl3tool reports for it (test_map.py asserts a predicting rule is among them)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
from checks_fixtures import edit_json, edit_qc, edit_shard
from conformance_paths import EXAMPLES

from exl3tool.actions.validate import validate_path
from exl3tool.checks.options import ValidateOptions
from exl3tool.synth.msrt_edit import refresh_shards, rewrite_shard

Built = dict[str, Path]
Fixture = Callable[[Path, Built], set[str]]
FIXTURES: dict[str, Fixture] = {}


def fixture(name: str) -> Callable[[Fixture], Fixture]:
    def register(fn: Fixture) -> Fixture:
        FIXTURES[name] = fn
        return fn

    return register


def codes(path: Path, **kw: object) -> set[str]:
    return validate_path(path, ValidateOptions(**kw))[1].codes()  # type: ignore[arg-type]


def copy(src: str | Path, tmp: Path) -> Path:
    return Path(shutil.copytree(EXAMPLES / src if isinstance(src, str) else src, tmp / "a"))


def _qc(root: Path, fn: Callable[[dict], object]) -> None:
    edit_json(root / "quantization_config.json", fn)


def _exl3_record(q: dict) -> str:
    """The first module prefix with an EXL3 tensor_storage record."""
    ts = q["tensor_storage"]
    return sorted(p for p, r in ts.items() if r.get("quant_format") == "exl3")[0]


def _tail(root: Path, **fields: object) -> None:
    edit_json(root / "config.json", lambda c: c["hybrid_tr3_tail"].update(fields))


def _first(root: Path, suffix: str) -> tuple[str, str]:
    """(shard, tensor) of the first indexed tensor whose name ends in `suffix`."""
    wm = json.loads((root / "model.safetensors.index.json").read_text())["weight_map"]
    name = sorted(n for n in wm if n.endswith(suffix))[0]
    return wm[name], name


def _set(root: Path, shard: str, name: str, dtype: str, value: np.ndarray) -> None:
    edit_shard(root, shard, lambda t: t.update({name: (dtype, value)}))


def _drop(root: Path, shard: str, name: str) -> None:
    edit_shard(root, shard, lambda t: t.pop(name))


@fixture("forced-quantization")
def _forced(tmp: Path, built: Built) -> set[str]:
    from exl3tool.actions import plan

    opts = plan.PlanOptions(str(EXAMPLES / "r7-tiny"), 1, 2**20, "modelopt")
    return plan.run(opts).findings.codes()


@fixture("no-storage-no-tail")
def _no_storage(tmp: Path, built: Built) -> set[str]:
    root = copy("r7-tiny", tmp)
    edit_json(root / "config.json", lambda c: c.pop("hybrid_tr3_tail"))
    return codes(root)


@fixture("storage-record-incomplete")
def _record(tmp: Path, built: Built) -> set[str]:
    root = copy(built["exl3"], tmp)

    def drop_svh(q: dict) -> None:
        prefix = _exl3_record(q)
        q["tensor_storage"][prefix]["stored_tensors"].pop(f"{prefix}.svh")

    _qc(root, drop_svh)
    return codes(root)


@fixture("tail-schema")
def _schema(tmp: Path, built: Built) -> set[str]:
    root = copy(built["rank-sliced-k3"], tmp)
    _tail(root, tensor_schema="model.layers.{L}.mlp.experts.{E}.{proj}.{trellis|suh|svh|mcg}")
    return codes(root)


@fixture("r7-block-schema")
def _r7_schema(tmp: Path, built: Built) -> set[str]:
    root = copy("r7-tiny", tmp)
    edit_qc(root, lambda q: q["r7_routed_experts"].update(schema="r7-complete-v3-checkpoint-v1"))
    return codes(root)


@fixture("r7-k-undeclared")
def _r7_k(tmp: Path, built: Built) -> set[str]:
    """k_values [3, 4] while the payload also holds K5 projections."""
    root = copy("r7-tiny", tmp)
    edit_qc(root, lambda q: q["r7_routed_experts"].update(k_values=[3, 4]))
    return codes(root)


@fixture("rotation-layout")
def _rotation(tmp: Path, built: Built) -> set[str]:
    root = copy(built["rank-sliced-k3"], tmp)
    _tail(root, rotation_layout="shared_h_v2")
    return codes(root)


@fixture("shared-h-per-expert")
def _shared_h(tmp: Path, built: Built) -> set[str]:
    """A per-expert checkpoint (every slice complete) that also holds a shared H-side vector."""
    root = copy(built["rank-sliced-k3"], tmp)
    own = "model.layers.1.mlp.experts.0.gate_proj.rank0.suh"
    shared = own.replace(".0.", ".shared_h.", 1)
    edit_shard(root, "model.safetensors", lambda t: t.update({shared: t[own]}))
    return codes(root)


@fixture("slab-shape")
def _slab(tmp: Path, built: Built) -> set[str]:
    """Uniform K3 layers where one expert's trellis slice is K4."""
    root = copy(built["rank-sliced-k3"], tmp)
    name = "model.layers.1.mlp.experts.1.up_proj.rank0.trellis"

    def k4(t: dict) -> None:
        dtype, v = t[name]
        t[name] = (dtype, np.zeros((*v.shape[:2], 64), v.dtype))

    edit_shard(root, "model.safetensors", k4)
    return codes(root)


@fixture("mixed-without-bitmap")
def _no_bitmap(tmp: Path, built: Built) -> set[str]:
    root = copy(built["rank-sliced-k3"], tmp)
    _tail(root, bits="mixed", k_values=[3, 4], bits_per_expert="tier_bitmap.json:k")
    return codes(root)


@fixture("non-integral-bits")
def _half_bits(tmp: Path, built: Built) -> set[str]:
    root = copy(built["rank-sliced-k3"], tmp)
    _tail(root, bits=3.5)
    return codes(root, runtime="cartridge")


@fixture("stray-rank1")
def _stray(tmp: Path, built: Built) -> set[str]:
    root = copy("msrt-base-tiny", tmp)
    src = "model.layers.3.mlp.experts.0.gate_proj.rank0.suh"

    def add(t: dict) -> None:
        t[src.replace("rank0", "rank1")] = t[src]

    edit_shard(root, "model-layer-003.safetensors", add)
    return codes(root)


@fixture("linear-unlisted")
def _unlisted(tmp: Path, built: Built) -> set[str]:
    root = copy(built["exl3"], tmp)
    _qc(root, lambda q: q["tensor_storage"].pop(_exl3_record(q)))
    return codes(root)


@fixture("linear-missing-suh")
def _no_suh(tmp: Path, built: Built) -> set[str]:
    root = copy(built["exl3"], tmp)
    _drop(root, *_first(root, ".suh"))
    return codes(root)


@fixture("linear-bad-marker")
def _bad_marker(tmp: Path, built: Built) -> set[str]:
    root = copy(built["exl3"], tmp)
    _set(root, *_first(root, ".mcg"), "I32", np.array(0x12345678, dtype="<i4"))
    return codes(root)


@fixture("tp-not-128")
def _tp_align(tmp: Path, built: Built) -> set[str]:
    return codes(EXAMPLES / "r7-tiny", tp=2)  # 128 intermediate channels over 2 ranks


@fixture("tp-mismatch")
def _tp(tmp: Path, built: Built) -> set[str]:
    tail = json.loads((built["rank-sliced-k3"] / "config.json").read_text())["hybrid_tr3_tail"]
    return codes(built["rank-sliced-k3"], tp=tail["tp"] * 2)


@fixture("rank-slice-missing")
def _slice_missing(tmp: Path, built: Built) -> set[str]:
    root = copy(built["rank-sliced-k3"], tmp)
    shard = "model.safetensors"
    name = "model.layers.1.mlp.experts.0.up_proj.rank1.trellis"
    _drop(root, shard, name)
    return codes(root)


@fixture("base-bad-mcg")
def _base_mcg(tmp: Path, built: Built) -> set[str]:
    root = copy("msrt-base-tiny", tmp)
    _set(root, *_first(root, "rank0.mcg"), "I32", np.array(0x12345678, dtype="<i4"))
    return codes(root)


@fixture("base-geometry")
def _base_geometry(tmp: Path, built: Built) -> set[str]:
    root = copy("msrt-base-tiny", tmp)
    edit_json(root / "config.json", lambda c: c.update(moe_intermediate_size=384))
    return codes(root)


@fixture("rank-sliced-k2")
def _k2(tmp: Path, built: Built) -> set[str]:
    return codes(built["rank-sliced-k2"])


@fixture("msrt-base-public")
def _base_public(tmp: Path, built: Built) -> set[str]:
    """A well-formed MSRT base, checked against the public revision rather than auto."""
    assert "MB020" not in codes(EXAMPLES / "msrt-base-tiny")  # auto: the cartridge revision
    return codes(EXAMPLES / "msrt-base-tiny", runtime="public")


@fixture("three-tiers")
def _three_tiers(tmp: Path, built: Built) -> set[str]:
    root = copy(built["rank-sliced-k3"], tmp)
    tail = json.loads((root / "config.json").read_text())["hybrid_tr3_tail"]
    first, last = tail["moe_layers"]
    n = tail["experts_per_layer"]
    tier = {str(L): {"k": [3, 4, 5] + [3] * (n - 3)} for L in range(first, last + 1)}
    (root / "tier_bitmap.json").write_text(json.dumps(tier))
    _tail(root, bits="mixed", k_values=[3, 4, 5], bits_per_expert="tier_bitmap.json:k")
    return codes(root)


@fixture("sizes-not-128")
def _sizes(tmp: Path, built: Built) -> set[str]:
    root = copy("r7-tiny", tmp)
    edit_json(root / "config.json", lambda c: c.update(moe_intermediate_size=136))
    return codes(root)


@fixture("unknown-expert-field")
def _unknown_field(tmp: Path, built: Built) -> set[str]:
    root = copy("r7-tiny", tmp)
    name = "model.layers.1.mlp.experts.0.gate_proj.foo"
    _set(root, "r7-experts-layer-001.safetensors", name, "F16", np.zeros(4, np.float16))
    return codes(root)


@fixture("quantized-embedding")
def _quantized_embedding(tmp: Path, built: Built) -> set[str]:
    root = copy(built["exl3"], tmp)
    shard, _ = _first(root, ".trellis")
    _set(root, shard, "model.embed_tokens.trellis", "I16", np.zeros((64, 65), "<i2"))
    _set(root, shard, "model.embed_tokens.signs", "F16", np.ones((1, 256), np.float16))
    return codes(root)


@fixture("packed-mixed")
def _packed_mixed(tmp: Path, built: Built) -> set[str]:
    """Layer 0's v_proj unquantized (a weight, no exl3 record) beside EXL3 q_proj and k_proj."""
    root = copy(built["exl3"], tmp)
    v = "model.layers.0.self_attn.v_proj"
    shard, _ = _first(root, f"{v}.trellis")

    def swap(t: dict) -> None:
        for part in ("trellis", "suh", "svh", "mcg", "mul1"):
            t.pop(f"{v}.{part}", None)
        t[f"{v}.weight"] = ("F16", np.zeros((256, 256), np.float16))

    edit_shard(root, shard, swap)
    edit_json(root / "quantization_config.json", lambda q: q["tensor_storage"].pop(v))
    return codes(root)


@fixture("truncated-shard")
def _truncated(tmp: Path, built: Built) -> set[str]:
    root = copy("r7-tiny", tmp)
    shard = root / "r7-experts-layer-001.safetensors"
    shard.write_bytes(shard.read_bytes()[:-8])
    return codes(root)


def _cartridge(tmp: Path, fn: Callable[[dict], object]) -> Path:
    root = copy("cartridge-k3k4", tmp)
    edit_json(root / "adapter_config.json", fn)
    return root


@fixture("cartridge-shard-size")
def _cart_size(tmp: Path, built: Built) -> set[str]:
    return codes(_cartridge(tmp, lambda m: m["shards"][0].update(size=m["shards"][0]["size"] + 1)))


@fixture("cartridge-created-lowercase-z")
def _cart_created(tmp: Path, built: Built) -> set[str]:
    return codes(_cartridge(tmp, lambda m: m.update(created_utc="2026-01-01T00:00:00z")))


@fixture("cartridge-num-tensors")
def _cart_count(tmp: Path, built: Built) -> set[str]:
    return codes(_cartridge(tmp, lambda m: m.update(num_tensors=m["num_tensors"] + 1)))


@fixture("cartridge-stage-k")
def _cart_k(tmp: Path, built: Built) -> set[str]:
    return codes(_cartridge(tmp, lambda m: m["chain"][1].update(k=2)))


def _cart_scale(tmp: Path, value: float) -> set[str]:
    root = copy("cartridge-k3k4", tmp)
    name = "model.layers.3.mlp.experts.0.gate_proj.rank0.scale_k3"
    _set(root, "model-layer-003-b000.safetensors", name, "F32", np.array(value, dtype="<f4"))
    return codes(root)


@fixture("cartridge-rank-topology")
def _cart_topology(tmp: Path, built: Built) -> set[str]:
    """Rank 1 of a rank-sharded cartridge lacks one (label, expert, projection) of rank 0."""
    root = copy(built["sharded-cartridge"], tmp)
    shard = sorted(root.glob("*-rank1.safetensors"))[0]
    gone = ("model.layers.3.mlp.experts.0.gate_proj.rank1.trellis_k3",
            "model.layers.3.mlp.experts.0.gate_proj.rank1.scale_k3")  # fmt: skip

    def drop(t: dict) -> dict:
        assert all(n in t for n in gone), sorted(t)[:4]
        return {k: v for k, v in t.items() if k not in gone}

    rewrite_shard(shard, drop)
    refresh_shards(root)
    return codes(root)


@fixture("serve-eager")
def _serve_eager(tmp: Path, built: Built) -> set[str]:
    return codes(built["exl3"])  # tensor_storage and no rank-sliced tail


@fixture("cartridge-scale-zero")
def _cart_zero(tmp: Path, built: Built) -> set[str]:
    return _cart_scale(tmp, 0.0)


@fixture("cartridge-inverse-scale")
def _cart_inverse(tmp: Path, built: Built) -> set[str]:
    return _cart_scale(tmp, 1e-40)


@fixture("cartridge-other-base")
def _cart_base(tmp: Path, built: Built) -> set[str]:
    return codes(EXAMPLES / "cartridge-k3k4", base=built["sparse-base"], hash=True)


@fixture("base-root-altered")
def _base_root(tmp: Path, built: Built) -> set[str]:
    root = copy("msrt-base-tiny", tmp)
    _tail(root, compatibility_sha256="0" * 64)
    return codes(root)
