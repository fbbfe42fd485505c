"""Atomic publication: write into a hidden temporary sibling, fsync, then rename into place.

A reader never sees a half-written output, an existing output is only replaced with
`force=True`, and any exception (or a killed process) leaves the target untouched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from exl3tool.errors import OutputError


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under root (directories last, so entries are durable)."""
    for dirpath, _dirs, files in os.walk(root, topdown=False):
        for f in files:
            fsync_path(Path(dirpath) / f)
        fsync_path(Path(dirpath))


def _check_target(target: Path, force: bool) -> None:
    if (target.exists() or target.is_symlink()) and not force:
        raise OutputError(f"{target} exists; pass --force to replace it")
    if not target.parent.is_dir():
        raise OutputError(f"{target.parent} is not a directory")


def _replace(tmp: Path, target: Path) -> None:
    """Move tmp onto target; an existing target is moved aside first and removed after."""
    if target.exists() or target.is_symlink():
        trash = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        os.rename(target, trash / "old")
        try:
            os.rename(tmp, target)
        except BaseException:
            os.rename(trash / "old", target)
            shutil.rmtree(trash, ignore_errors=True)
            raise
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.rename(tmp, target)
    fsync_path(target.parent)


@contextlib.contextmanager
def atomic_dir(target: Path, *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary directory that becomes `target` when the block succeeds."""
    target = Path(target).absolute()
    _check_target(target, force)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield tmp
        fsync_tree(tmp)
        _check_target(target, force)
        _replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def atomic_file(target: Path, *, force: bool = False, mode: str = "wb") -> Iterator:
    """Yield a file object whose content becomes `target` when the block succeeds."""
    target = Path(target).absolute()
    _check_target(target, force)
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)
    tmp = Path(name)
    try:
        with os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        _check_target(target, force)
        _replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def write_bytes_atomic(target: Path, data: bytes, *, force: bool = False) -> None:
    with atomic_file(target, force=force) as fh:
        fh.write(data)
