"""Tiny synthetic plain EXL3 checkpoints (`tensor_storage` profile, docs/formats/exl3.md §1-§2, §7.4).

Any int16 bit pattern is a valid trellis, so random words make a decodable checkpoint. Everything
is derived from one seeded `numpy.random.Generator`, so the bytes are deterministic.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from exl3tool.io.dtypes import TORCH_NAMES
from exl3tool.io.st_writer import spec_of, write_arrays
from exl3tool.synth.literals import MCG_MARKER, MCG_MULTIPLIER, MUL1_MARKER, MUL1_MULTIPLIER

CODEBOOKS = ("mcg", "mul1", "3inst")


# --- payload helpers (shared by synth.r7 and other builders) ----------------------------------


def trellis(rng: np.random.Generator, k_in: int, n_out: int, k: float) -> np.ndarray:
    """Random trellis words `I16 [k_in/16, n_out/16, 16*K]` (every bit pattern is valid)."""
    shape = (k_in // 16, n_out // 16, int(16 * k))
    n = shape[0] * shape[1] * shape[2]
    return np.frombuffer(rng.bytes(2 * n), dtype="<i2").reshape(shape)


def scales(rng: np.random.Generator, n: int, magnitude: float = 0.05) -> np.ndarray:
    """Finite signed fp16 scales, built with exact integer arithmetic (platform independent)."""
    u = np.frombuffer(rng.bytes(2 * n), dtype="<u2").astype(np.int64)
    return (((u % 2001) - 1000) * (magnitude / 1000.0)).astype("<f2")


def marker(codebook: str) -> np.ndarray | None:
    """The int32 scalar marker selecting `codebook` (docs/formats/exl3.md §1), or None for 3INST."""
    if codebook == "mcg":
        return np.array(MCG_MARKER, dtype="<i4")
    if codebook == "mul1":
        return np.array(MUL1_MARKER, dtype="<i4")
    return None


def linear(
    rng: np.random.Generator, prefix: str, k_in: int, n_out: int, k: float, codebook: str
) -> dict[str, np.ndarray]:
    """The tensors of one EXL3 linear `{prefix}.trellis/.suh/.svh[.mcg|.mul1]`."""
    out = {
        f"{prefix}.trellis": trellis(rng, k_in, n_out, k),
        f"{prefix}.suh": scales(rng, k_in),
        f"{prefix}.svh": scales(rng, n_out),
    }
    m = marker(codebook)
    if m is not None:
        out[f"{prefix}.{codebook}"] = m
    return out


def write_json(path: Path, value: Any) -> None:
    """Deterministic, human-readable JSON (sorted keys, 2-space indent, trailing newline)."""
    path.write_text(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=True) + "\n")


def write_shard(
    path: Path, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None
) -> None:
    with open(path, "wb") as fh:
        write_arrays(fh, tensors, metadata)


def storage_entry(tensors: Mapping[str, np.ndarray], k: float | None, codebook: str | None) -> dict:
    """One `tensor_storage` record (docs/formats/exl3.md §2) for a leaf module's tensors."""
    stored = {}
    for name, a in tensors.items():
        s = spec_of(name, a)
        stored[name] = {"shape": list(s.shape), "n_bytes": s.nbytes, "dtype": TORCH_NAMES[s.dtype]}
    entry: dict[str, Any] = {"stored_tensors": stored}
    if k is not None:
        entry["quant_format"] = "exl3"
        entry["bits_per_weight"] = k
        if codebook == "mcg":
            entry["mcg_multiplier"] = MCG_MULTIPLIER
        elif codebook == "mul1":
            entry["mul1_multiplier"] = MUL1_MULTIPLIER
    return entry


def shard_names(count: int) -> list[str]:
    if count <= 1:
        return ["model.safetensors"]
    return [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


def write_sharded(
    root: Path,
    modules: list[dict[str, np.ndarray]],
    shards: int,
    metadata: Mapping[str, str] | None,
) -> dict[str, str]:
    """Split whole modules over `shards` files (never a module across two, §7.4); write the index
    when there is more than one. Returns tensor name -> shard file."""
    names = shard_names(shards)
    buckets: list[dict[str, np.ndarray]] = [{} for _ in names]
    for i, mod in enumerate(modules):
        buckets[i * len(names) // max(len(modules), 1)].update(mod)
    weight_map: dict[str, str] = {}
    total = 0
    for label, bucket in zip(names, buckets, strict=True):
        write_shard(root / label, bucket, metadata)
        for n, a in bucket.items():
            weight_map[n] = label
            total += spec_of(n, a).nbytes
    if len(names) > 1:
        write_json(
            root / "model.safetensors.index.json",
            {"metadata": {"total_size": total}, "weight_map": weight_map},
        )
    return weight_map


# --- plain EXL3 checkpoint --------------------------------------------------------------------


@dataclass(frozen=True)
class Exl3Spec:
    """Shape of a synthetic plain EXL3 checkpoint; every size a multiple of 128 (§1.4)."""

    num_layers: int = 2
    hidden: int = 256
    kv_dim: int = 128
    intermediate: int = 256  # dense MLP
    moe_layers: tuple[int, ...] = (1,)  # these layers use a routed MoE instead of the dense MLP
    n_experts: int = 4
    moe_intermediate: int = 128
    k_values: tuple[float, ...] = (2, 3, 4)  # K is drawn per linear from these
    codebook: str = "mixed"  # mcg | mul1 | 3inst | mixed (cycles through all three)
    shards: int = 1
    vocab: int = 256
    seed: int = 0


def _codebook_for(spec: Exl3Spec, i: int) -> str:
    return CODEBOOKS[i % 3] if spec.codebook == "mixed" else spec.codebook


def build_exl3(root: Path, spec: Exl3Spec | None = None, **overrides: Any) -> Path:
    """Write a plain EXL3 checkpoint into `root` (created; must be empty). Returns `root`."""
    spec = dataclasses.replace(spec or Exl3Spec(), **overrides)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    if any(root.iterdir()):
        raise FileExistsError(f"{root} is not empty")
    rng = np.random.default_rng(spec.seed)
    h = spec.hidden
    modules: list[dict[str, np.ndarray]] = []
    storage: dict[str, dict] = {}
    n_lin = 0

    def plain(prefix: str, shape: tuple[int, ...]) -> None:
        t = {f"{prefix}.weight": scales(rng, int(np.prod(shape)), 0.5).reshape(shape)}
        modules.append(t)
        storage[prefix] = storage_entry(t, None, None)

    def quant(prefix: str, k_in: int, n_out: int) -> None:
        nonlocal n_lin
        cb = _codebook_for(spec, n_lin)
        n_lin += 1
        choices = [k for k in spec.k_values if k == int(k) or cb == "mul1"]
        k = choices[int(rng.integers(len(choices)))]
        k = int(k) if k == int(k) else float(k)
        t = linear(rng, prefix, k_in, n_out, k, cb)
        modules.append(t)
        storage[prefix] = storage_entry(t, k, cb)

    plain("model.embed_tokens", (spec.vocab, h))
    for layer in range(spec.num_layers):
        p = f"model.layers.{layer}"
        plain(f"{p}.input_layernorm", (h,))
        plain(f"{p}.post_attention_layernorm", (h,))
        for proj, n_out in (("q_proj", h), ("k_proj", spec.kv_dim), ("v_proj", spec.kv_dim)):
            quant(f"{p}.self_attn.{proj}", h, n_out)
        quant(f"{p}.self_attn.o_proj", h, h)
        if layer in spec.moe_layers:
            plain(f"{p}.mlp.gate", (spec.n_experts, h))
            i = spec.moe_intermediate
            for e in range(spec.n_experts):
                quant(f"{p}.mlp.experts.{e}.gate_proj", h, i)
                quant(f"{p}.mlp.experts.{e}.up_proj", h, i)
                quant(f"{p}.mlp.experts.{e}.down_proj", i, h)
        else:
            quant(f"{p}.mlp.gate_proj", h, spec.intermediate)
            quant(f"{p}.mlp.up_proj", h, spec.intermediate)
            quant(f"{p}.mlp.down_proj", spec.intermediate, h)
    plain("model.norm", (h,))
    plain("lm_head", (spec.vocab, h))

    write_sharded(root, modules, spec.shards, None)
    bits = [e["bits_per_weight"] for e in storage.values() if "bits_per_weight" in e]
    qcfg: dict[str, Any] = {
        "quant_method": "exl3",
        "version": "1.6.5",
        "bits": round(sum(bits) / len(bits), 2) if bits else 0,
        "head_bits": 16,
        "calibration": {"rows": 250, "cols": 2048},
        "out_scales": "auto",
        "codebook": "mcg" if spec.codebook == "mixed" else spec.codebook,
    }
    config = {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": h,
        "intermediate_size": spec.intermediate,
        "moe_intermediate_size": spec.moe_intermediate,
        "num_experts": spec.n_experts,
        "num_hidden_layers": spec.num_layers,
        "vocab_size": spec.vocab,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "quantization_config": qcfg,
    }
    write_json(root / "config.json", config)
    write_json(root / "quantization_config.json", {**qcfg, "tensor_storage": storage})
    return root
