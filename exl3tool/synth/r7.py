"""Tiny synthetic R7 checkpoints (docs/formats/r7.md §1-§6) and legacy rank-sliced ones (§7.1).

GLM-style layout: one `r7-experts-layer-LLL.safetensors` shard per MoE layer with per-expert trellis
(K ∈ k_values per (expert, projection)), `mcg` markers, per-expert `svh` (gate/up) / `suh` (down),
the two `r7_shared` vectors; carrier (dense) tensors in another shard; per-layer manifests,
`MANIFEST.json` + `MANIFEST.sha256`; optionally the MTP layer carried under `hybrid_tr3_tail`.

`payload="sparse"` writes real headers and marker values but leaves every other payload a hole
(`truncate`), so a GLM-5.2-sized checkpoint costs no disk (benchmarks); manifests then carry
placeholder digests.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from exl3tool.io.st_writer import TensorSpec, build_header, write_arrays
from exl3tool.io.strict_json import canonical_json
from exl3tool.synth.exl3 import scales, trellis, write_json
from exl3tool.synth.literals import MCG_MARKER, PROJECTIONS

MARKER = "CODEX_ROUND7"
RECIPE_VERSION = "tr3-v4-r7-draft-1"
SCHEMA = "r7-complete-v2-checkpoint-v1"
RANK_SLICED_SCHEMA = "model.layers.{L}.mlp.experts.{E}.{proj}.rank{r}.{trellis|suh|svh|mcg}"
PLACEHOLDER_SHA = "0" * 64
CARRIER_SHARD = "model-carrier-00001-of-00001.safetensors"
MTP_SHARD = "model-mtp.safetensors"

KChooser = Callable[[int, int, str], int]  # (layer, expert, proj) -> K


def layer_shard(layer: int) -> str:
    return f"r7-experts-layer-{layer:03d}.safetensors"


def layer_manifest(layer: int) -> str:
    return f"r7-experts-layer-{layer:03d}.json"


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- tensor sinks: one enumeration of names, two ways to materialise payloads ------------------


class _Sink:
    """Collects one shard's tensors in order; `random` makes arrays, `sparse` only specs."""

    def __init__(self, rng: np.random.Generator, sparse: bool) -> None:
        self.rng = rng
        self.sparse = sparse
        self.specs: list[TensorSpec] = []
        self.arrays: dict[str, np.ndarray] = {}
        self.markers: dict[str, int] = {}

    def _add(self, name: str, dtype: str, shape: tuple[int, ...], make: Callable[[], np.ndarray]):
        self.specs.append(TensorSpec(name, dtype, shape))
        if not self.sparse:
            self.arrays[name] = make()

    def trellis(self, name: str, k_in: int, n_out: int, k: int) -> None:
        shape = (k_in // 16, n_out // 16, 16 * k)
        self._add(name, "I16", shape, lambda: trellis(self.rng, k_in, n_out, k))

    def vector(self, name: str, n: int, like: str | None = None) -> None:
        """Random scales, or the bytes of the earlier vector `like` (a rank's replica)."""
        if like is None:
            self._add(name, "F16", (n,), lambda: scales(self.rng, n))
        else:
            self._add(name, "F16", (n,), lambda: self.arrays[like].copy())

    def mcg(self, name: str) -> None:
        self.markers[name] = MCG_MARKER
        self._add(name, "I32", (), lambda: np.array(MCG_MARKER, dtype="<i4"))

    def weight(self, name: str, shape: tuple[int, ...], dtype: str = "BF16") -> None:
        n = int(np.prod(shape))

        def make() -> np.ndarray:
            a = scales(self.rng, n, 0.5).reshape(shape)
            # BF16 = the top half of the fp32 pattern (round toward zero is fine for noise)
            if dtype == "BF16":
                return (a.astype("<f4").view("<u4") >> 16).astype("<u2")
            return a.astype("<f4") if dtype == "F32" else a

        self._add(name, dtype, shape, make)

    def write(self, path: Path, metadata: Mapping[str, str] | None) -> dict[str, str]:
        """Write the shard; return tensor name -> payload sha256 (placeholders when sparse)."""
        if not self.sparse:
            with open(path, "wb") as fh:
                write_arrays(fh, self.arrays, metadata, {s.name: s.dtype for s in self.specs})
            return {
                n: sha256_hex(np.ascontiguousarray(a).tobytes()) for n, a in self.arrays.items()
            }
        header = build_header(self.specs, metadata)
        offsets: dict[str, int] = {}
        pos = len(header)
        for s in self.specs:
            offsets[s.name] = pos
            pos += s.nbytes
        with open(path, "wb") as fh:
            fh.write(header)
            fh.truncate(pos)
            for name, value in self.markers.items():
                fh.seek(offsets[name])
                fh.write(np.array(value, dtype="<i4").tobytes())
        return {s.name: PLACEHOLDER_SHA for s in self.specs}


def _shape_total(specs: list[TensorSpec]) -> int:
    return sum(s.nbytes for s in specs)


# --- rank-sliced expert layers (§7.1 slice geometry) --------------------------------------------


def rank_sliced_layer(
    sink: _Sink, layer: int, n_experts: int, hidden: int, inter: int, tp: int, k_of: KChooser
) -> None:
    """Experts of one layer as `…{proj}.rank{r}.{trellis|suh|svh|mcg}`, each rank's slice baked in."""
    part = inter // tp
    for e in range(n_experts):
        for proj in PROJECTIONS:
            k = k_of(layer, e, proj)
            first = f"model.layers.{layer}.mlp.experts.{e}.{proj}.rank0"
            for r in range(tp):
                p = f"model.layers.{layer}.mlp.experts.{e}.{proj}.rank{r}"
                if proj == "down_proj":  # tile axis 0 split; suh sliced, svh replicated
                    sink.trellis(f"{p}.trellis", part, hidden, k)
                    sink.vector(f"{p}.suh", part)
                    sink.vector(f"{p}.svh", hidden, like=f"{first}.svh" if r else None)
                else:  # tile axis 1 split; svh sliced, suh replicated
                    sink.trellis(f"{p}.trellis", hidden, part, k)
                    sink.vector(f"{p}.suh", hidden, like=f"{first}.suh" if r else None)
                    sink.vector(f"{p}.svh", part)
                sink.mcg(f"{p}.mcg")


# --- R7 ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class R7Spec:
    """Shape of a synthetic R7 checkpoint. MoE layers are [first_moe_layer, num_hidden_layers-1];
    the carried MTP layer (when `mtp`) is layer `num_hidden_layers` (GLM-5.2: 3..77 and 78)."""

    num_hidden_layers: int = 3
    first_moe_layer: int = 1
    n_experts: int = 4
    hidden: int = 128
    moe_intermediate: int = 128
    k_values: tuple[int, ...] = (3, 4, 5)
    k_map: Mapping[tuple[int, int, str], int] = field(default_factory=dict)  # overrides
    mtp: bool = True
    mtp_bits: int = 4
    mtp_tp: int = 1  # the carried layer's rank slices (its tail's "tp")
    quant_method: str = "modelopt"
    dense_width: int = 32  # small side of carrier (non-expert) tensors
    vocab: int = 64
    payload: str = "random"  # "random" | "sparse"
    seed: int = 0

    @property
    def moe_layers(self) -> tuple[int, int]:
        return (self.first_moe_layer, self.num_hidden_layers - 1)


def _k_chooser(spec: R7Spec) -> KChooser:
    rng = np.random.default_rng([spec.seed, 7])
    cache: dict[tuple[int, int, str], int] = {}

    def k_of(layer: int, e: int, proj: str) -> int:
        key = (layer, e, proj)
        if key not in cache:
            cache[key] = spec.k_map.get(key) or int(spec.k_values[rng.integers(len(spec.k_values))])
        return cache[key]

    return k_of


def r7_block(spec: R7Spec, target_bpw: str) -> dict[str, Any]:
    """The `r7_routed_experts` block as the R7 assembler writes it (§2.2)."""
    first, last = spec.moe_layers
    block: dict[str, Any] = {
        "marker": MARKER,
        "recipe_version": RECIPE_VERSION,
        "schema": SCHEMA,
        "feature": "r7-asymmetric-two-stack",
        "feature_version": 1,
        "requires_loader_feature": "r7-asymmetric-two-stack",
        "schema_version": 2,
        "moe_layers": [first, last],
        "bits": "mixed_tensor",
        "k_values": sorted(spec.k_values),
        "target_bpw": target_bpw,
        "codebook": "mcg",
        "tp_slice_quantum": 128,
        "bit_map_manifests": [layer_manifest(i) for i in range(first, last + 1)],
    }
    if spec.mtp:
        block["mtp_layer_78"] = "carried"
    return block


def _carrier_tensors(sink: _Sink, spec: R7Spec) -> None:
    h = spec.hidden
    sink.weight("model.embed_tokens.weight", (spec.vocab, h))
    for layer in range(spec.num_hidden_layers):
        _dense_layer(sink, spec, layer, moe=layer >= spec.first_moe_layer)
    sink.weight("model.norm.weight", (h,))
    sink.weight("lm_head.weight", (spec.vocab, h))


def _dense_layer(sink: _Sink, spec: R7Spec, layer: int, moe: bool) -> None:
    h, w = spec.hidden, spec.dense_width
    p = f"model.layers.{layer}"
    sink.weight(f"{p}.input_layernorm.weight", (h,))
    sink.weight(f"{p}.post_attention_layernorm.weight", (h,))
    sink.weight(f"{p}.self_attn.q_a_proj.weight", (w, h))
    sink.weight(f"{p}.self_attn.kv_a_proj_with_mqa.weight", (w, h))
    sink.weight(f"{p}.self_attn.o_proj.weight", (h, w))
    if moe:
        sink.weight(f"{p}.mlp.gate.weight", (spec.n_experts, h))
        sink.weight(f"{p}.mlp.gate.e_score_correction_bias", (spec.n_experts,), "F32")
        for proj, shape in (("gate_proj", (w, h)), ("up_proj", (w, h)), ("down_proj", (h, w))):
            sink.weight(f"{p}.mlp.shared_experts.{proj}.weight", shape)
    else:
        for proj, shape in (("gate_proj", (w, h)), ("up_proj", (w, h)), ("down_proj", (h, w))):
            sink.weight(f"{p}.mlp.{proj}.weight", shape)


def _expert_layer(sink: _Sink, spec: R7Spec, layer: int, k_of: KChooser) -> dict[str, int]:
    """One MoE layer's R7 tensors (§3.1); returns its bit_map."""
    h, i = spec.hidden, spec.moe_intermediate
    bit_map: dict[str, int] = {}
    for e in range(spec.n_experts):
        for proj in PROJECTIONS:
            p = f"model.layers.{layer}.mlp.experts.{e}.{proj}"
            k = k_of(layer, e, proj)
            bit_map[p] = k
            if proj == "down_proj":
                sink.trellis(f"{p}.trellis", i, h, k)
                sink.mcg(f"{p}.mcg")
                sink.vector(f"{p}.suh", i)
            else:
                sink.trellis(f"{p}.trellis", h, i, k)
                sink.mcg(f"{p}.mcg")
                sink.vector(f"{p}.svh", i)
    sink.vector(f"model.layers.{layer}.mlp.experts.r7_shared.gate_up_suh", h)
    sink.vector(f"model.layers.{layer}.mlp.experts.r7_shared.down_svh", h)
    return bit_map


def _layer_manifest(
    spec: R7Spec, layer: int, bit_map: dict[str, int], payload: dict[str, str], shard_sha: str
) -> dict[str, Any]:
    shared = f"model.layers.{layer}.mlp.experts.r7_shared"
    vector_refs, roundtrip = {}, {}
    for prefix in bit_map:
        if prefix.endswith("down_proj"):
            vector_refs[prefix] = {"suh": f"{prefix}.suh", "svh": f"{shared}.down_svh"}
        else:
            vector_refs[prefix] = {"suh": f"{shared}.gate_up_suh", "svh": f"{prefix}.svh"}
        roundtrip[prefix] = {
            "packed_sha256": payload[f"{prefix}.trellis"],
            "reconstruction_sha256": sha256_hex(f"recon:{prefix}".encode()),
        }
    experts = [str(e) for e in range(spec.n_experts)]
    final = {}
    for e in experts:
        names = sorted(n for n in payload if n.startswith(f"model.layers.{layer}.mlp.experts.{e}."))
        final[e] = sha256_hex("".join(payload[n] for n in names).encode())
    return {
        "marker": MARKER,
        "recipe_version": RECIPE_VERSION,
        "schema_version": 2,
        "layer": layer,
        "shard": layer_shard(layer),
        "shard_sha256": shard_sha,
        "payload_sha256": payload,
        "bit_map": bit_map,
        "allocation_bit_units": sum(bit_map.values()),
        "allocation_target_bpw": _bpw(bit_map.values()),
        "vector_refs": vector_refs,
        "roundtrip_hashes": roundtrip,
        "shared_vectors": {
            "gate_up_suh": f"{shared}.gate_up_suh",
            "down_svh": f"{shared}.down_svh",
        },
        "tensor_provenance": {"source": "exl3tool.synth", "seed": spec.seed},
        "provenance": {"builder": "exl3tool.synth.r7", "recipe_version": RECIPE_VERSION},
        "permutations": {e: {"new_to_old": [0], "policy": "identity"} for e in experts},
        "final_expert_artifact_sha256": final,
    }


def _bpw(ks: Any) -> str:
    ks = list(ks)
    return f"{sum(ks) / len(ks):.4g}" if ks else "0"


def _file_sha(path: Path, sparse: bool) -> str:
    if sparse and path.suffix == ".safetensors":
        return PLACEHOLDER_SHA
    return sha256_hex(path.read_bytes())


def _prepare(root: Path) -> Path:
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    if any(root.iterdir()):
        raise FileExistsError(f"{root} is not empty")
    return root


def _mtp_tail(spec: R7Spec) -> dict[str, Any]:
    m = spec.num_hidden_layers
    return {
        "format": "exl3-trellis",
        "bits": float(spec.mtp_bits),
        "codebook": "mcg",
        "experts_per_layer": spec.n_experts,
        "moe_layers": [m, m],
        "tensor_schema": RANK_SLICED_SCHEMA,
        "tp": spec.mtp_tp,
        "rotation_layout": "per_expert_v1",
        "exllamav3_version": "1.6.5",
        "r7_compat_role": "carried_mtp78_only",
        "scope": f"only the carried MTP layer {m}; layers "
        f"{spec.moe_layers[0]}-{spec.moe_layers[1]} are governed by r7_routed_experts",
    }


def build_r7(root: Path, spec: R7Spec | None = None, **overrides: Any) -> Path:
    """Write an R7 checkpoint into `root` (created; must be empty). Returns `root`."""
    spec = dataclasses.replace(spec or R7Spec(), **overrides)
    b = _R7Build(_prepare(root), spec, np.random.default_rng(spec.seed), spec.payload == "sparse")
    carrier = _Sink(b.rng, b.sparse)
    _carrier_tensors(carrier, spec)
    b.payloads.update(b.emit(carrier, CARRIER_SHARD, {"format": "pt"}))
    if spec.mtp:
        b.mtp_payload = b.emit(_mtp_sink(b), MTP_SHARD, {"format": "pt"})
    all_bits = b.expert_layers()
    write_json(
        b.root / "model.safetensors.index.json",
        {"metadata": {"total_size": b.total}, "weight_map": dict(sorted(b.weight_map.items()))},
    )
    qcfg = _quant_config(spec, _bpw(all_bits))
    write_json(b.root / "config.json", _config(spec, qcfg))
    write_json(b.root / "quantization_config.json", qcfg)
    write_json(b.root / "MANIFEST.json", _checkpoint_manifest(b))
    seal = sha256_hex((b.root / "MANIFEST.json").read_bytes())
    (b.root / "MANIFEST.sha256").write_text(f"{seal}  MANIFEST.json\n")
    return b.root


@dataclass
class _R7Build:
    """What build_r7 accumulates while it writes shards (for the index and MANIFEST.json)."""

    root: Path
    spec: R7Spec
    rng: np.random.Generator
    sparse: bool
    weight_map: dict[str, str] = field(default_factory=dict)
    total: int = 0
    payloads: dict[str, str] = field(default_factory=dict)
    mtp_payload: dict[str, str] = field(default_factory=dict)
    layer_sha: dict[str, str] = field(default_factory=dict)
    layers_entry: dict[str, Any] = field(default_factory=dict)
    r7_count: int = 0

    def emit(self, sink: _Sink, label: str, metadata: Mapping[str, str] | None) -> dict[str, str]:
        digests = sink.write(self.root / label, metadata)
        for s in sink.specs:
            self.weight_map[s.name] = label
        self.total += _shape_total(sink.specs)
        return digests

    def expert_layers(self) -> list[int]:
        """One shard and one manifest per MoE layer (§3, §4); returns every K written."""
        spec, root = self.spec, self.root
        k_of = _k_chooser(spec)
        all_bits: list[int] = []
        first, last = spec.moe_layers
        for layer in range(first, last + 1):
            sink = _Sink(self.rng, self.sparse)
            bit_map = _expert_layer(sink, spec, layer, k_of)
            meta = {"format": "pt", "r7_schema": "2", "r7_layer": str(layer), "r7_marker": MARKER}
            digests = self.emit(sink, layer_shard(layer), meta)
            self.r7_count += len(sink.specs)
            all_bits.extend(bit_map.values())
            shard_sha = _file_sha(root / layer_shard(layer), self.sparse)
            man = _layer_manifest(spec, layer, bit_map, digests, shard_sha)
            write_json(root / layer_manifest(layer), man)
            self.layer_sha[str(layer)] = sha256_hex((root / layer_manifest(layer)).read_bytes())
            self.layers_entry[str(layer)] = {
                "bit_units": man["allocation_bit_units"],
                "manifest": layer_manifest(layer),
                "shard": layer_shard(layer),
            }
        return all_bits


def _mtp_sink(b: _R7Build) -> _Sink:
    """The carried MTP layer (§6): dense parts plus rank-sliced experts under the tail."""
    spec, m = b.spec, b.spec.num_hidden_layers
    mtp = _Sink(b.rng, b.sparse)
    mtp.weight(f"model.layers.{m}.enorm.weight", (spec.hidden,))
    mtp.weight(f"model.layers.{m}.hnorm.weight", (spec.hidden,))
    mtp.weight(f"model.layers.{m}.eh_proj.weight", (spec.hidden, 2 * spec.hidden))
    _dense_layer(mtp, spec, m, moe=True)
    rank_sliced_layer(
        mtp,
        m,
        spec.n_experts,
        spec.hidden,
        spec.moe_intermediate,
        spec.mtp_tp,
        lambda *_: spec.mtp_bits,
    )
    return mtp


def _checkpoint_manifest(b: _R7Build) -> dict[str, Any]:
    """MANIFEST.json (§5) over every file written so far."""
    files = sorted(p.name for p in b.root.iterdir() if p.is_file())
    binding = {"schema": SCHEMA, "layers": b.layer_sha, "seed": b.spec.seed}
    return {
        "marker": MARKER,
        "recipe_version": RECIPE_VERSION,
        "schema": SCHEMA,
        "carrier": "synthetic/GLM-NVFP4-carrier",
        "carrier_inventory_sha256": sha256_hex(b"carrier-inventory"),
        "carrier_index_sha256": sha256_hex(b"carrier-index"),
        "walk_manifest_sha256": sha256_hex(b"walk-manifest"),
        "source_inventory_sha256": sha256_hex(b"source-inventory"),
        "numeric_environment_sha256": sha256_hex(b"numeric-environment"),
        "carried_tensor_payload_sha256": b.payloads,
        "files_sha256": {f: _file_sha(b.root / f, b.sparse) for f in files},
        "tensor_count": len(b.weight_map),
        "carried_tensor_count": len(b.payloads) + len(b.mtp_payload),
        "r7_tensor_count": b.r7_count,
        "mtp78_carried_tensor_payload_sha256": b.mtp_payload,
        "assembly_transaction_id": sha256_hex(canonical_json(binding)),
        "r7_layer_manifest_sha256": b.layer_sha,
        "layers": b.layers_entry,
    }


def _quant_config(spec: R7Spec, target_bpw: str) -> dict[str, Any]:
    q: dict[str, Any] = {"quant_method": spec.quant_method}
    if spec.quant_method == "modelopt":  # the NVFP4 carrier's stamp, copied by the assembler (§1)
        q["quant_algo"] = "NVFP4"
        q["config_groups"] = {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 4, "type": "float", "group_size": 16},
                "input_activations": {"num_bits": 4, "type": "float", "group_size": 16},
            }
        }
        q["ignore"] = ["lm_head", "model.layers.*.mlp.gate"]
    q["r7_routed_experts"] = r7_block(spec, target_bpw)
    return q


def _config(spec: R7Spec, qcfg: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {
        "architectures": ["GlmMoeDsaForCausalLM"],
        "model_type": "glm_moe_dsa",
        "hidden_size": spec.hidden,
        "intermediate_size": spec.dense_width,
        "moe_intermediate_size": spec.moe_intermediate,
        "n_routed_experts": spec.n_experts,
        "n_shared_experts": 1,
        "num_experts_per_tok": min(2, spec.n_experts),
        "num_hidden_layers": spec.num_hidden_layers,
        "first_k_dense_replace": spec.first_moe_layer,
        "num_nextn_predict_layers": 1 if spec.mtp else 0,
        "q_lora_rank": spec.dense_width,
        "kv_lora_rank": spec.dense_width,
        "vocab_size": spec.vocab,
        "torch_dtype": "bfloat16",
        "quantization_config": qcfg,
    }
    if spec.mtp:
        config["hybrid_tr3_tail"] = _mtp_tail(spec)
    return config


# --- legacy rank-sliced checkpoint (§7.1) -------------------------------------------------------


@dataclass(frozen=True)
class RankSlicedSpec:
    """A legacy `hybrid_tr3_tail` (`tp`) checkpoint: experts baked per rank."""

    num_hidden_layers: int = 2
    first_moe_layer: int = 1
    n_experts: int = 4
    hidden: int = 128
    moe_intermediate: int = 256
    tp: int = 2
    bits: int = 4
    dense_width: int = 32
    vocab: int = 64
    seed: int = 0


def build_rank_sliced(root: Path, spec: RankSlicedSpec | None = None, **overrides: Any) -> Path:
    """Write a legacy rank-sliced checkpoint into `root` (created; must be empty)."""
    spec = dataclasses.replace(spec or RankSlicedSpec(), **overrides)
    root = _prepare(root)
    rng = np.random.default_rng(spec.seed)
    r7like = R7Spec(
        num_hidden_layers=spec.num_hidden_layers,
        first_moe_layer=spec.first_moe_layer,
        n_experts=spec.n_experts,
        hidden=spec.hidden,
        moe_intermediate=spec.moe_intermediate,
        dense_width=spec.dense_width,
        vocab=spec.vocab,
        mtp=False,
    )
    sink = _Sink(rng, False)
    _carrier_tensors(sink, r7like)
    for layer in range(spec.first_moe_layer, spec.num_hidden_layers):
        rank_sliced_layer(
            sink, layer, spec.n_experts, spec.hidden, spec.moe_intermediate, spec.tp,
            lambda *_: spec.bits,
        )  # fmt: skip
    label = "model.safetensors"
    sink.write(root / label, {"format": "pt"})
    config = _config(r7like, {"quant_method": "modelopt", "quant_algo": "NVFP4"})
    config["hybrid_tr3_tail"] = {
        "format": "exl3-trellis",
        "bits": float(spec.bits),
        "codebook": "mcg",
        "experts_per_layer": spec.n_experts,
        "moe_layers": [spec.first_moe_layer, spec.num_hidden_layers - 1],
        "tensor_schema": RANK_SLICED_SCHEMA,
        "tp": spec.tp,
        "rotation_layout": "per_expert_v1",
        "exllamav3_version": "1.6.5",
    }
    write_json(root / "config.json", config)
    return root
