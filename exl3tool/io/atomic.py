"""Atomic publication: write into a hidden temporary sibling, fsync, then rename into place.

A reader never sees a half-written output, an existing output is only replaced with
`force=True`, and any exception (or a killed process) leaves the target untouched. Each
temporary directory is held under an exclusive `flock` while in use, so that
`remove_stale_temps` removes only what a killed run left behind, never the work of a run that
is still going (two runs writing the same OUT at once).

Publication itself (the final existence check and the rename) runs under a per-output lock, the
flock of a hidden `.NAME.lock` sibling (issue 15 item 4): of two runs publishing the same OUT,
the second waits, then gets the clean "exists; pass --force" error; without `force` nothing
already published is ever moved aside or removed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from exl3tool.rules.errors import OutputError


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


def _lock_dir(path: Path, *, wait: bool = True) -> int | None:
    """An fd of `path` holding an exclusive flock; None when `wait` is False and another open
    file holds it (or the directory is gone). Where flock does not exist: an unlocked fd."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return None
    if sys.platform == "win32":  # no flock: nothing is ever removed as stale there
        return fd
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except OSError:
        os.close(fd)
        return None
    return fd


def _temp_dir(target: Path, kind: str) -> tuple[Path, int | None]:
    """A new hidden sibling `.NAME.{kind}-*` of target, locked for as long as the fd is open."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.{kind}-", dir=target.parent))
    return tmp, _lock_dir(tmp)


def _unlock(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


FRESH_S = 60.0  # a sibling younger than this may be a live run's, between mkdtemp and flock


def remove_stale_temps(target: Path) -> list[Path]:
    """Remove the hidden siblings (`.NAME.tmp-*`, `.NAME.old-*`) of target that no running
    process holds (a killed run's leftovers, at least FRESH_S old); returns what was removed."""
    target = Path(target).absolute()
    parent = target.parent
    if sys.platform == "win32" or not parent.is_dir():
        return []
    removed = []
    for e in parent.iterdir():
        if not e.name.startswith((f".{target.name}.tmp-", f".{target.name}.old-")):
            continue
        try:
            st = e.lstat()
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or time.time() - st.st_mtime < FRESH_S:
            continue
        fd = _lock_dir(e, wait=False)
        if fd is None:  # in use by a live run
            continue
        try:
            shutil.rmtree(e, ignore_errors=True)
            removed.append(e)
        finally:
            os.close(fd)
    return removed


# Test hook: called under the output lock right before the rename (a delayed rename makes the
# check-then-rename race of two publishers deterministic in tests).
before_rename: Callable[[Path], None] | None = None


def _lock_file(path: Path) -> int:
    """An fd holding the exclusive flock of the lock file `path` (created if absent). A lock
    file unlinked by its last holder while we waited is not ours: open the new one again."""
    import fcntl

    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except FileNotFoundError:
            pass
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


@contextlib.contextmanager
def output_lock(target: Path) -> Iterator[None]:
    """Hold the per-output lock of `target` (its `.NAME.lock` sibling, removed on release)."""
    if sys.platform == "win32":  # no flock: rename there fails on an existing target anyway
        yield
        return
    path = target.parent / f".{target.name}.lock"
    try:
        fd = _lock_file(path)
    except OSError as exc:
        raise OutputError(f"cannot lock {path}: {exc.strerror or exc}") from exc
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # while still held: a waiter then re-opens (see _lock_file)
        os.close(fd)


def _publish(tmp: Path, target: Path, force: bool) -> None:
    """Under the output lock: check that target may be written, then rename tmp onto it."""
    with output_lock(target):
        _check_target(target, force)
        if before_rename is not None:
            before_rename(target)
        _replace(tmp, target)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    rc = fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)
    return rc == 0


def _replace(tmp: Path, target: Path) -> None:
    """Move tmp onto target. An existing target (only with force) is replaced atomically: a
    file by rename, a directory by an exchange (then the old tree, now at tmp, is removed), so
    a kill at any moment leaves the old or the new output at target, never none."""
    if not (target.exists() or target.is_symlink()):
        try:
            os.rename(tmp, target)
        except OSError as exc:  # ENOTEMPTY/EEXIST: published by a writer outside our lock
            raise OutputError(f"{target} exists; pass --force to replace it") from exc
    elif not tmp.is_dir() and not target.is_dir():
        os.replace(tmp, target)
    elif _exchange(tmp, target):
        shutil.rmtree(tmp, ignore_errors=True)
    else:  # no exchange: move aside, then rename (a kill between leaves the old in `.old-*`)
        trash, lock = _temp_dir(target, "old")
        try:
            os.rename(target, trash / "old")
            try:
                os.rename(tmp, target)
            except BaseException:
                os.rename(trash / "old", target)
                raise
        finally:
            shutil.rmtree(trash, ignore_errors=True)
            _unlock(lock)
    fsync_path(target.parent)


@contextlib.contextmanager
def atomic_dir(target: Path, *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary directory that becomes `target` when the block succeeds."""
    target = Path(target).absolute()
    _check_target(target, force)
    remove_stale_temps(target)  # a killed run's leftovers (GBs, maybe); never a live run's
    tmp, lock = _temp_dir(target, "tmp")
    try:
        yield tmp
        fsync_tree(tmp)
        _publish(tmp, target, force)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        _unlock(lock)


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
        _publish(tmp, target, force)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def write_bytes_atomic(target: Path, data: bytes, *, force: bool = False) -> None:
    with atomic_file(target, force=force) as fh:
        fh.write(data)
