"""identity's default pool: a worker per core, one fewer for many small tensors on 8+ cores."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from exl3tool.identity.pool_size import hashing_workers, header_share


def _shard(path: Path, tensors: int, size: int) -> None:
    """A shard whose header declares `tensors` entries, sparse up to `size` bytes."""
    header = json.dumps(
        {
            f"model.layers.0.mlp.experts.{i}.up_proj.trellis": {
                "dtype": "I16",
                "shape": [1],
                "data_offsets": [0, 2],
            }
            for i in range(tensors)
        }
    ).encode()
    with open(path, "wb") as fh:
        fh.write(len(header).to_bytes(8, "little") + header)
        fh.truncate(size)


@pytest.mark.parametrize(
    ("tensors", "gb", "cores", "workers"),
    [
        (20_000, 4, 16, 15),  # 5,000 tensors per GB: Qwen3-30B-like 200 KB experts
        (2_000, 4, 16, 16),  # 500 per GB: GLM-5.2-like 2-8 MB experts
        (20_000, 4, 4, 4),  # few cores: every core hashes
        (20_000, 4, 8, 7),
    ],
)
def test_a_core_is_left_to_the_parent_only_for_many_small_tensors_on_many_cores(
    tmp_path: Path, tensors: int, gb: int, cores: int, workers: int
) -> None:
    for i in range(4):
        _shard(tmp_path / f"model-{i:05d}.safetensors", tensors // 4, gb * 10**9 // 4)
    assert hashing_workers(sorted(tmp_path.iterdir()), cores) == workers
    assert hashing_workers([tmp_path / "model-00000.safetensors"], cores) == workers  # one file


def test_what_is_not_a_readable_shard_is_left_out(tmp_path: Path) -> None:
    _shard(tmp_path / "a.safetensors", 100, 10**9)
    os.mkfifo(tmp_path / "b.safetensors")  # never opened for a blocking read
    (tmp_path / "c.safetensors").write_bytes(b"\xff" * 8)  # a header longer than the file
    (tmp_path / "d.safetensors").write_bytes(b"1234")  # shorter than a header length
    (tmp_path / "e.safetensors").mkdir()
    header, total = header_share(sorted(tmp_path.iterdir()))
    assert total == 10**9 and 0 < header < total
    assert hashing_workers(sorted(tmp_path.iterdir()), 16) == 16
    assert hashing_workers([tmp_path / "missing"], 16) == 16
