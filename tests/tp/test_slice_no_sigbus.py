"""Issue 15 item 1, the slicer: a source shard that shrinks or changes while `slice` reads it is
InputChanged (exit 3, the file named), never SIGBUS; nothing is published, no temp is left."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from exl3tool.io.views import InputChanged
from exl3tool.tp import stream
from exl3tool.tp.run import SliceOptions, slice_artifact

# Runs `exl3tool slice` with 4 KiB blocks and truncates every source shard to its header right
# after the first stream took its pieces of the first block: the next block read comes up short.
# The mmap slicer (before issue 15) hashed the next tensor from pages that had vanished and died
# of SIGBUS (return code -7, no report).
CHILD = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from exl3tool.cli import entry
    from exl3tool.formats.checkpoint import load_checkpoint
    from exl3tool.rules.registry import Findings
    from exl3tool.tp import stream
    src, out, threads = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    ckpt = load_checkpoint(src, Findings())
    original = stream._Stream.take
    done = []

    def take_then_truncate(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if not done:
            done.append(1)
            for st in ckpt.shards.values():
                os.truncate(st.path, st.data_start)

    stream._Stream.take = take_then_truncate
    stream.chunk_size = lambda consumers: 4096
    sys.argv = ["exl3tool", "slice", str(src), "--tp", "2", "-o", out, "--threads", threads]
    entry()
    """
)


def _copy_source(sources: dict[str, Path], tmp_path: Path) -> Path:
    src = tmp_path / "src"
    shutil.copytree(sources["exl3"], src)
    return src


def _leftovers(parent: Path, out: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{out.name}"))


@pytest.mark.parametrize("threads", ["1", "4"])
def test_source_truncated_while_sliced_is_exit_3_in_a_child(
    sources: dict[str, Path], tmp_path: Path, threads: str
) -> None:
    """One thread: the next block read is short ("shrank"). Four (a reader and consumers in
    threads): the reader may already be past the truncation point and the size check after
    the pass names the file instead; either way exit 3 naming a shard, nothing published."""
    src = _copy_source(sources, tmp_path)
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(src), str(out), threads],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 3, (r.returncode, r.stderr[-2000:])
    words = ("shrank",) if threads == "1" else ("shrank", "size ")
    assert ".safetensors" in r.stderr and any(w in r.stderr for w in words), r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert not out.exists() and _leftovers(tmp_path, out) == []


def test_source_modified_in_place_while_sliced_is_input_changed(
    sources: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same size, other bytes (a write in place): the stability proof after the pass names it."""
    src = _copy_source(sources, tmp_path)
    shard = sorted(src.glob("*.safetensors"))[-1]
    original = stream._Stream.take
    done: list[int] = []

    def take_then_modify(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if not done:
            done.append(1)
            with open(shard, "r+b") as fh:
                fh.seek(-1, os.SEEK_END)
                last = fh.read(1)
                fh.seek(-1, os.SEEK_END)
                fh.write(bytes([last[0] ^ 0xFF]))
            st = shard.stat()
            os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))

    monkeypatch.setattr(stream._Stream, "take", take_then_modify)
    out = tmp_path / "out"
    with pytest.raises(InputChanged, match=shard.name):
        slice_artifact(src, out, SliceOptions(2, threads=1))
    assert not out.exists() and _leftovers(tmp_path, out) == []


def test_unchanged_source_still_slices(sources: dict[str, Path], tmp_path: Path) -> None:
    """The valid twin: the same source, untouched, slices and verifies."""
    src = _copy_source(sources, tmp_path)
    slice_artifact(src, tmp_path / "out", SliceOptions(2, threads=1, verify=True))
    assert (tmp_path / "out" / "exl3tool-slices.json").is_file()


@pytest.mark.parametrize(
    ("offset", "run", "count", "stride"),
    [
        (0, 4096, 1, 4096),  # contiguous
        (7, 100, 50, 100),  # contiguous rows
        (3, 100, 300, 640),  # short runs: blocks of rows, gathered
        (5, 2048, 40, 8192),  # a quarter of the stride: blocks of rows (one row each)
        (1, 9000, 5, 20000),  # runs over a chunk: read in pieces
    ],
)
def test_slice_chunks_equal_a_numpy_gather(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    offset: int,
    run: int,
    count: int,
    stride: int,
) -> None:
    """Every read path (small CHUNK: many blocks, runs split over chunks) gives the bytes of a
    plain strided gather, with the output as the strided copy path of the slicer sees it."""
    import numpy as np

    from exl3tool.io.views import PayloadFile
    from exl3tool.tp.slices import ByteLayout

    monkeypatch.setattr(stream, "CHUNK", 8192)
    monkeypatch.setattr(stream, "DIRECT_RUN", 8192)
    raw = np.random.default_rng(15).integers(0, 256, offset + count * stride + 64, np.uint8)
    path = tmp_path / "f.bin"
    path.write_bytes(raw.tobytes())
    lay = ByteLayout(offset=3, run=run, count=count, stride=stride)
    base = offset + 3
    want = np.lib.stride_tricks.as_strided(raw[base:], (count, run), (stride, 1)).tobytes()
    with PayloadFile(path) as f:
        got = b"".join(bytes(c) for c in stream.slice_chunks(f, offset, lay, stream.ChunkBuffers()))
    assert got == want
    with PayloadFile(path) as f, pytest.raises(InputChanged, match=r"f\.bin: shrank"):
        os.truncate(path, base + run // 2)  # shrunk after open: the same reads fail cleanly
        for _ in stream.slice_chunks(f, offset, lay, stream.ChunkBuffers()):
            pass


def test_buffers_shrink_with_many_consumers_without_changing_bytes(
    sources: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bounded memory at any TP size: the consumers' buffers share BUFFER_BUDGET (each at
    least 1 MiB); smaller buffers (more blocks, more chunks per tensor) give the same files."""
    assert stream.chunk_size(2) == stream.CHUNK
    assert 2 * 64 * stream.chunk_size(64) <= stream.BUFFER_BUDGET
    assert stream.chunk_size(10_000) == 1 << 20
    ref, small = tmp_path / "ref", tmp_path / "small"
    slice_artifact(sources["exl3"], ref, SliceOptions(4, threads=1))
    monkeypatch.setattr(stream, "BUFFER_BUDGET", 1)
    slice_artifact(sources["exl3"], small, SliceOptions(4, threads=1, verify=True))
    files = sorted(p.relative_to(ref) for p in ref.rglob("*.safetensors"))
    assert files and all((ref / f).read_bytes() == (small / f).read_bytes() for f in files)
