"""Tiny synthetic artifacts for identity tests, written with `st_writer.write_arrays`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from exl3tool.formats.exl3 import MCG_MARKER
from exl3tool.formats.names import PROJECTIONS
from exl3tool.io.st_writer import write_arrays

HIDDEN, INTER = 128, 256  # 128-aligned so every split below is legal


def write_shard(path: Path, tensors: Mapping[str, np.ndarray]) -> None:
    with open(path, "wb") as fh:
        write_arrays(fh, tensors)


def write_checkpoint(
    root: Path,
    tensors: Mapping[str, np.ndarray],
    shards: int = 1,
    prefix: str = "model",
    config: dict | None = None,
) -> Path:
    """Write `tensors` split into `shards` files (round robin) plus an index and a config."""
    root.mkdir(parents=True, exist_ok=True)
    names = list(tensors)
    weight_map: dict[str, str] = {}
    for s in range(shards):
        label = f"{prefix}-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s::shards]}
        write_shard(root / label, part)
        weight_map.update(dict.fromkeys(part, label))
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    cfg = config or {"quantization_config": {"quant_method": "exl3", "bits": 2}}
    (root / "config.json").write_text(json.dumps(cfg))
    return root


def expert_tensors(
    layers: list[int], experts: int, k: int = 2, seed: int = 0, rank0: bool = False
) -> dict[str, np.ndarray]:
    """Full logical routed-expert tensors (trellis, suh, svh, mcg) plus a non-expert tensor."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    rk = ".rank0" if rank0 else ""
    for layer in layers:
        for e in range(experts):
            for proj in PROJECTIONS:
                fin, fout = (INTER, HIDDEN) if proj == "down_proj" else (HIDDEN, INTER)
                p = f"model.layers.{layer}.mlp.experts.{e}.{proj}{rk}"
                out[f"{p}.trellis"] = rng.integers(
                    -(2**15), 2**15, (fin // 16, fout // 16, 16 * k), dtype=np.int16
                )
                out[f"{p}.suh"] = rng.standard_normal(fin).astype(np.float16)
                out[f"{p}.svh"] = rng.standard_normal(fout).astype(np.float16)
                out[f"{p}.mcg"] = np.array(MCG_MARKER, dtype=np.int32)
        out[f"model.layers.{layer}.input_layernorm.weight"] = rng.standard_normal(HIDDEN).astype(
            np.float16
        )
    out["model.embed_tokens.weight"] = rng.standard_normal((16, HIDDEN)).astype(np.float16)
    return out


def rank_slice(tensors: Mapping[str, np.ndarray], world: int) -> dict[str, np.ndarray]:
    """The legacy rank-sliced layout (docs/formats/r7.md §7.1) of full logical tensors."""
    out: dict[str, np.ndarray] = {}
    for name, arr in tensors.items():
        if ".mlp.experts." not in name:
            out[name] = arr
            continue
        prefix, fld = name.rsplit(".", 1)
        proj = prefix.rsplit(".", 1)[1]
        axis = None
        if fld == "trellis":
            axis = 0 if proj == "down_proj" else 1
        elif (fld, proj) in (("svh", "gate_proj"), ("svh", "up_proj"), ("suh", "down_proj")):
            axis = 0
        for r in range(world):
            key = f"{prefix}.rank{r}.{fld}"
            if axis is None:
                out[key] = arr
            else:
                n = arr.shape[axis] // world
                out[key] = np.take(arr, np.arange(r * n, (r + 1) * n), axis=axis)
    return out


def flip_byte(path: Path, offset: int) -> None:
    """XOR one byte of a file in place (tests only: inputs of the code under test are copies)."""
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0x5A]))


def force_fork(monkeypatch: Any) -> list[int]:
    """Make the engine hash with forked workers from 2 threads and any size; the returned
    list gets the number of workers of each pool it forks."""
    from exl3tool.identity import engine
    from exl3tool.io import forkpool

    monkeypatch.setattr(engine, "FORK_MIN_THREADS", 2)
    monkeypatch.setattr(engine, "FORK_MIN_BYTES", 0)
    monkeypatch.setattr(engine, "FORK_BYTES_PER_RSS", 0)
    monkeypatch.setattr(engine, "fork_unsafe", lambda: False)  # pytest may hold torch
    monkeypatch.delenv("EXL3TOOL_NO_FORK", raising=False)
    sizes: list[int] = []
    real = forkpool.ForkPool

    def counted(*args: Any, **kwargs: Any) -> Any:
        pool = real(*args, **kwargs)
        sizes.append(pool.size)
        return pool

    monkeypatch.setattr(forkpool, "ForkPool", counted)
    return sizes
