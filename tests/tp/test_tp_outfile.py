"""The staged output file (tp/outfile.py): the same bytes and digests with O_DIRECT, without it,
and when the file system refuses it part-way; rows gathered across stage boundaries."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from exl3tool.tp import outfile
from exl3tool.tp.outfile import ALIGN, StagedFile, Stages


def _write(
    path: Path, src: np.ndarray, direct: bool, stage: int, depth: int = 2, writers: int = 1
) -> tuple[str, list[int]]:
    """Feed a header, contiguous runs and strided rows; the sha256 seen and the kicks made."""
    h = hashlib.sha256()
    kicks: list[int] = []
    stages = Stages(stage, depth, writers)
    f = StagedFile(path, stages, [h], lambda fd, a, n: kicks.append(n), 3000, direct)
    f.put(b"header of odd length")
    f.put(memoryview(src)[5:9000])
    f.put_rows(src, 3, 700, 40, 1000)  # rows over several stages
    f.put_rows(src, 11, ALIGN + 5, 3, 2 * ALIGN)  # a row longer than the stage
    f.put(memoryview(src)[:1])
    f.close()
    stages.close()
    assert f.size == path.stat().st_size
    return h.hexdigest(), kicks


def _want(src: np.ndarray) -> bytes:
    rows = np.lib.stride_tricks.as_strided(src[3:], (40, 700), (1000, 1)).tobytes()
    long = np.lib.stride_tricks.as_strided(src[11:], (3, ALIGN + 5), (2 * ALIGN, 1)).tobytes()
    return b"header of odd length" + src[5:9000].tobytes() + rows + long + src[:1].tobytes()


@pytest.mark.parametrize(("depth", "writers"), [(1, 1), (2, 1), (3, 1), (3, 2), (6, 4)])
@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("stage", [ALIGN, 3 * ALIGN, 1 << 20])
def test_bytes_and_digest_equal_a_plain_copy(
    tmp_path: Path, direct: bool, stage: int, depth: int, writers: int
) -> None:
    """Written in the caller's thread (depth 1) or behind it (2, 3 stages; one writer or
    several, each stage at its own offset)."""
    src = np.random.default_rng(3).integers(0, 256, 50_000, np.uint8)
    path = tmp_path / "o.bin"
    digest, _ = _write(path, src, direct, stage, depth, writers)
    want = _want(src)
    assert path.read_bytes() == want and digest == hashlib.sha256(want).hexdigest()


@pytest.mark.parametrize(("depth", "writers"), [(2, 1), (4, 3)])
def test_refused_direct_write_falls_back_to_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, depth: int, writers: int
) -> None:
    """O_DIRECT accepted at open but a write refused (EINVAL): the same bytes, buffered, and
    their writeback kicked; any other write error is raised."""
    real = os.pwrite
    calls: list[int] = []

    def refuse_first(fd: int, data, offset: int) -> int:
        calls.append(len(data))
        if len(calls) == 1:
            raise OSError(errno.EINVAL, "refused")
        return real(fd, data, offset)

    monkeypatch.setattr(outfile, "_set_direct", lambda fd, on: True)
    monkeypatch.setattr(outfile.os, "pwrite", refuse_first)
    src = np.random.default_rng(4).integers(0, 256, 50_000, np.uint8)
    path = tmp_path / "o.bin"
    _, kicks = _write(path, src, True, ALIGN, depth, writers)
    assert path.read_bytes() == _want(src) and kicks and len(calls) > 1

    def fail(fd: int, data, offset: int) -> int:
        raise OSError(errno.ENOSPC, "full")

    monkeypatch.setattr(outfile.os, "pwrite", fail)
    for depth in (1, 2):
        stages = Stages(ALIGN, depth)
        f = StagedFile(tmp_path / f"p{depth}.bin", stages, [], lambda *a: None, 1, True)
        with pytest.raises(OSError, match="full"):
            f.put(bytes(3 * ALIGN))
        f.abort()
        stages.close()


@pytest.mark.parametrize("depth", [1, 2])
def test_an_error_of_the_last_write_is_raised_by_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, depth: int
) -> None:
    def fail(fd: int, data, offset: int) -> int:
        raise OSError(errno.EIO, "lost")

    monkeypatch.setattr(outfile.os, "pwrite", fail)
    stages = Stages(ALIGN, depth)
    f = StagedFile(tmp_path / "o.bin", stages, [], lambda *a: None, 1, True)
    f.put(b"x" * 100)
    with pytest.raises(OSError, match="lost"):
        f.close()
    f.abort()
    stages.close()


def test_short_direct_write_finishes_through_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A direct write that takes only part of a stage: the rest is written buffered at the
    right offset while other stages of the file are in flight."""
    real = os.pwrite
    shorted: list[int] = []

    def short_once(fd: int, data, offset: int) -> int:
        if not shorted and len(data) > ALIGN:
            shorted.append(offset)
            return real(fd, data[:ALIGN], offset)
        return real(fd, data, offset)

    monkeypatch.setattr(outfile.os, "pwrite", short_once)
    src = np.random.default_rng(5).integers(0, 256, 50_000, np.uint8)
    path = tmp_path / "o.bin"
    _write(path, src, True, 3 * ALIGN, 4, 3)
    assert shorted and path.read_bytes() == _want(src)


@pytest.mark.parametrize("change", [{"DIRECT": False}, {"WRITERS": 3}])
def test_slices_equal_without_direct_or_with_more_writers(
    sources: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: dict
) -> None:
    from exl3tool.tp import stream
    from exl3tool.tp.run import SliceOptions, slice_artifact

    slice_artifact(sources["r7"], tmp_path / "a", SliceOptions(2, sha256=True))
    for name, value in change.items():
        monkeypatch.setattr(stream, name, value)
    monkeypatch.setattr(stream, "STAGE", 4 * ALIGN)  # many stages per part
    slice_artifact(sources["r7"], tmp_path / "b", SliceOptions(2, sha256=True))
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*"))
    assert files and all(
        (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
        for f in files
        if (tmp_path / "a" / f).is_file()
    )
