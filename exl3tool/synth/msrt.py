"""Tiny synthetic MSRT bases (`exl3-msrt-base/1`) and cartridges (`fq-cartridge-adapter/3`).

Every byte is a function of the arguments (seeded per tensor), so tests, examples and the committed
fixtures can be rebuilt and compared byte for byte. Any random int16 bit pattern is a valid trellis.

Stage scales follow the producer's rule `scale = |codebook_scale| / residual_rms` (§1.1) with the
residual RMS set to `stage_rms[s]` times the base's regularized RMS (the MCG table's standard
deviation), jittered ±10 % per (expert, projection): a correction `recon(T_s) / scale_s` then has an
RMS of about `stage_rms[s]` times the base weight's, a falling ladder like a real encode.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from exl3tool.io.st_writer import write_arrays
from exl3tool.synth import literals as lit
from exl3tool.synth.literals import PROJECTIONS

CODEBOOK_SCALE = 1.24371088  # docs/formats/exl3.md §4: quantizer's codebook_scale
MCG_STD = 1.244112  # docs/formats/exl3.md §4: std of the MCG table = RMS of a random trellis decode
CREATED_UTC = "2025-01-01T00:00:00Z"
TOOL_VERSION = "exl3tool-synth/1"
VOCAB = 128
_COMPONENT_IDS = {"trellis": 0, "suh": 1, "svh": 2, "scale": 3, "router": 4, "dense": 5}

StageExperts = Sequence[int] | Mapping[int, Sequence[int]]


def _rng(seed: int, *parts: int) -> np.random.Generator:
    """A generator seeded by the tensor's coordinates, so subsets keep their bytes."""
    return np.random.default_rng([seed & 0xFFFFFFFF, *parts])


def write_safetensors(path: Path, tensors: Mapping[str, np.ndarray]) -> None:
    with open(path, "wb") as fh:
        write_arrays(fh, tensors)


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fresh_dir(out: Path) -> Path:
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    return out


# --------------------------------------------------------------------------------------------
# Base


def _expert_tensors(
    seed: int, layer: int, expert: int, hidden: int, intermediate: int, k: int
) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for pi, proj in enumerate(PROJECTIONS):
        shape = lit.trellis_shape(proj, hidden, intermediate, k)
        trellis = _rng(seed, layer, expert, pi, _COMPONENT_IDS["trellis"]).integers(
            -32768, 32768, size=shape, dtype=np.int16
        )
        n_in, n_out = shape[0] * 16, shape[1] * 16
        # suh/svh: signed per-channel scales around the magnitudes of a real regularization
        r = _rng(seed, layer, expert, pi, _COMPONENT_IDS["suh"])
        suh = (r.choice([-1.0, 1.0], n_in) * r.uniform(0.5, 1.5, n_in) * 0.02).astype(np.float16)
        r = _rng(seed, layer, expert, pi, _COMPONENT_IDS["svh"])
        svh = (r.choice([-1.0, 1.0], n_out) * r.uniform(0.5, 1.5, n_out)).astype(np.float16)
        out[lit.base_key(layer, expert, proj, "trellis")] = trellis
        out[lit.base_key(layer, expert, proj, "suh")] = suh
        out[lit.base_key(layer, expert, proj, "svh")] = svh
        out[lit.base_key(layer, expert, proj, "mcg")] = np.array(lit.MCG_MARKER, dtype=np.int32)
    return out


def write_manifest_sha256(root: Path) -> None:
    """`MANIFEST.sha256` in sha256sum format over every other file (§11), sorted by path."""
    lines = []
    for dirpath, dirs, files in os.walk(root):
        dirs.sort()
        for name in files:
            p = Path(dirpath) / name
            rel = p.relative_to(root).as_posix()
            if rel != "MANIFEST.sha256":
                lines.append(f"{sha256_file(p)}  {rel}\n")
    (root / "MANIFEST.sha256").write_text("".join(sorted(lines, key=lambda s: s[66:])))


def base_config(
    *,
    layers: Sequence[int],
    experts: int,
    hidden: int,
    intermediate: int,
    k: int,
    compatibility_sha256: str,
    compatibility_by_layer: Mapping[str, str],
) -> dict[str, Any]:
    """The base's config.json (HF fields + `quantization_config` + the closed §5 profile)."""
    layers = sorted(layers)
    tail = {
        "format": "exl3-trellis",
        "runtime_profile": lit.BASE_PROFILE,
        "bits": k,
        "codebook": "mcg",
        "moe_layers": [layers[0], layers[-1]],
        "moe_layer_coverage": list(layers),
        "tensor_schema": lit.BASE_TENSOR_SCHEMA,
        "tensor_parallel": json.loads(json.dumps(lit.BASE_TENSOR_PARALLEL)),
        "mcg_multiplier": lit.MCG_MULTIPLIER,
        "compatibility_sha256": compatibility_sha256,
        "compatibility_by_layer": dict(compatibility_by_layer),
        "experts_per_layer": experts,
    }
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "moe_intermediate_size": intermediate,
        "num_experts": experts,
        "num_experts_per_tok": min(2, experts),
        "num_hidden_layers": layers[-1] + 1,
        "vocab_size": VOCAB,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "torch_dtype": "float16",
        "quantization_config": {
            "quant_method": "exl3",
            "bits": k,
            "codebook": "mcg",
            "version": "rank-sliced",
        },
        "hybrid_tr3_tail": tail,
    }


def build_base(
    out: Path,
    *,
    layers: Sequence[int] = (3, 4),
    experts: int = 4,
    hidden: int = 256,
    intermediate: int = 256,
    k: int = 2,
    seed: int = 0,
) -> Path:
    """Write an `exl3-msrt-base/1` base at `out` (replaced if present); return `out`.

    One shard per MoE layer (experts rank0-only + router `mlp.gate.weight` fp16 + norms), one dense
    shard (embeddings, final norm, lm_head), an index, `tier_bitmap.json`, `MANIFEST.sha256`.
    The compatibility identity in config.json is computed from the written bytes by
    `exl3tool.identity.compat` (§6).
    """
    if k not in lit.BASE_K:
        raise ValueError(f"base K must be in 2..6, got {k}")
    if hidden % 128 or intermediate % 128:
        raise ValueError("hidden and intermediate sizes must be multiples of 128")
    out = _fresh_dir(Path(out))
    layers = sorted(set(layers))
    weight_map: dict[str, str] = {}
    for layer in layers:
        tensors: dict[str, np.ndarray] = {}
        for e in range(experts):
            tensors.update(_expert_tensors(seed, layer, e, hidden, intermediate, k))
        r = _rng(seed, layer, 0, 0, _COMPONENT_IDS["router"])
        tensors[f"model.layers.{layer}.mlp.gate.weight"] = (
            r.standard_normal((experts, hidden)) * 0.05
        ).astype(np.float16)
        tensors[f"model.layers.{layer}.input_layernorm.weight"] = np.ones(hidden, np.float16)
        tensors[f"model.layers.{layer}.post_attention_layernorm.weight"] = np.ones(
            hidden, np.float16
        )
        name = f"model-layer-{layer:03d}.safetensors"
        write_safetensors(out / name, tensors)
        weight_map.update(dict.fromkeys(tensors, name))
    r = _rng(seed, 0, 0, 0, _COMPONENT_IDS["dense"])
    dense = {
        "model.embed_tokens.weight": (r.standard_normal((VOCAB, hidden)) * 0.02).astype(np.float16),
        "model.norm.weight": np.ones(hidden, np.float16),
        "lm_head.weight": (r.standard_normal((VOCAB, hidden)) * 0.02).astype(np.float16),
    }
    write_safetensors(out / "model-dense.safetensors", dense)
    weight_map.update(dict.fromkeys(dense, "model-dense.safetensors"))
    total = sum(
        os.path.getsize(out / f) - _data_start(out / f) for f in sorted(set(weight_map.values()))
    )
    _write_json(
        out / "model.safetensors.index.json",
        {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
    )
    _write_json(out / "tier_bitmap.json", {str(L): {"k": [k] * experts} for L in layers})
    cfg_kw = dict(layers=layers, experts=experts, hidden=hidden, intermediate=intermediate, k=k)
    _write_json(
        out / "config.json",
        base_config(**cfg_kw, compatibility_sha256="0" * 64, compatibility_by_layer={}),
    )
    root, by_layer = _identity(out)
    _write_json(
        out / "config.json",
        base_config(**cfg_kw, compatibility_sha256=root, compatibility_by_layer=by_layer),
    )
    write_manifest_sha256(out)
    return out


def _data_start(path: Path) -> int:
    with open(path, "rb") as fh:
        return 8 + int.from_bytes(fh.read(8), "little")


def _identity(base: Path) -> tuple[str, dict[str, str]]:
    """(root, {"<L>": layer digest}) recomputed from the base's bytes by `identity.compat`."""
    from exl3tool.formats.checkpoint import load_checkpoint
    from exl3tool.identity.compat import compat_identity
    from exl3tool.rules.registry import Findings

    findings = Findings()
    ident = compat_identity(load_checkpoint(base, findings))
    return ident.root, {str(k): v for k, v in ident.layers.items()}


# --------------------------------------------------------------------------------------------
# Adapter


def _stage_sets(
    chain: Sequence[tuple[str, int]],
    experts: Sequence[StageExperts] | None,
    layers: Sequence[int],
    n_experts: int,
) -> list[dict[int, list[int]]]:
    """Per stage: {layer: sorted experts}; a layer with no experts is absent from the stage."""
    out = []
    for s in range(len(chain)):
        sel = None if experts is None else experts[s]
        per_layer: dict[int, list[int]] = {}
        for L in layers:
            if sel is None:
                es: Sequence[int] = range(n_experts)
            elif isinstance(sel, Mapping):
                es = sel.get(L, ())
            else:
                es = sel
            if es:
                per_layer[L] = sorted(set(es))
        out.append(per_layer)
    return out


def _stage_scale(seed: int, layer: int, expert: int, pi: int, s: int, rms: float) -> np.ndarray:
    jitter = 1.0 + 0.1 * _rng(seed, layer, expert, pi, _COMPONENT_IDS["scale"], s).uniform(-1, 1)
    return np.array(CODEBOOK_SCALE / (rms * MCG_STD * jitter), dtype=np.float32)


def adapter_manifest(
    *,
    base_cfg: Mapping[str, Any],
    chain: Sequence[tuple[str, int]],
    stage_sets: Sequence[Mapping[int, Sequence[int]]],
    layers: Sequence[int],
    shards: list[dict[str, Any]],
    num_tensors: int,
    assembly: str,
    chain_experts: str,
    seed: int,
) -> dict[str, Any]:
    """A complete `fq-cartridge-adapter/3` manifest (§4: all 24 fields, in order)."""
    tail = base_cfg["hybrid_tr3_tail"]
    base_label = "base"
    selected_experts = sorted({e for st in stage_sets for es in st.values() for e in es})
    chain_out = []
    parent = base_label
    for (label, k), st in zip(chain, stage_sets, strict=True):
        union = sorted({e for es in st.values() for e in es})
        declared: Any = "all" if chain_experts == "all" and union == selected_experts else union
        chain_out.append({"label": label, "k": k, "parent": parent, "experts": declared})
        parent = label
    recipe = hashlib.sha256(
        json.dumps({"chain": [list(c) for c in chain], "seed": seed}, sort_keys=True).encode()
    ).hexdigest()
    manifest = {
        "schema": lit.ADAPTER_SCHEMA,
        "assembly": assembly,
        "base": {
            "label": base_label,
            "k": int(tail["bits"]),
            "compatibility_sha256": tail["compatibility_sha256"],
            "compatibility_by_layer": {
                str(L): tail["compatibility_by_layer"][str(L)] for L in layers
            },
        },
        "chain": chain_out,
        **json.loads(json.dumps(lit.ADAPTER_CONSTANTS)),
        "tensor_parallel": {
            "layout": "full",
            "world_size": 1,
            "ranks": [0],
            "axis_by_projection": dict(lit.AXIS_BY_PROJECTION),
        },
        "shards": shards,
        "num_tensors": num_tensors,
        "selected_experts": selected_experts,
        "selected_layers": sorted(layers),
        "coverage": {
            label: {str(L): list(es) for L, es in sorted(st.items())}
            for (label, _k), st in zip(chain, stage_sets, strict=True)
        },
        "producer_verified_signer": None,
        "campaign": {
            "recipe_sha256": recipe,
            "base_model": "synthetic/tiny-moe",
            "base_revision": "synthetic",
            "encoder_sha256": None,
            "signer_pubkey": hashlib.sha256(b"exl3tool synthetic signer").hexdigest(),
            "block_size": 1,
            "moe_layers": sorted(layers),
        },
        "source_assembly": {
            "path": "assembly/fq-cartridge-assembly.json",
            "sha256": hashlib.sha256(f"assembly {assembly} {recipe}".encode()).hexdigest(),
        },
        "tool_version": TOOL_VERSION,
        "created_utc": CREATED_UTC,
    }
    return {f: manifest[f] for f in lit.ADAPTER_FIELDS}


def write_adapter_config(out: Path, manifest: Mapping[str, Any]) -> None:
    text = json.dumps(manifest, indent=2, ensure_ascii=True) + "\n"
    (Path(out) / lit.ADAPTER_CONFIG).write_bytes(text.encode())


def build_adapter(
    out: Path,
    base: Path,
    *,
    chain: Sequence[tuple[str, int]] = (("k3", 1), ("k4", 1)),
    experts: Sequence[StageExperts] | None = None,
    layers: Sequence[int] | None = None,
    layout: str = "full",
    world_size: int = 1,
    seed: int = 0,
    stage_rms: Sequence[float] = (0.3, 0.1),
    assembly: str = "synthetic-cartridge",
    chain_experts: str = "list",
) -> Path:
    """Write a valid `fq-cartridge-adapter/3` adapter for `base` at `out` (replaced); return it.

    chain: (label, K) per stage, in order. experts: None = every base expert in every stage, or per
    stage a list of experts (all layers) or {layer: experts} (absent layer = stage not there);
    sets must shrink along the chain (parent closure, §7). layers: None = every base MoE layer.
    layout "rank-sharded": the full adapter is converted by `exl3tool.tp.cartridge.shard_cartridge`
    into `world_size` ranks. chain_experts "all" writes `"experts": "all"` for stages covering
    every selected expert. stage_rms: target correction RMS per stage relative to the base weight.
    """
    from exl3tool.io.jsonfile import read_json

    base = Path(base)
    from exl3tool.rules.registry import Findings

    cfg = read_json(base / "config.json", Findings(), "config.json")
    hidden, intermediate, n_experts = lit.config_sizes(cfg)
    if cfg is None or hidden is None or intermediate is None or n_experts is None:
        raise ValueError(f"{base}: not a base built by build_base (config.json sizes missing)")
    tail = cfg["hybrid_tr3_tail"]
    layers = sorted(layers if layers is not None else tail["moe_layer_coverage"])
    if len(stage_rms) < len(chain):
        raise ValueError("stage_rms needs one value per chain stage")
    sets = _stage_sets(chain, experts, layers, n_experts)
    if layout == "rank-sharded":
        tmp = Path(tempfile.mkdtemp(prefix=".synth-full-", dir=Path(out).absolute().parent))
        try:
            full = build_adapter(
                tmp / "full",
                base,
                chain=chain,
                experts=experts,
                layers=layers,
                seed=seed,
                stage_rms=stage_rms,
                assembly=assembly,
                chain_experts=chain_experts,
            )
            from exl3tool.tp.cartridge import shard_cartridge

            if Path(out).exists():
                shutil.rmtree(out)
            shard_cartridge(full, world_size, Path(out))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return Path(out)
    if layout != "full":
        raise ValueError(f"layout must be 'full' or 'rank-sharded', got {layout!r}")
    out = _fresh_dir(Path(out))
    shards: list[dict[str, Any]] = []
    num_tensors = 0
    for layer in layers:
        tensors: dict[str, np.ndarray] = {}
        for e in range(n_experts):
            for pi, proj in enumerate(PROJECTIONS):
                for s, ((label, k), st) in enumerate(zip(chain, sets, strict=True)):
                    if e not in st.get(layer, ()):
                        continue
                    shape = lit.trellis_shape(proj, hidden, intermediate, k)
                    r = _rng(seed, layer, e, pi, _COMPONENT_IDS["trellis"], s + 1)
                    tensors[lit.stage_key(layer, e, proj, 0, "trellis", label)] = r.integers(
                        -32768, 32768, size=shape, dtype=np.int16
                    )
                    tensors[lit.stage_key(layer, e, proj, 0, "scale", label)] = _stage_scale(
                        seed, layer, e, pi, s, stage_rms[s]
                    )
        if not tensors:
            continue
        name = f"model-layer-{layer:03d}-b000.safetensors"
        write_safetensors(out / name, tensors)
        num_tensors += len(tensors)
        shards.append(
            {"path": name, "size": (out / name).stat().st_size, "sha256": sha256_file(out / name)}
        )
    manifest = adapter_manifest(
        base_cfg=cfg,
        chain=chain,
        stage_sets=sets,
        layers=[L for L in layers if any(L in st for st in sets)],
        shards=shards,
        num_tensors=num_tensors,
        assembly=assembly,
        chain_experts=chain_experts,
        seed=seed,
    )
    write_adapter_config(out, manifest)
    return out
