"""Mutation helpers for the rule tests: edit JSON documents and shards of a synthetic checkpoint
copy, keeping the index consistent so that each mutation isolates one defect."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from exl3tool.io.safetensors import read_header
from exl3tool.io.st_writer import write_arrays
from exl3tool.io.views import TensorReader
from exl3tool.rules.registry import Findings

Tensors = dict[str, tuple[str, np.ndarray]]  # name -> (safetensors dtype, array)


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def edit_json(path: Path, fn: Callable[[Any], Any]) -> None:
    """Edit a JSON document in place (`fn` mutates it; its return value is ignored)."""
    value = json.loads(path.read_text())
    fn(value)
    path.write_text(json.dumps(value, indent=2))


def edit_qc(root: Path, fn: Callable[[dict], Any]) -> None:
    """Apply the same edit to config.json's quantization_config and quantization_config.json."""
    edit_json(root / "config.json", lambda c: fn(c["quantization_config"]))
    if (root / "quantization_config.json").is_file():
        edit_json(root / "quantization_config.json", fn)


def edit_block(root: Path, fn: Callable[[dict], Any]) -> None:
    edit_qc(root, lambda q: fn(q["r7_routed_experts"]))


def load_shard(path: Path) -> tuple[Tensors, dict[str, str] | None]:
    st = read_header(path, Findings())
    assert st is not None
    with TensorReader() as reader:
        tensors = {
            n: (info.dtype, np.array(reader.array(st, info)))
            for n, info in sorted(st.tensors.items(), key=lambda kv: kv[1].begin)
        }
    return tensors, st.metadata


def edit_shard(
    root: Path,
    label: str,
    fn: Callable[[Tensors], Any],
    metadata: Callable[[dict[str, str]], Any] | None = None,
) -> None:
    """Rewrite one shard after `fn` edits its tensors; update the index for added/removed names."""
    path = root / label
    tensors, meta = load_shard(path)
    before = set(tensors)
    fn(tensors)
    meta = dict(meta or {})
    if metadata is not None:
        metadata(meta)
    with open(path, "wb") as fh:
        write_arrays(
            fh,
            {n: a for n, (_, a) in tensors.items()},
            meta or None,
            {n: d for n, (d, _) in tensors.items()},
        )
    index = root / "model.safetensors.index.json"
    if index.is_file():

        def fix(idx: dict) -> None:
            wm = idx["weight_map"]
            for n in before - set(tensors):
                wm.pop(n, None)
            for n in set(tensors) - before:
                wm[n] = label
            idx.get("metadata", {}).pop("total_size", None)  # sizes changed: drop, not CK008

        edit_json(index, fix)


def move_tensor(root: Path, name: str, src: str, dst: str) -> None:
    held: dict[str, tuple[str, np.ndarray]] = {}
    edit_shard(root, src, lambda t: held.update({name: t.pop(name)}))
    edit_shard(root, dst, lambda t: t.update(held))
