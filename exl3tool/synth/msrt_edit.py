"""Editing helpers for tests (mutation tables): read a shard, rewrite it, refresh the
cartridge manifest's sizes, digests and tensor count after an edit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from exl3tool.synth import literals as lit
from exl3tool.synth.msrt import sha256_file, write_adapter_config, write_safetensors


def refresh_shards(adapter: Path) -> dict[str, Any]:
    """Recompute `shards[].size/sha256` and `num_tensors` after a test edited shard bytes."""
    from exl3tool.io.jsonfile import read_json
    from exl3tool.io.safetensors import read_header
    from exl3tool.rules.registry import Findings

    adapter = Path(adapter)
    manifest = read_json(adapter / lit.ADAPTER_CONFIG, Findings(), lit.ADAPTER_CONFIG)
    n = 0
    for sh in manifest["shards"]:
        p = adapter / sh["path"]
        sh["size"] = p.stat().st_size
        sh["sha256"] = sha256_file(p)
        st = read_header(p, Findings())
        n += len(st.tensors) if st else 0
    manifest["num_tensors"] = n
    write_adapter_config(adapter, manifest)
    return manifest


def read_tensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file as an owned numpy array, in file order."""
    from exl3tool.io.safetensors import read_header
    from exl3tool.io.views import TensorReader
    from exl3tool.rules.registry import Findings

    header = read_header(Path(path), Findings())
    if header is None:
        raise ValueError(f"{path}: unreadable safetensors header")
    with TensorReader() as rd:
        return {n: np.array(rd.array(header, i)) for n, i in header.tensors.items()}


def rewrite_shard(path: Path, edit: Any) -> None:
    """Replace a shard by `edit(tensors) -> tensors` (a dict name -> ndarray, order kept)."""
    tensors = edit(read_tensors(Path(path)))
    write_safetensors(Path(path), tensors)
