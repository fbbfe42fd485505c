"""The failure drill's corrupted copy: one payload byte of the smallest shard, the rest linked."""

import json
import os
from pathlib import Path

from exl3tool.runtime.verify import corrupt_copy


def _shard(path: Path, payload: bytes) -> None:
    header = json.dumps({"__metadata__": {}}).encode()
    path.write_bytes(len(header).to_bytes(8, "little") + header + payload)


def test_flips_one_payload_byte_of_the_smallest_shard(tmp_path) -> None:
    src = tmp_path / "a"
    src.mkdir()
    sizes = {"big.safetensors": 4096, "small.safetensors": 64, "empty.safetensors": 0}
    for name, n in sizes.items():
        _shard(src / name, bytes(range(256)) * (n // 256) + bytes(n % 256))
    manifest = {"shards": [{"path": p} for p in sizes]}
    (src / "adapter_config.json").write_text(json.dumps(manifest))

    out = corrupt_copy(src, tmp_path / "bad")

    a, b = (src / "small.safetensors").read_bytes(), (out / "small.safetensors").read_bytes()
    assert len(a) == len(b) and sum(x != y for x, y in zip(a, b, strict=True)) == 1
    start = 8 + int.from_bytes(a[:8], "little")
    assert a[start] ^ b[start] == 1  # the first payload byte, never the header
    for name in ("big.safetensors", "empty.safetensors", "adapter_config.json"):
        assert os.stat(out / name).st_ino == os.stat(src / name).st_ino  # linked, not written
