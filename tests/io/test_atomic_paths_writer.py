"""Atomic publication, no-follow path opening and the deterministic safetensors writer."""

from __future__ import annotations

import io
import os
import struct
import time
from pathlib import Path

import numpy as np
import pytest

from exl3tool.io.atomic import atomic_dir, atomic_file, remove_stale_temps, write_bytes_atomic
from exl3tool.io.paths import PathViolation, is_within, open_inside, relative_path_problem
from exl3tool.io.safetensors import read_header
from exl3tool.io.st_writer import SafetensorsStreamWriter, TensorSpec, build_header, write_arrays
from exl3tool.io.views import TensorReader
from exl3tool.rules.errors import OutputError
from exl3tool.rules.registry import Findings


def _names(d: Path) -> set[str]:
    return {p.name for p in d.iterdir()}


# --- atomic ---------------------------------------------------------------------------------


def test_atomic_file_exception_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), atomic_file(tmp_path / "out.bin") as fh:
        fh.write(b"half")
        raise RuntimeError("boom")
    assert _names(tmp_path) == set()


def test_atomic_dir_exception_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt), atomic_dir(tmp_path / "out") as d:
        (d / "a").write_bytes(b"1")
        assert not (tmp_path / "out").exists()  # invisible until the block succeeds
        raise KeyboardInterrupt
    assert _names(tmp_path) == set()


def test_existing_target_untouched_without_force(tmp_path: Path) -> None:
    f = tmp_path / "out.bin"
    f.write_bytes(b"old")
    with pytest.raises(OutputError):
        write_bytes_atomic(f, b"new")
    with pytest.raises(OutputError), atomic_dir(f):
        pass
    d = tmp_path / "outdir"
    d.mkdir()
    (d / "keep").write_bytes(b"k")
    with pytest.raises(OutputError), atomic_dir(d):
        pass
    assert f.read_bytes() == b"old" and (d / "keep").read_bytes() == b"k"
    assert _names(tmp_path) == {"out.bin", "outdir"}


def test_target_created_between_start_and_commit_is_not_clobbered(tmp_path: Path) -> None:
    f = tmp_path / "out.bin"
    with pytest.raises(OutputError), atomic_file(f) as fh:
        fh.write(b"mine")
        f.write_bytes(b"theirs")
    assert f.read_bytes() == b"theirs" and _names(tmp_path) == {"out.bin"}


def test_replaced_with_force(tmp_path: Path) -> None:
    f = tmp_path / "out.bin"
    f.write_bytes(b"old")
    write_bytes_atomic(f, b"new", force=True)
    assert f.read_bytes() == b"new" and oct(f.stat().st_mode & 0o777) == "0o644"
    d = tmp_path / "outdir"
    d.mkdir()
    (d / "stale").write_bytes(b"s")
    with atomic_dir(d, force=True) as tmp:
        (tmp / "fresh").write_bytes(b"f")
    assert _names(d) == {"fresh"}
    assert _names(tmp_path) == {"out.bin", "outdir"}  # no temp or trash left


def test_stale_temps_are_removed_but_a_live_runs_are_not(tmp_path: Path) -> None:
    """Two runs writing the same OUT: the second one's clean-up must not delete the first one's
    temporary directory while it is being written (it holds a flock); a killed run's is gone."""
    old = time.time() - 3600
    stale = tmp_path / ".out.tmp-killed"
    stale.mkdir()
    (stale / "half.safetensors").write_bytes(b"x")
    fresh = tmp_path / ".out.tmp-starting"  # made a moment ago: maybe not locked yet
    fresh.mkdir()
    other = tmp_path / ".other.tmp-1"  # another target's temp: not ours to touch
    other.mkdir()
    for d in (stale, other):
        os.utime(d, (old, old))
    with atomic_dir(tmp_path / "out") as live:
        (live / "a").write_bytes(b"a")
        os.utime(live, (old, old))  # old, but held by this live run
        assert not stale.exists()  # atomic_dir removed the killed run's leftover at its start
        assert remove_stale_temps(tmp_path / "out") == []
        assert fresh.is_dir()
        assert live.is_dir() and (live / "a").read_bytes() == b"a"
    assert (tmp_path / "out" / "a").read_bytes() == b"a"
    assert not stale.exists() and other.is_dir()
    assert remove_stale_temps(tmp_path / "out") == []


def test_missing_parent_is_an_output_error(tmp_path: Path) -> None:
    with pytest.raises(OutputError):
        write_bytes_atomic(tmp_path / "no" / "out.bin", b"x")


# --- paths ----------------------------------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "f.bin").write_bytes(b"data")
    (root / "top.bin").write_bytes(b"top")
    (tmp_path / "outside.bin").write_bytes(b"secret")
    os.symlink(root / "top.bin", root / "link.bin")
    os.symlink(tmp_path / "outside.bin", root / "escape.bin")
    os.symlink(root / "sub", root / "linkdir")
    os.mkfifo(root / "fifo")
    return root


def test_open_inside_reads_regular_files(tree: Path) -> None:
    for rel, want in (("sub/f.bin", b"data"), ("./top.bin", b"top"), ("sub/./f.bin", b"data")):
        fd = open_inside(tree, rel)
        with os.fdopen(fd, "rb") as fh:
            assert fh.read() == want


@pytest.mark.parametrize(
    ("rel", "kind"),
    [
        ("link.bin", "symlink"),
        ("escape.bin", "symlink"),
        ("linkdir/f.bin", "symlink"),
        ("../outside.bin", "escape"),
        ("sub/../../outside.bin", "escape"),
        ("/etc/passwd", "escape"),
        ("C:/x", "escape"),
        ("a\\b", "escape"),
        ("", "escape"),
        (".", "escape"),
        ("sub", "not-regular"),
        ("fifo", "not-regular"),
        ("missing.bin", "missing"),
        ("sub/missing.bin", "missing"),
    ],
)
def test_open_inside_violations(tree: Path, rel: str, kind: str) -> None:
    with pytest.raises(PathViolation) as exc:
        open_inside(tree, rel)
    assert exc.value.kind == kind


def test_open_inside_missing_root(tmp_path: Path) -> None:
    with pytest.raises(PathViolation) as exc:
        open_inside(tmp_path / "nope", "x")
    assert exc.value.kind == "missing"


def test_path_violation_kinds_have_pa_rules() -> None:
    from exl3tool.rules import io as rules

    assert {r.name for r in (rules.PA_ESCAPE, rules.PA_SYMLINK, rules.PA_MISSING,
                             rules.PA_NOT_REGULAR, rules.PA_DUPLICATE)} == {
        "path-escape", "path-symlink", "path-missing", "path-not-regular", "path-duplicate"
    }  # fmt: skip


def test_relative_path_problem_and_is_within(tree: Path) -> None:
    assert relative_path_problem("a/b.safetensors") is None
    for bad in (None, 3, "", "/a", "..", "a/../b", "a\x00", "a\nb", "\\\\srv\\x"):
        assert relative_path_problem(bad) is not None, bad
    assert is_within(tree, tree / "sub" / "f.bin")
    assert not is_within(tree, tree / "escape.bin")


# --- st_writer ------------------------------------------------------------------------------


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        "w.trellis": rng.integers(-(2**15), 2**15, size=(2, 3, 48), dtype=np.int16),
        "w.suh": rng.standard_normal(256).astype(np.float16),
        "w.mcg": np.array([-1], dtype=np.int32).reshape(()),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "big_endian": np.arange(5, dtype=">i4"),
    }


def test_write_arrays_round_trip_deterministic_aligned(tmp_path: Path) -> None:
    arrays = _arrays()
    bufs = []
    for _ in range(2):
        buf = io.BytesIO()
        write_arrays(buf, arrays, {"format": "pt"})
        bufs.append(buf.getvalue())
    assert bufs[0] == bufs[1]
    (n,) = struct.unpack("<Q", bufs[0][:8])
    assert (8 + n) % 8 == 0
    p = tmp_path / "m.safetensors"
    p.write_bytes(bufs[0])
    fs = Findings()
    sf = read_header(p, fs, "m")
    assert sf is not None and not fs
    assert list(sf.tensors) == list(arrays) and sf.metadata == {"format": "pt"}
    with TensorReader() as r:
        for name, a in arrays.items():
            got = r.array(sf, sf.tensors[name])
            assert got.shape == a.shape and np.array_equal(got, a.astype(a.dtype.newbyteorder("<")))


def test_write_arrays_dtype_override_bf16(tmp_path: Path) -> None:
    raw = np.array([0x3F80, 0x4000], dtype=np.uint16)
    buf = io.BytesIO()
    write_arrays(buf, {"x": raw}, dtypes={"x": "BF16"})
    p = tmp_path / "b.safetensors"
    p.write_bytes(buf.getvalue())
    sf = read_header(p, Findings(), "b")
    assert sf is not None and sf.tensors["x"].dtype == "BF16"


def test_stream_writer_chunks_and_length_checks() -> None:
    specs = [TensorSpec("a", "U8", (3,)), TensorSpec("z", "U8", (0,)), TensorSpec("b", "I16", (2,))]
    buf = io.BytesIO()
    w = SafetensorsStreamWriter(buf, specs)
    w.write(b"\x01\x02")
    w.write(b"\x03\x04\x05\x06")  # spans a, the empty z, and b
    w.write(b"\x07")
    w.close()
    assert buf.getvalue() == build_header(specs) + bytes(range(1, 8))
    with pytest.raises(ValueError):
        w.write(b"\x00")
    w2 = SafetensorsStreamWriter(io.BytesIO(), specs)
    w2.write(b"\x01")
    with pytest.raises(ValueError):
        w2.close()
    with pytest.raises(ValueError):
        TensorSpec("f4", "F4", (3,)).nbytes  # noqa: B018 (12 bits is not whole bytes)
