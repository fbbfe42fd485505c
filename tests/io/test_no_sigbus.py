"""Issue 15 item 1 and 5: payload reads never fault on a shrinking file; a file that shrank,
changed or was replaced by a rename while read is InputChanged (exit 3, the file named)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from exl3tool.formats.checkpoint import load_checkpoint
from exl3tool.identity.engine import hash_files, hash_tensors
from exl3tool.io.st_writer import write_arrays
from exl3tool.io.views import InputChanged, PayloadFile, TensorReader
from exl3tool.rules.registry import Findings


def _shard(path: Path, n: int = 4, size: int = 1 << 16) -> Path:
    rng = np.random.default_rng(7)
    tensors = {f"t{i}": rng.integers(0, 255, size, dtype=np.uint8) for i in range(n)}
    with open(path, "wb") as fh:
        write_arrays(fh, tensors)
    return path


def _header(path: Path):
    ckpt = load_checkpoint(path, Findings())
    return ckpt.shards[path.name]


def test_truncation_after_open_is_input_changed_in_a_child(tmp_path: Path) -> None:
    """Truncate a shard after the reader opened it and read one tensor. An mmap reader dies of
    SIGBUS here (the child's return code is -7); this one raises InputChanged."""
    shard = _shard(tmp_path / "m.safetensors")
    code = textwrap.dedent(
        f"""
        import os, sys
        from exl3tool.formats.checkpoint import load_checkpoint
        from exl3tool.io.views import InputChanged, TensorReader
        from exl3tool.rules.registry import Findings
        p = {str(shard)!r}
        st = next(iter(load_checkpoint(p, Findings()).shards.values()))
        with TensorReader() as rd:
            bytes(rd.payload(st, st.tensors["t0"]))
            os.truncate(p, st.data_start + st.tensors["t1"].begin)
            try:
                bytes(rd.payload(st, st.tensors["t3"]))
            except InputChanged as exc:
                print("CHANGED", exc)
                sys.exit(3)
        sys.exit(0)
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert "CHANGED" in r.stdout and "m.safetensors" in r.stdout and "shrank" in r.stdout


def test_truncation_between_header_and_checks_is_input_changed(tmp_path: Path) -> None:
    """The ValueError of the mmap reader (issue 15 item 1): the file shrank before the read."""
    shard = _shard(tmp_path / "m.safetensors")
    st = _header(shard)
    os.truncate(shard, st.data_start + 10)
    with TensorReader() as rd, pytest.raises(InputChanged, match=r"m\.safetensors"):
        rd.payload(st, st.tensors["t2"])


def test_shard_truncated_before_hashing_is_input_changed(tmp_path: Path) -> None:
    shard = _shard(tmp_path / "m.safetensors")
    st = _header(shard)
    os.truncate(shard, st.data_start + 100)
    with pytest.raises(InputChanged, match=r"m\.safetensors"):
        hash_tensors([(n, st, i) for n, i in st.tensors.items()])


def test_shard_replaced_by_rename_after_header_read(tmp_path: Path) -> None:
    """Item 5: identical size and names but another inode: the old reader hashed the new bytes."""
    shard = _shard(tmp_path / "m.safetensors")
    st = _header(shard)
    other = _shard(tmp_path / "other.safetensors")
    os.rename(other, shard)
    with pytest.raises(InputChanged, match="replaced"):
        hash_tensors([(n, st, i) for n, i in st.tensors.items()])


def test_file_replaced_while_hashed_is_input_changed(tmp_path: Path) -> None:
    """A rename over the path after the engine opened it: the digest would be of bytes the
    path no longer names."""
    f = _shard(tmp_path / "m.safetensors")
    stamp = PayloadFile(f).stamp
    other = _shard(tmp_path / "o.safetensors", n=5)
    os.rename(other, f)
    with pytest.raises(InputChanged):
        hash_files([f], expected={f: stamp})


def test_unchanged_files_hash_like_hashlib(tmp_path: Path) -> None:
    import hashlib

    f = _shard(tmp_path / "m.safetensors", n=3, size=(9 << 20) // 3)  # spans > one CHUNK
    st = _header(f)
    assert hash_files([f])[f] == hashlib.sha256(f.read_bytes()).hexdigest()
    got = hash_tensors([(n, st, i) for n, i in st.tensors.items()])
    raw = f.read_bytes()
    for n, i in st.tensors.items():
        a, b = st.data_start + i.begin, st.data_start + i.end
        assert got[n] == hashlib.sha256(raw[a:b]).hexdigest()


def test_gather_packs_spans_with_their_alignment(tmp_path: Path) -> None:
    f = _shard(tmp_path / "m.safetensors", n=3, size=300_000)
    st = _header(f)
    raw = f.read_bytes()[st.data_start :]
    spans = [(5, 9), (400_001, 400_017), (0, 4), (899_990, 900_000), (7, 7)]
    with TensorReader() as rd:
        data, pos = rd.gather(st, spans)
    for (b, e), p in zip(spans, pos, strict=True):
        assert bytes(data[p : p + e - b]) == raw[b:e]
        assert p % 16 == b % 16


def test_validate_hash_of_a_cartridge_shard_replaced_by_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 15 item 5: 7 of 7 `validate --hash` runs exited 0 on a shard renamed over after
    it was opened; the digest was of bytes the manifest's check never saw."""
    from exl3tool.actions.validate import validate_path
    from exl3tool.checks.options import ValidateOptions
    from exl3tool.identity import engine
    from exl3tool.synth.msrt import build_adapter, build_base

    base = build_base(tmp_path / "base")
    cart = build_adapter(tmp_path / "cart", base)
    shard = sorted(cart.glob("*.safetensors"))[0]
    original = engine._open_all

    def replace_then_open(paths, expected=None):
        copy = shard.with_name("copy")
        copy.write_bytes(shard.read_bytes())
        os.rename(copy, shard)  # same bytes, another inode: the file opened first is gone
        return original(paths, expected)

    monkeypatch.setattr(engine, "_open_all", replace_then_open)
    with pytest.raises(InputChanged, match=shard.name):
        validate_path(cart, ValidateOptions(hash=True, threads=1))
    monkeypatch.setattr(engine, "_open_all", original)
    _, findings = validate_path(cart, ValidateOptions(hash=True, threads=1))
    assert not findings.has_errors()
