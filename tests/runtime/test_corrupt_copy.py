"""The failure drill's corrupted copy: one payload byte of the smallest shard, the rest linked."""

import json
import os
from pathlib import Path

import pytest

from exl3tool.runtime.verify_parts import corrupt_copy


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


def test_the_layout_opens_only_regular_files_inside_the_adapter(tmp_path) -> None:
    """verify-swap lays the drill out before staging has vetted the manifest: a FIFO must not
    block it, a path outside the adapter must not be read."""
    from exl3tool.runtime.verify_parts import corrupt_layout

    src = tmp_path / "a"
    src.mkdir()
    os.mkfifo(src / "pipe.safetensors")
    outside = tmp_path / "outside.safetensors"
    _shard(outside, bytes(64))
    manifest = {"shards": [{"path": "pipe.safetensors"}, {"path": "../outside.safetensors"}]}
    (src / "adapter_config.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="no shard"):
        corrupt_layout(src, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()

    _shard(src / "real.safetensors", bytes(64))
    manifest["shards"].append({"path": "real.safetensors"})
    (src / "adapter_config.json").write_text(json.dumps(manifest))
    out = corrupt_layout(src, tmp_path / "bad")()
    assert (out / "real.safetensors").read_bytes() != (src / "real.safetensors").read_bytes()


def test_cache_snapshot_links_are_linked_through_to_their_blobs(tmp_path) -> None:
    """In a Hugging Face snapshot every file is a relative link into ../../blobs: the drill's
    copy links to the blobs themselves (no link that dangles from its new place), and no
    input is touched, not even its link count or ctime (no hard link)."""
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots" / "abc"
    blobs.mkdir()
    snap.mkdir(parents=True)
    for name, n in (("big.safetensors", 256), ("small.safetensors", 32)):
        _shard(blobs / name, bytes(range(n)))
        os.symlink(f"../../blobs/{name}", snap / name)
    manifest = {"shards": [{"path": "big.safetensors"}, {"path": "small.safetensors"}]}
    (blobs / "cfg").write_text(json.dumps(manifest))
    os.symlink("../../blobs/cfg", snap / "adapter_config.json")

    before = {p.name: os.stat(p) for p in blobs.iterdir()}
    out = corrupt_copy(snap, tmp_path / "bad")

    for name in ("big.safetensors", "adapter_config.json"):
        assert (out / name).resolve() == (snap / name).resolve()
        assert (out / name).read_bytes() == (snap / name).read_bytes()
    for p in blobs.iterdir():
        st, was = os.stat(p), before[p.name]
        assert (st.st_nlink, st.st_ctime_ns, st.st_mtime_ns) == (
            was.st_nlink,
            was.st_ctime_ns,
            was.st_mtime_ns,
        )
    assert (out / "small.safetensors").read_bytes() != (snap / "small.safetensors").read_bytes()
