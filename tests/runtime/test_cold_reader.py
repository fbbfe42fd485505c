"""The cold build's own shard reader: the reference library's values, no mmap (a shard that
shrinks while verify-swap reads it is an InputError naming it, never a SIGBUS)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from exl3tool.rules.errors import InputError  # noqa: E402
from exl3tool.runtime.cold import ShardTensors  # noqa: E402


def _shard(path: Path) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    tensors = {
        "a.trellis": torch.randint(-(2**15), 2**15, (4, 8, 48), generator=g, dtype=torch.int16),
        "a.suh": torch.randn(256, generator=g).half(),
        "a.scale": torch.randn((), generator=g).float(),
        "b.router": torch.randn(8, 16, generator=g).bfloat16(),
        "b.empty": torch.zeros(0, 3, dtype=torch.float32),
        "b.count": torch.arange(5, dtype=torch.int64),
    }
    save_file(tensors, str(path))
    return tensors


def test_tensors_equal_the_reference_library(tmp_path: Path) -> None:
    path = tmp_path / "s.safetensors"
    _shard(path)
    st = ShardTensors(tmp_path, [path.name])
    with safe_open(str(path), framework="pt") as ref:
        assert sorted(st.where) == sorted(ref.keys())
        for name in ref.keys():  # noqa: SIM118 - safe_open is not a mapping
            mine, theirs = st.get(name), ref.get_tensor(name)
            assert mine.dtype == theirs.dtype and mine.shape == theirs.shape
            assert torch.equal(mine.view(-1).view(torch.uint8), theirs.view(-1).view(torch.uint8))
    st.release()


def test_a_shard_truncated_after_indexing_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "s.safetensors"
    _shard(path)
    st = ShardTensors(tmp_path, [path.name])
    st.get("a.suh")  # opened
    with open(path, "r+b") as fh:
        fh.truncate(path.stat().st_size - 64)
    last = max(st.where, key=lambda n: st.where[n][2]["data_offsets"][1])
    with pytest.raises(InputError, match="shrank"):
        st.get(last)
    st.release()


def test_a_shard_truncated_while_read_ends_the_process_with_exit_3(tmp_path: Path) -> None:
    path = tmp_path / "s.safetensors"
    _shard(path)
    code = textwrap.dedent(
        f"""
        import os, sys
        from exl3tool.rules.errors import InputError
        from exl3tool.runtime.cold import ShardTensors
        p = {str(path)!r}
        st = ShardTensors(os.path.dirname(p), [os.path.basename(p)])
        last = max(st.where, key=lambda n: st.where[n][2]["data_offsets"][1])
        st.get(last)
        os.truncate(p, os.path.getsize(p) - 64)
        try:
            st.get(last)
        except InputError as exc:
            print(exc)
            sys.exit(3)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, (done.returncode, done.stderr)  # the mmap reader died of SIGBUS
    assert "shrank" in done.stdout and "s.safetensors" in done.stdout


def test_garbage_is_an_input_error_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\xff" * 64)
    with pytest.raises(InputError, match=r"bad\.safetensors"):
        ShardTensors(tmp_path, [bad.name])
