"""Every EX/R7/RS rule: a valid artifact passes; each defect, injected alone, is reported with
its code, the file and the tensor or JSON pointer, and fails validation when it is an error."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from checks_fixtures import copy, edit_block, edit_json, edit_qc, edit_shard, move_tensor

from exl3tool.actions.validate import validate_path
from exl3tool.checks.options import ValidateOptions
from exl3tool.report.model import Report
from exl3tool.rules.registry import Severity, all_rules, get_rule

L1 = "r7-experts-layer-001.safetensors"
L2 = "r7-experts-layer-002.safetensors"
M1 = "r7-experts-layer-001.json"
MTP = "model-mtp.safetensors"
E0 = "model.layers.1.mlp.experts.0"
R0 = "model.layers.3.mlp.experts.0"  # carried MTP layer, rank-sliced
ROUTER = "model.layers.1.mlp.gate.weight"
EXL3_ROUTER = ROUTER  # the plain EXL3 fixture's MoE layer is layer 1 too
BIAS = "model.layers.1.mlp.gate.e_score_correction_bias"
Q = "model.layers.0.self_attn.q_proj"  # mcg linear of the plain EXL3 checkpoint
K = "model.layers.0.self_attn.k_proj"  # mul1 linear
EXL3_EXPERT = "model.layers.1.mlp.experts.0"  # a routed expert of the plain EXL3 checkpoint


def shard_of(root: Path, name: str) -> str:
    """The shard holding `name`, or for a new tensor the shard of its linear's trellis."""
    idx = root / "model.safetensors.index.json"
    if not idx.is_file():
        return "model.safetensors"
    wm = json.loads(idx.read_text())["weight_map"]
    return wm.get(name) or wm[name.rpartition(".")[0] + ".trellis"]


def tensor_edit(name: str, fn: Callable[[dict], object]) -> Callable[[Path], None]:
    return lambda root: edit_shard(root, shard_of(root, name), fn)


def drop(name: str) -> Callable[[Path], None]:
    return tensor_edit(name, lambda t: t.pop(name))


def put(
    name: str, dtype: str, array: np.ndarray, where: str | None = None
) -> Callable[[Path], None]:
    def go(root: Path) -> None:
        edit_shard(root, where or shard_of(root, name), lambda t: t.update({name: (dtype, array)}))

    return go


def trellis(rows: int, cols: int, last: int) -> np.ndarray:
    return np.zeros((rows, cols, last), dtype="<i2")


def f16(n: int, value: float = 0.01) -> np.ndarray:
    return np.full((n,), value, dtype="<f2")


def storage(fn: Callable[[dict], object]) -> Callable[[Path], None]:
    return lambda root: edit_json(
        root / "quantization_config.json", lambda q: fn(q["tensor_storage"])
    )


def manifest(fn: Callable[[dict], object], name: str = M1) -> Callable[[Path], None]:
    return lambda root: edit_json(root / name, fn)


def ckpt_manifest(fn: Callable[[dict], object]) -> Callable[[Path], None]:
    return lambda root: edit_json(root / "MANIFEST.json", fn)


def tail(fn: Callable[[dict], object]) -> Callable[[Path], None]:
    return lambda root: edit_json(root / "config.json", lambda c: fn(c["hybrid_tr3_tail"]))


def config(fn: Callable[[dict], object]) -> Callable[[Path], None]:
    return lambda root: edit_json(root / "config.json", fn)


def unlink(name: str) -> Callable[[Path], None]:
    return lambda root: (root / name).unlink()


def set_marker(name: str, value: int) -> Callable[[Path], None]:
    return put(name, "I32", np.array(value, dtype="<i4"))


def nonfinite(name: str) -> Callable[[Path], None]:
    def fn(t: dict) -> None:
        dtype, a = t[name]
        a = a.copy()
        a[3] = np.inf
        t[name] = (dtype, a)

    return tensor_edit(name, fn)


@dataclass(frozen=True)
class Case:
    code: str
    artifact: str
    mutate: Callable[[Path], None]
    options: ValidateOptions = field(default_factory=ValidateOptions)
    id: str = ""


HASH = ValidateOptions(hash=True)
# Rules about a whole file (absent, or its bytes): the file is the location.
WHOLE_FILE = {"CK013", "R7040", "R7046", "R7050", "R7052"}

CASES = [
    # --- the block -------------------------------------------------------------------------
    Case("R7001", "r7", lambda r: edit_qc(r, lambda q: q.update(r7_routed_experts=[1]))),
    Case("R7002", "r7", lambda r: edit_block(r, lambda b: b.update(schema="r7-v3"))),
    Case("R7003", "r7", lambda r: edit_block(r, lambda b: b.update(codebook="mul1"))),
    Case("R7003", "r7", lambda r: edit_block(r, lambda b: b.update(bits=3.5)), id="bits"),
    Case(
        "R7004", "r7", lambda r: edit_block(r, lambda b: b.update(moe_layers=[True, 2])), id="bool"
    ),
    Case(
        "R7004", "r7", lambda r: edit_block(r, lambda b: b.update(moe_layers=[1.0, 2])), id="float"
    ),
    Case(
        "R7004", "r7", lambda r: edit_block(r, lambda b: b.update(moe_layers=[2, 1])), id="reversed"
    ),
    Case("R7004", "r7", lambda r: edit_block(r, lambda b: b.update(moe_layers=[1])), id="one"),
    Case("R7004", "r7", lambda r: edit_block(r, lambda b: b.pop("moe_layers")), id="absent"),
    Case("R7005", "r7", lambda r: edit_block(r, lambda b: b.update(k_values=[])), id="empty"),
    Case(
        "R7005", "r7", lambda r: edit_block(r, lambda b: b.update(k_values=[3.0, 4, 5])), id="float"
    ),
    Case("R7005", "r7", lambda r: edit_block(r, lambda b: b.update(k_values=[True, 4])), id="bool"),
    Case("R7005", "r7", lambda r: edit_block(r, lambda b: b.update(k_values=[3, 4, 6])), id="six"),
    Case("R7006", "r7", lambda r: edit_block(r, lambda b: b.update(target_bpw=3.5))),
    Case(
        "R7010",
        "r7",
        lambda r: edit_json(
            r / "quantization_config.json", lambda q: q["r7_routed_experts"].update(target_bpw="9")
        ),
    ),
    Case("R7011", "r7", config(lambda c: c.pop("quantization_config"))),
    Case("CK013", "r7", unlink("quantization_config.json")),
    Case("R7020", "r7", config(lambda c: c.pop("n_routed_experts"))),
    Case("R7021", "r7", config(lambda c: c.update(hidden_size=100))),
    # --- tensors ---------------------------------------------------------------------------
    Case("R7022", "r7", lambda r: edit_shard(r, L2, lambda t: t.clear())),
    Case("R7023", "r7", drop(f"{E0}.up_proj.svh")),
    Case("R7023", "r7", drop(f"{E0}.down_proj.trellis"), id="trellis"),
    Case("R7024", "r7", lambda r: edit_block(r, lambda b: b.update(k_values=[3, 4]))),
    Case("R7025", "r7", config(lambda c: c.update(moe_intermediate_size=256))),
    Case("R7025", "r7", put(f"{E0}.gate_proj.trellis", "I16", trellis(8, 8, 40)), id="k-not-16"),
    Case("R7026", "r7", drop(f"{E0}.gate_proj.mcg")),
    Case("EX010", "r7", put(f"{E0}.gate_proj.mcg", "I64", np.array(-877912083, dtype="<i8"))),
    Case("EX011", "r7", set_marker(f"{E0}.gate_proj.mcg", 0)),
    Case("EX013", "r7", nonfinite(f"{E0}.down_proj.suh")),
    Case("EX013", "r7", nonfinite("model.layers.2.mlp.experts.r7_shared.down_svh"), id="shared"),
    Case("R7027", "r7", put(f"{E0}.gate_proj.svh", "F16", f16(64))),
    Case("R7028", "r7", drop("model.layers.1.mlp.experts.r7_shared.gate_up_suh")),
    Case("R7029", "r7", put("model.layers.1.mlp.experts.1.gate_proj.suh", "F16", f16(128), L1)),
    # the model's MoE layers are 1 and 2 (first_k_dense_replace 1) and 3 (its MTP layer)
    Case("R7035", "r7", config(lambda c: c.update(first_k_dense_replace=2)), id="experts-on-dense"),
    Case(
        "R7035", "r7", config(lambda c: c.update(first_k_dense_replace=0)), id="layer-0-uncovered"
    ),
    Case(
        "R7031",
        "r7",
        put(
            "model.layers.1.mlp.experts.7.gate_proj.mcg",
            "I32",
            np.array(-877912083, dtype="<i4"),
            L1,
        ),
    ),
    Case(
        "R7031",
        "r7",
        put(
            "model.layers.0.mlp.experts.0.gate_proj.mcg",
            "I32",
            np.array(-877912083, dtype="<i4"),
            L1,
        ),
        id="layer",
    ),
    Case(
        "R7032", "r7", lambda r: edit_shard(r, L1, lambda t: None, lambda m: m.update(r7_layer="9"))
    ),
    Case(
        "R7033",
        "r7",
        lambda r: (
            move_tensor(r, f"{E0}.up_proj.trellis", L1, "model-carrier-00001-of-00001.safetensors"),
            manifest(lambda m: m["payload_sha256"].pop(f"{E0}.up_proj.trellis"))(r),
        ),
    ),
    Case("R7034", "r7", lambda r: edit_block(r, lambda b: b.update(moe_layers=[1, 9]))),
    # --- manifests -------------------------------------------------------------------------
    Case("R7040", "r7", unlink(M1)),
    Case("R7041", "r7", lambda r: edit_block(r, lambda b: b["bit_map_manifests"].pop())),
    Case("R7042", "r7", manifest(lambda m: m.update(allocation_bit_units="x"))),
    Case("R7042", "r7", manifest(lambda m: m.pop("bit_map")), id="required"),
    Case("R7043", "r7", manifest(lambda m: m["bit_map"].update({f"{E0}.gate_proj": 8}))),
    Case(
        "R7043",
        "r7",
        manifest(lambda m: m["bit_map"].update({"model.layers.1.mlp.experts.9.up_proj": 3})),
        id="extra",
    ),
    Case(
        "R7044",
        "r7",
        manifest(lambda m: m.update(allocation_bit_units=m["allocation_bit_units"] + 1)),
    ),
    Case(
        "R7045",
        "r7",
        manifest(lambda m: m["payload_sha256"].update({f"{E0}.up_proj.trellis": "a" * 64})),
        HASH,
    ),
    Case("R7046", "r7", manifest(lambda m: m.update(shard_sha256="b" * 64)), HASH),
    Case("R7047", "r7", manifest(lambda m: m.update(layer=9))),
    Case(
        "R7047",
        "r7",
        manifest(lambda m: m["payload_sha256"].update({"model.nope": "c" * 64})),
        id="stray",
    ),
    Case("R7048", "r7", manifest(lambda m: m.pop("provenance"))),
    Case("R7050", "r7", unlink("MANIFEST.json")),
    Case(
        "R7051",
        "r7",
        ckpt_manifest(lambda m: m["files_sha256"].update({"config.json": "d" * 64})),
        HASH,
    ),
    Case(
        "R7051",
        "r7",
        lambda r: (r / "config.json").write_text((r / "config.json").read_text() + " "),
        HASH,
        id="file-changed",
    ),
    Case("R7052", "r7", lambda r: (r / "MANIFEST.sha256").write_text("garbage\n")),
    Case(
        "R7052",
        "r7",
        lambda r: (r / "MANIFEST.sha256").write_text("e" * 64 + "  MANIFEST.json\n"),
        HASH,
        id="wrong",
    ),
    Case("R7053", "r7", ckpt_manifest(lambda m: m["files_sha256"].update({"nope.bin": "f" * 64}))),
    Case(
        "R7053",
        "r7",
        ckpt_manifest(lambda m: m["files_sha256"].update({"../x": "f" * 64})),
        id="escape",
    ),
    Case(
        "R7054",
        "r7",
        ckpt_manifest(lambda m: m["r7_layer_manifest_sha256"].update({"1": "0" * 64})),
        HASH,
    ),
    # --- carried MTP layer, TP ------------------------------------------------------------
    Case("R7060", "r7", tail(lambda t: t.pop("r7_compat_role"))),
    Case("RS022", "r7", lambda r: _tail_layer_dense_linear(r)),
    Case("R7060", "r7", tail(lambda t: t.update(moe_layers=[2, 3])), id="overlap"),
    Case("R7070", "r7", lambda r: None, ValidateOptions(tp=3)),
    Case("R7071", "r7", put(ROUTER, "BF16", np.zeros((3, 128), "<u2")), id="router-experts"),
    Case("R7071", "r7", put(ROUTER, "BF16", np.zeros((4, 2, 64), "<u2")), id="router-rank"),
    Case("R7071", "r7", put(ROUTER, "I16", np.zeros((4, 128), "<i2")), id="router-dtype"),
    Case("R7071", "r7", put(BIAS, "F32", np.zeros((5,), "<f4")), id="router-bias"),
    Case("RS001", "r7", tail(lambda t: t.update(bits="x"))),
    Case("RS001", "r7", tail(lambda t: t.update(format="fp8")), id="format"),
    Case("RS002", "r7", tail(lambda t: t.update(tensor_schema="model.layers.{L}.x"))),
    Case("RS003", "r7", tail(lambda t: t.update(experts_per_layer=3))),
    Case("RS004", "r7", lambda r: None, ValidateOptions(tp=2)),
    Case("RS005", "r7", drop(f"{R0}.up_proj.rank0.svh")),
    Case("RS006", "r7", put(f"{R0}.down_proj.rank0.suh", "F16", f16(64))),
    Case(
        "RS006", "r7", put(f"{R0}.down_proj.rank0.trellis", "I16", trellis(8, 4, 64)), id="trellis"
    ),
    Case(
        "RS007",
        "r7",
        put(
            "model.layers.3.mlp.experts.0.gate_proj.rank1.mcg",
            "I32",
            np.array(-877912083, dtype="<i4"),
            MTP,
        ),
    ),
    Case("RS008", "r7", tail(lambda t: t.update(bits=5.0))),
    Case("RS010", "r7", tail(lambda t: t.update(rotation_layout="twisted"))),
    Case("RS010", "r7", tail(lambda t: t.update(rotation_layout="shared_h_v1")), id="shared-h"),
    Case("RS011", "r7", tail(lambda t: t.update(bits="mixed"))),
    Case("RS009", "rank-sliced", config(lambda c: c.update(moe_intermediate_size=128))),
    Case(
        "RS005",
        "rank-sliced",
        drop("model.layers.1.mlp.experts.2.down_proj.rank1.trellis"),
        id="legacy",
    ),
    Case(
        "RS012",
        "rank-sliced",
        put("model.layers.1.mlp.experts.2.up_proj.rank1.suh", "F16", f16(128)),
        HASH,
    ),
    Case(
        "RS013",
        "rank-sliced",
        put("model.layers.1.mlp.experts.4.up_proj.rank0.mcg", "I32", np.array(-877912083, "<i4")),
    ),
    Case(
        "RS013",
        "rank-sliced",
        put("model.layers.0.mlp.experts.0.up_proj.rank0.mcg", "I32", np.array(-877912083, "<i4")),
        id="outside-moe-layers",
    ),
    # --- plain EXL3 ----------------------------------------------------------------------------
    Case("EX001", "exl3", put(f"{Q}.trellis", "I32", np.zeros((16, 16, 32), dtype="<i4"))),
    Case("EX002", "exl3", put(f"{Q}.trellis", "I16", trellis(16, 16, 20))),
    Case("EX003", "exl3", put(f"{Q}.trellis", "I16", trellis(16, 16, 40))),
    Case("EX004", "exl3", drop(f"{Q}.suh")),
    Case("EX005", "exl3", drop(f"{Q}.svh")),
    Case("EX006", "exl3", drop(f"{Q}.trellis")),
    Case("EX007", "exl3", put(f"{Q}.suh", "F16", f16(128))),
    Case("EX008", "exl3", put(f"{Q}.svh", "F16", f16(128))),
    Case(
        "EX009",
        "exl3",
        lambda r: (
            put(f"{Q}.trellis", "I16", trellis(4, 16, 32))(r),
            put(f"{Q}.suh", "F16", f16(64))(r),
        ),
    ),
    Case("EX010", "exl3", put(f"{Q}.mcg", "F32", np.array(1.0, dtype="<f4")), id="plain"),
    Case("EX011", "exl3", set_marker(f"{K}.mul1", -877912083), id="plain"),
    Case("EX012", "exl3", set_marker(f"{Q}.mul1", -2082680531)),
    Case("EX013", "exl3", nonfinite(f"{Q}.svh"), id="plain"),
    Case(
        "EX014",
        "exl3",
        lambda r: (
            drop(f"{Q}.suh")(r),
            put(f"{Q}.su", "I16", np.zeros(16, dtype="<i2"))(r),
            storage(
                lambda s: s[Q]["stored_tensors"].update(
                    {
                        f"{Q}.su": s[Q]["stored_tensors"].pop(f"{Q}.suh")
                        | {"shape": [16], "n_bytes": 32, "dtype": "torch.int16"}
                    }
                )
            )(r),
        ),
    ),
    Case("EX015", "exl3", put(f"{Q}.bias", "F16", f16(100))),
    Case("EX016", "exl3", put(f"{Q}.scale", "F16", f16(1))),
    Case(
        "EX017",
        "exl3",
        lambda r: [
            edit_shard(r, lb, lambda t: [t.pop(n) for n in list(t) if not n.endswith("weight")])
            for lb in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
        ],
    ),
    Case(
        "EX020",
        "exl3",
        lambda r: edit_json(r / "quantization_config.json", lambda q: q.pop("tensor_storage")),
    ),
    Case(
        "EX021",
        "exl3",
        storage(
            lambda s: s[Q]["stored_tensors"].update(
                {f"{Q}.bias": {"shape": [256], "n_bytes": 512, "dtype": "torch.float16"}}
            )
        ),
    ),
    Case("EX022", "exl3", storage(lambda s: s.pop(Q))),
    Case("EX023", "exl3", storage(lambda s: s[Q]["stored_tensors"][f"{Q}.svh"].update(shape=[3]))),
    Case("EX024", "exl3", storage(lambda s: s[Q].update(bits_per_weight=7))),
    Case("EX025", "exl3", storage(lambda s: s[Q].pop("stored_tensors"))),
    Case("EX025", "exl3", storage(lambda s: s[Q]["stored_tensors"].pop(f"{Q}.suh")), id="no-suh"),
    Case("EX026", "exl3", storage(lambda s: s[K].update(mcg_multiplier=3417055213))),
    Case("EX027", "exl3", config(lambda c: c["quantization_config"].update(bits=9.99))),
    Case("EX028", "exl3", put(EXL3_ROUTER, "F16", np.zeros((3, 256), "<f2"))),
    Case("EX028", "exl3", put(EXL3_ROUTER, "F16", np.zeros((4, 2, 128), "<f2")), id="rank"),
    # --- runtime conformance (checks/conformance.py; more in tests/conformance) ---------------
    Case("R7080", "r7", config(lambda c: c.pop("hybrid_tr3_tail"))),
    Case("EX030", "exl3", storage(lambda s: [r.update(quant_format="fp16") for r in s.values()])),
    Case("EX031", "exl3", put(f"{K}.trellis", "I16", trellis(16, 16, 40))),
    Case("EX033", "exl3", lambda r: _quantized_embedding(r)),
    Case("EX034", "exl3", lambda r: _unquantized_v_proj(r)),
    Case("EX035", "exl3", config(lambda c: c.update(moe_intermediate_size=384))),
    Case("EX036", "exl3", lambda r: None),  # every plain EXL3 checkpoint (an info)
    Case(
        "EX032",
        "exl3",
        storage(
            lambda s: s[K]["stored_tensors"].update(
                {f"{Q}.mcg": s[Q]["stored_tensors"][f"{Q}.mcg"]}
            )
        ),
    ),
    Case(
        "EX022",
        "exl3",
        lambda r: edit_json(
            r / "config.json",
            lambda c: c["quantization_config"].update(
                tensor_storage={
                    p: rec
                    for p, rec in json.loads((r / "quantization_config.json").read_text())[
                        "tensor_storage"
                    ].items()
                    if p != Q
                }
            ),
        ),
        id="embedded-map",
    ),
    Case("EX004", "exl3", lambda r: _legacy_expert_signs(r), id="expert-legacy-su"),
    Case("RS020", "rank-sliced", tail(lambda t: t.update(bits=2.0))),
    Case("RS021", "rank-sliced", lambda r: _three_tiers(r)),
    Case("EX022", "r7", lambda r: _dense_exl3(r), id="r7-dense-linear"),
    Case(
        "R7061",
        "r7",
        tail(lambda t: t.update(bits="mixed", k_values=[4], bits_per_expert="tier_bitmap.json:k")),
    ),
]

O_PROJ = "model.layers.0.self_attn.o_proj"  # a BF16 linear of the R7 fixture (hidden 128)


def _quantized_embedding(root: Path) -> None:
    """The token embedding as exllamav3's convert.py -eb writes it: trellis rows and signs."""
    shard = shard_of(root, f"{K}.trellis")
    put("model.embed_tokens.trellis", "I16", np.zeros((64, 65), "<i2"), shard)(root)
    put("model.embed_tokens.signs", "F16", f16(256).reshape(1, 256), shard)(root)


def _unquantized_v_proj(root: Path) -> None:
    """Layer 0's v_proj stored unquantized (a weight, no exl3 record) beside EXL3 q/k_proj."""
    v = "model.layers.0.self_attn.v_proj"

    def swap(t: dict) -> None:
        for part in ("trellis", "suh", "svh", "mcg", "mul1"):
            t.pop(f"{v}.{part}", None)
        t[f"{v}.weight"] = ("F16", np.zeros((256, 256), "<f2"))

    edit_shard(root, shard_of(root, f"{v}.trellis"), swap)
    storage(lambda s: s.pop(v))(root)


def _tail_layer_dense_linear(root: Path) -> None:
    """An EXL3 o_proj without a codebook marker (3INST) in the carried tail layer 3, claimed
    by the tensor_storage map the runtime reads with a tail (config.json's own)."""
    p = "model.layers.3.self_attn.o_proj"
    shard = shard_of(root, ROUTER)
    put(f"{p}.trellis", "I16", trellis(8, 8, 64), shard)(root)
    put(f"{p}.suh", "F16", f16(128), shard)(root)
    put(f"{p}.svh", "F16", f16(128), shard)(root)

    def meta(shape: list[int], dtype: str, n: int) -> dict:
        return {"shape": shape, "dtype": dtype, "n_bytes": n}

    record = {
        "quant_format": "exl3",
        "bits_per_weight": 4,
        "stored_tensors": {
            f"{p}.trellis": meta([8, 8, 64], "torch.int16", 8 * 8 * 64 * 2),
            f"{p}.suh": meta([128], "torch.float16", 256),
            f"{p}.svh": meta([128], "torch.float16", 256),
        },
    }
    config(lambda c: c["quantization_config"].setdefault("tensor_storage", {}).update({p: record}))(
        root
    )


def _legacy_expert_signs(root: Path) -> None:
    """Expert 0's gate_proj with legacy packed signs (.su/.sv) instead of suh/svh, listed."""
    p = f"{EXL3_EXPERT}.gate_proj"

    def swap(t: dict) -> None:
        (_, suh), (_, svh) = t.pop(f"{p}.suh"), t.pop(f"{p}.svh")
        t[f"{p}.su"] = ("I16", np.zeros(len(suh) // 16, "<i2"))
        t[f"{p}.sv"] = ("I16", np.zeros(len(svh) // 16, "<i2"))

    edit_shard(root, shard_of(root, f"{p}.trellis"), swap)

    def relist(s: dict) -> None:
        st = s[p]["stored_tensors"]
        for old, new in (("suh", "su"), ("svh", "sv")):
            meta = st.pop(f"{p}.{old}")
            st[f"{p}.{new}"] = {**meta, "dtype": "torch.int16", "shape": [meta["shape"][0] // 16],
                                "n_bytes": meta["n_bytes"] // 16}  # fmt: skip

    storage(relist)(root)


def _dense_exl3(root: Path, listed: bool = False) -> None:
    """The R7 fixture with one dense linear stored as EXL3 (K 4, mcg), listed in config.json's
    tensor_storage when `listed` (the map the runtime reads beside the carried tail)."""
    parts = {
        f"{O_PROJ}.trellis": ("I16", trellis(8, 8, 64)),
        f"{O_PROJ}.suh": ("F16", f16(128)),
        f"{O_PROJ}.svh": ("F16", f16(128)),
        f"{O_PROJ}.mcg": ("I32", np.array(-877912083, dtype="<i4")),
    }

    def swap(t: dict) -> None:
        t.pop(f"{O_PROJ}.weight")
        t.update(parts)

    edit_shard(root, shard_of(root, f"{O_PROJ}.weight"), swap)
    if listed:
        record = {
            "quant_format": "exl3",
            "bits_per_weight": 4,
            "stored_tensors": {
                n: {"shape": list(a.shape), "dtype": d, "n_bytes": a.nbytes}
                for n, (d, a) in parts.items()
            },
        }
        edit_json(
            root / "config.json",
            lambda c: (
                c["quantization_config"].setdefault("tensor_storage", {}).update({O_PROJ: record})
            ),
        )


def test_r7_dense_exl3_linear_listed_in_the_embedded_map_is_claimed(
    pristine: dict[str, Path], tmp_path: Path
) -> None:
    root = copy(pristine["r7"], tmp_path / "ckpt")
    _dense_exl3(root, listed=True)
    assert "EX022" not in run(root).findings.codes()
    # listed only in quantization_config.json: the runtime does not read it beside a tail
    root2 = copy(pristine["r7"], tmp_path / "ckpt2")
    _dense_exl3(root2)
    edit_json(
        root2 / "quantization_config.json",
        lambda q: q.setdefault("tensor_storage", {}).update(
            {O_PROJ: {"quant_format": "exl3", "stored_tensors": {}}}
        ),
    )
    hits = [f for f in run(root2).findings if f.code == "EX022"]
    assert [f.location.tensor for f in hits] == [f"{O_PROJ}.trellis"]


def test_r7_uniform_carried_tail_is_not_r7061(pristine: dict[str, Path], tmp_path: Path) -> None:
    root = copy(pristine["r7"], tmp_path / "ckpt")
    assert "R7061" not in run(root).findings.codes()
    tail(lambda t: t.update(bits=" Mixed "))(root)  # as the runtime reads it
    assert "R7061" in run(root).findings.codes()


def _three_tiers(root: Path) -> None:
    (root / "tier_bitmap.json").write_text(json.dumps({"1": {"k": [3, 4, 5, 4]}}))
    edit_json(
        root / "config.json",
        lambda c: c["hybrid_tr3_tail"].update(
            bits="mixed", k_values=[3, 4, 5], bits_per_expert="tier_bitmap.json:k"
        ),
    )


def _id(case: Case) -> str:
    return f"{case.code}-{case.id}" if case.id else case.code


def run(root: Path, options: ValidateOptions = ValidateOptions()) -> Report:
    ref, findings = validate_path(root, options)
    return Report([ref], findings)


@pytest.mark.parametrize("kind", ["r7", "exl3", "rank-sliced"])
@pytest.mark.parametrize("hash_", [False, True])
def test_valid_artifact_has_no_errors_or_warnings(
    pristine: dict[str, Path], kind: str, hash_: bool
) -> None:
    report = run(pristine[kind], ValidateOptions(hash=hash_))
    assert report.artifacts[0].kind == kind
    bad = [f for f in report.findings if f.level is not Severity.INFO]
    assert bad == []
    assert report.exit_code(strict=True) == 0


def test_valid_r7_reports_stamp_tiers_and_unverified_digests(pristine: dict[str, Path]) -> None:
    codes = [f.code for f in run(pristine["r7"]).findings]
    assert codes.count("R7030") == 2  # one tier line per MoE layer
    assert {"R7012", "R7049"} <= set(codes)
    assert "R7049" not in run(pristine["r7"], HASH).findings.codes()


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_each_defect_is_reported(pristine: dict[str, Path], tmp_path: Path, case: Case) -> None:
    root = copy(pristine[case.artifact], tmp_path / "ckpt")
    case.mutate(root)
    report = run(root, case.options)
    hits = [f for f in report.findings if f.code == case.code]
    assert hits, f"{case.code} not reported; got {sorted(report.findings.codes())}"
    for f in hits:
        file = f.location.file or ""
        assert file.startswith(str(root) + "/"), f"no file inside the artifact: {f.location}"
        assert f.location.tensor or f.location.pointer or case.code in WHOLE_FILE, f.location
    if get_rule(case.code).severity is Severity.ERROR:
        assert report.exit_code() == 1
    else:
        assert report.exit_code() == 0


def test_every_declared_rule_has_a_triggering_case() -> None:
    families = ("EX", "R7", "RS")
    # check-crashed (X099): tests/checks/test_boundary.py
    declared = {
        r.code for r in all_rules() if r.code[:-3] in families and r.name != "check-crashed"
    }
    triggered = {c.code for c in CASES} | {"R7012", "R7030", "R7049"}  # infos of a valid R7
    assert declared - triggered == set()


@pytest.mark.parametrize("kind", ["r7", "exl3"])
def test_a_one_element_marker_is_a_warning_and_its_value_still_checked(
    pristine: dict[str, Path], tmp_path: Path, kind: str
) -> None:
    # the runtime's marker check takes any one-element int32; exllamav3 writes a scalar
    name = f"{E0}.gate_proj.mcg" if kind == "r7" else f"{Q}.mcg"
    root = copy(pristine[kind], tmp_path / "ckpt")
    put(name, "I32", np.array([-877912083], dtype="<i4"))(root)
    hits = [f for f in run(root).findings if f.code in ("EX010", "EX011")]
    assert [(f.code, f.level) for f in hits] == [("EX010", Severity.WARNING)]
    put(name, "I32", np.array([7], dtype="<i4"))(root)
    assert "EX011" in run(root).findings.codes()


def test_plan_and_validate_agree_on_which_dense_linears_the_runtime_claims(
    pristine: dict[str, Path], tmp_path: Path
) -> None:
    from exl3tool.actions import plan

    def claimed(root: Path) -> bool:
        got = plan.run(plan.PlanOptions(str(root), 1))
        mods = got.claims.get(plan.TENSOR_STORAGE)
        return mods is not None and O_PROJ in mods.modules

    listed = copy(pristine["r7"], tmp_path / "listed")
    _dense_exl3(listed, listed=True)
    assert claimed(listed) and "EX022" not in run(listed).findings.codes()
    # no tail, a non-empty embedded map without the linear, the linear in the file's map only:
    # the runtime holds the embedded map and never reads the file's
    only_file = copy(pristine["r7"], tmp_path / "file")
    _dense_exl3(only_file, listed=True)
    record = json.loads((only_file / "config.json").read_text())["quantization_config"]
    record = record["tensor_storage"].pop(O_PROJ)

    def move(c: dict) -> None:
        c.pop("hybrid_tr3_tail")
        c["quantization_config"]["tensor_storage"] = {"lm_head": {"quant_format": "exl3"}}

    edit_json(only_file / "config.json", move)
    edit_json(
        only_file / "quantization_config.json",
        lambda q: q.setdefault("tensor_storage", {}).update({O_PROJ: record}),
    )
    assert not claimed(only_file) and "EX022" in run(only_file).findings.codes()


@pytest.mark.parametrize(
    ("proj", "field"), [("gate_proj", "suh"), ("up_proj", "suh"), ("down_proj", "svh")]
)
def test_expert_0s_own_hidden_side_vector_is_an_error(
    pristine: dict[str, Path], tmp_path: Path, proj: str, field: str
) -> None:
    # the runtime loads r7_shared.gate_up_suh / down_svh as expert 0's: its own copy would be
    # served for every expert
    root = copy(pristine["r7"], tmp_path / "ckpt")
    put(f"{E0}.{proj}.{field}", "F16", f16(128), L1)(root)
    (f,) = [f for f in run(root).findings if f.code == "R7029"]
    assert f.level is Severity.ERROR and "every expert" in f.message


def test_another_experts_hidden_side_vector_is_an_error_too(
    pristine: dict[str, Path], tmp_path: Path
) -> None:
    # kept by the runtime beside the shared one: served by a single-K layer, not by a tiered one
    root = copy(pristine["r7"], tmp_path / "ckpt")
    put("model.layers.1.mlp.experts.1.gate_proj.suh", "F16", f16(128), L1)(root)
    (f,) = [f for f in run(root).findings if f.code == "R7029"]
    assert f.level is Severity.ERROR and "tiers" in f.message


_E0G = f"{E0}.gate_proj"


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        (("trellis", "suh", "svh"), "EX032"),  # no marker: the runtime expects none
        (("trellis", "suh", "svh", "mul1"), "EX032"),  # mul1 expected, the expert has mcg
    ],
)
def test_an_r7_experts_tensor_storage_record_is_checked(
    pristine: dict[str, Path], tmp_path: Path, fields: tuple[str, ...], code: str
) -> None:
    # a record the runtime finds for an expert projection decides its codebook before the R7
    # block does
    root = copy(pristine["r7"], tmp_path / "ckpt")
    record = {"quant_format": "exl3", "stored_tensors": {f"{_E0G}.{f}": {} for f in fields}}
    edit_qc(root, lambda q: q.setdefault("tensor_storage", {}).update({_E0G: record}))
    hits = [f for f in run(root).findings if f.code == code]
    assert hits and hits[0].level is Severity.ERROR


@pytest.mark.parametrize("tail", [False, True])
def test_r7_records_are_validated_only_where_the_runtime_validates_them(
    tmp_path: Path, tail: bool
) -> None:
    # without a carried tail the config step validates every exl3 record (an expert record
    # written without suh is refused); with one it returns first, and nothing reads the record
    # but its codebook suffix
    from dataclasses import replace

    from make_examples import r7_tiny_spec

    from exl3tool.synth.r7 import build_r7

    root = build_r7(tmp_path / "r7", replace(r7_tiny_spec(), mtp=tail))
    fields = {f"{_E0G}.{f}": {} for f in ("trellis", "svh", "mcg")}
    record = {"quant_format": "exl3", "stored_tensors": fields}
    edit_qc(root, lambda q: q.setdefault("tensor_storage", {}).update({_E0G: record}))
    assert ("EX025" in run(root).findings.codes()) is not tail


def test_a_stale_r7_record_of_a_module_not_shipped_is_not_checked(
    pristine: dict[str, Path], tmp_path: Path
) -> None:
    root = copy(pristine["r7"], tmp_path / "ckpt")
    gone = "model.layers.3.self_attn.q_b_proj"  # no such module in the checkpoint
    fields = {f"{gone}.{f}": {} for f in ("trellis", "suh", "svh", "mcg")}
    record = {"quant_format": "exl3", "stored_tensors": fields}
    edit_qc(root, lambda q: q.setdefault("tensor_storage", {}).update({gone: record}))
    assert not {"EX021", "EX023", "EX025"} & run(root).findings.codes()


def test_an_mtp_layer_not_shipped_is_no_moe_layer_to_claim(
    pristine: dict[str, Path], tmp_path: Path
) -> None:
    # num_nextn_predict_layers 2: layer 3 is carried, layer 4 is not shipped; the target model
    # builds num_hidden_layers layers and a draft only what it has weights for
    root = copy(pristine["r7"], tmp_path / "ckpt")
    config(lambda c: c.update(num_nextn_predict_layers=2))(root)
    assert "R7035" not in run(root).findings.codes()
    config(lambda c: c.update(first_k_dense_replace=0))(root)  # layer 0: MoE, unclaimed
    assert "R7035" in run(root).findings.codes()


def test_hostile_layer_counts_give_one_r7035_and_no_long_scan(
    pristine: dict[str, Path], tmp_path: Path
) -> None:
    root = copy(pristine["r7"], tmp_path / "ckpt")
    config(lambda c: c.update(num_hidden_layers=60000, first_k_dense_replace=0))(root)
    config(lambda c: c.update(num_nextn_predict_layers=5000))(root)  # none of them shipped
    hits = [f for f in run(root).findings if f.code == "R7035"]
    assert len(hits) == 1 and "layers 0, 4-59999" in hits[0].message  # 1-2: R7, 3: the tail


def test_an_r7_record_for_a_linear_stored_unquantized_is_ex021(
    pristine: dict[str, Path], tmp_path: Path
) -> None:
    root = copy(pristine["r7"], tmp_path / "ckpt")
    fields = {f"{O_PROJ}.{f}": {} for f in ("trellis", "suh", "svh", "mcg")}
    record = {"quant_format": "exl3", "stored_tensors": fields}
    edit_qc(root, lambda q: q.setdefault("tensor_storage", {}).update({O_PROJ: record}))
    assert "EX021" in run(root).findings.codes()


def test_a_byte_identical_copy_of_the_shared_vector_is_only_a_warning(
    pristine: dict[str, Path], tmp_path: Path
) -> None:
    from checks_fixtures import load_shard

    root = copy(pristine["r7"], tmp_path / "ckpt")
    tensors, _ = load_shard(root / L1)
    dtype, shared = tensors["model.layers.1.mlp.experts.r7_shared.gate_up_suh"]
    put("model.layers.1.mlp.experts.1.gate_proj.suh", dtype, shared.copy(), L1)(root)
    (f,) = [f for f in run(root).findings if f.code == "R7029"]
    assert f.level is Severity.WARNING and "byte-identical" in f.message


@pytest.mark.parametrize(
    ("name", "where"),
    [
        ("model.layers.1.mlp.experts.r7_shared.gate_suh", L1),  # no such shared vector
        ("model.layers.0.mlp.experts.r7_shared.down_svh", L1),  # a dense layer
        ("model.layers.3.mlp.experts.r7_shared.gate_up_suh", MTP),  # the carried tail's layer
        ("model.layers.1.mlp.experts.shared_h.gate_proj.rank0.suh", L1),  # not a tail layer
        ("model.layers.1.mlp.experts.gate_up_suh", L1),  # no expert, no projection
    ],
)
def test_expert_namespace_names_the_loader_cannot_place_are_r7031(
    pristine: dict[str, Path], tmp_path: Path, name: str, where: str
) -> None:
    root = copy(pristine["r7"], tmp_path / "ckpt")
    put(name, "F16", f16(128), where)(root)
    hits = [f for f in run(root).findings if f.code == "R7031"]
    assert [f.location.tensor for f in hits] == [name]
    assert hits[0].level is Severity.ERROR


@pytest.mark.parametrize(
    ("edit", "codes"),
    [
        ({"bits": "4"}, set()),
        ({"bits": " 4.0 "}, set()),
        ({"bits": 4}, set()),
        ({"bits": "4e0"}, set()),
        ({"moe_layers": ["1", "1"]}, set()),
        ({"moe_layers": [" 1", 1.0]}, set()),
        ({"tp": "2"}, set()),
        ({"experts_per_layer": "4"}, set()),
        ({"bits": "4.5"}, {"RS020"}),
        ({"bits": "2"}, {"RS020", "RS008"}),
        ({"bits": "nan"}, {"RS001"}),
        ({"bits": "inf"}, {"RS020"}),
        ({"bits": "x"}, {"RS001"}),
        ({"bits": True}, {"RS001"}),
        ({"moe_layers": ["1.0", "1"]}, {"RS001"}),
        ({"moe_layers": [1.5, 1]}, {"RS001"}),
        ({"moe_layers": [True, 1]}, {"RS001"}),
        ({"tp": "two"}, {"RS001"}),
        ({"experts_per_layer": "0"}, {"RS001"}),
    ],
)
def test_tail_fields_are_read_as_the_runtime_reads_them(
    pristine: dict[str, Path], tmp_path: Path, edit: dict, codes: set[str]
) -> None:
    # Exl3Config._configure_rank_sliced: float(bits), int() of moe_layers, tp and
    # experts_per_layer; what they read unchanged is the value written as a number
    root = copy(pristine["rank-sliced"], tmp_path / "ckpt")
    baseline = {f.code for f in run(root, ValidateOptions(tp=2)).findings}
    tail(lambda t: t.update(edit))(root)
    got = {f.code for f in run(root, ValidateOptions(tp=2)).findings}
    assert got - baseline == codes


def test_plan_reads_the_tail_tp_as_the_runtime_does(
    pristine: dict[str, Path], tmp_path: Path
) -> None:
    from exl3tool.actions.plan import PlanOptions
    from exl3tool.actions.plan import run as run_plan

    root = copy(pristine["rank-sliced"], tmp_path / "ckpt")
    tail(lambda t: t.update(tp="2"))(root)
    assert "RS004" not in run_plan(PlanOptions(str(root), tp=2)).findings.codes()
    assert "RS004" in run_plan(PlanOptions(str(root), tp=4)).findings.codes()


def test_records_of_other_formats_need_no_stored_tensors(
    pristine: dict[str, Path], tmp_path: Path
) -> None:
    # Exl3Config._validate_storage_metadata skips every record whose quant_format is not
    # exl3, and reads an exl3 record's stored tensors by their last name part
    root = copy(pristine["exl3"], tmp_path / "ckpt")

    def strip(ts: dict) -> None:
        for rec in ts.values():
            if rec.get("quant_format") != "exl3":
                rec.pop("stored_tensors", None)

    baseline = run(root).findings
    storage(strip)(root)
    assert list(run(root).findings) == list(baseline)  # nothing more to say
    storage(lambda ts: ts.update({"model.x": ["not", "an", "object"]}))(root)
    assert "EX025" in run(root).findings.codes()
    storage(
        lambda ts: (
            ts.pop("model.x") and ts[Q].update(stored_tensors=sorted(ts[Q]["stored_tensors"]))
        )
    )(root)
    assert "EX025" in run(root).findings.codes()  # stricter: every writer makes an object
