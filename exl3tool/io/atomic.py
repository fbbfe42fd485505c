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
import errno
import os
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from exl3tool.io.outputs import check_apart, check_output_place, check_target
from exl3tool.rules.errors import OutputError, interrupts_deferred


def remove_tree(path: Path) -> None:
    """Remove a temporary tree (ignoring what is already gone); an interrupt that comes
    meanwhile is raised once it is removed, never halfway (rules.errors.interrupts_deferred)."""
    with interrupts_deferred():
        shutil.rmtree(path, ignore_errors=True)


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


# errors only a write raises (a read never does): the output's fault, not the input's (exit 1)
_WRITE_ERRNOS = frozenset(
    getattr(errno, n) for n in ("ENOSPC", "EDQUOT", "EROFS", "EFBIG") if hasattr(errno, n)
)


def _cannot_write(target: Path, exc: OSError) -> OutputError:
    return OutputError(f"{target}: cannot write: {exc.strerror or exc}")


@contextlib.contextmanager
def _as_output_error(target: Path) -> Iterator[None]:
    """A write's failure in the block (disk full, read-only) as an OutputError naming `target`;
    any other error as it is."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in _WRITE_ERRNOS:
            raise
        raise _cannot_write(target, exc) from exc


def _lock_dir(path: Path, *, wait: bool = True, directory: bool = True) -> int | None:
    """An fd of `path` (a folder, or a file when not `directory`) holding an exclusive flock;
    None when `wait` is False and another open file holds it (or `path` is gone). Where flock
    does not exist: an unlocked fd."""
    try:
        fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0))
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
    """A new hidden sibling `.NAME.{kind}-*` of target, made as mkdir makes a folder (mode 0777
    less the umask, which the kernel applies; mkdtemp's 0700 would make slices private), locked
    for as long as the fd is open."""
    import secrets

    for _ in range(100):
        tmp = target.parent / f".{target.name}.{kind}-{secrets.token_hex(4)}"
        try:
            os.mkdir(tmp, 0o777)
        except FileExistsError:
            continue
        except OSError as exc:
            raise _cannot_write(target, exc) from exc
        return tmp, _lock_dir(tmp)
    raise OutputError(f"{target}: no free name for a temporary folder beside it")


def _unlock(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


FRESH_S = 60.0  # a sibling younger than this may be a live run's, between mkdtemp and flock


def remove_stale_temps(target: Path) -> list[Path]:
    """Remove the hidden siblings (`.NAME.tmp-*` folders and files, `.NAME.old-*`) of target
    that no running process holds (a killed run's leftovers, at least FRESH_S old); returns
    what was removed."""
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
        is_dir = stat.S_ISDIR(st.st_mode)
        if not (is_dir or stat.S_ISREG(st.st_mode)) or time.time() - st.st_mtime < FRESH_S:
            continue
        fd = _lock_dir(e, wait=False, directory=is_dir)  # a live run holds its temporary
        if fd is None:
            continue
        try:
            if is_dir:
                shutil.rmtree(e, ignore_errors=True)
            else:
                e.unlink(missing_ok=True)
            removed.append(e)
        finally:
            os.close(fd)
    return removed


# Test hook: called under the output lock right before the rename (a delayed rename makes the
# check-then-rename race of two publishers deterministic in tests).
before_rename: Callable[[Path], None] | None = None


def _lock_file(path: Path) -> int:
    """An fd holding the exclusive flock of the lock file `path` (created if absent). A lock
    file unlinked by its last holder while we waited is not ours: open the new one again. An
    interrupt never leaves a lock file this run made: creating it and taking an uncontended
    lock are one step (a contended one is waited for, interruptibly: its holder removes it)."""
    import fcntl

    while True:
        fd, held = -1, False
        try:
            with interrupts_deferred():
                fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    held = True
                except BlockingIOError:  # another run holds it: waited for below
                    pass
        except BaseException:
            if held:  # an interrupt held back until now: leave as a holder would
                with contextlib.suppress(OSError):
                    os.unlink(path)
            if fd >= 0:
                os.close(fd)
            raise
        try:
            if not held:
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
        with interrupts_deferred():
            with contextlib.suppress(OSError):
                os.unlink(path)  # while still held: a waiter then re-opens (see _lock_file)
            os.close(fd)


def _publish(tmp: Path, target: Path, force: bool) -> None:
    """Under the output lock: check that target may be written, then rename tmp onto it."""
    with output_lock(target):
        check_target(target, force, directory=tmp.is_dir())
        if before_rename is not None:
            before_rename(target)
        with interrupts_deferred():  # the old output or the new one, and no temporary left
            _replace(tmp, target, force)


def _renameat2(a: Path, b: Path, flags: int) -> int | None:
    """Linux renameat2(a, b, flags): 0, or the errno it failed with; None where it does not
    exist (another OS, an old libc)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    at_fdcwd = -100
    rc = fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), flags)
    return 0 if rc == 0 else ctypes.get_errno()


_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    return _renameat2(a, b, _RENAME_EXCHANGE) == 0


def _rename_new(tmp: Path, target: Path) -> None:
    """Rename tmp to a target that must not exist: RENAME_NOREPLACE where the kernel and the
    file system have it, so that a target made meanwhile by a writer outside our lock is never
    replaced (a plain rename replaces a file, or an empty folder, without a word)."""
    err = _renameat2(tmp, target, _RENAME_NOREPLACE)
    if err in (None, errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):  # not here: a plain rename
        try:
            os.rename(tmp, target)
        except OSError as exc:  # ENOTEMPTY/EEXIST: published by a writer outside our lock
            raise OutputError(f"{target} exists; pass --force to replace it") from exc
    elif err in (errno.EEXIST, errno.ENOTEMPTY):
        raise OutputError(f"{target} exists; pass --force to replace it")
    elif err:
        raise OSError(err, os.strerror(err), str(target))


def _discard(path: Path) -> None:
    """Remove what is at `path`: a folder's tree, or the file or link itself."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _replace(tmp: Path, target: Path, force: bool) -> None:
    """Move tmp onto target. An existing target (only with force: a link, or an output of the
    same kind, `check_target`) is replaced atomically: a file by rename (a link is replaced
    itself), a directory by an exchange (then the old one, now at tmp, is removed), so a kill
    at any moment leaves the old or the new output at target, never none."""
    if not force or not os.path.lexists(target):
        _rename_new(tmp, target)  # never replaces: what is there now came after our checks
    elif not tmp.is_dir():
        os.replace(tmp, target)
    elif _exchange(tmp, target):
        _discard(tmp)
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
def atomic_dir(
    target: Path, *, force: bool = False, inputs: tuple[str | Path, ...] = ()
) -> Iterator[Path]:
    """Yield a temporary directory that becomes `target` when the block succeeds (mode 0777
    less the umask, as mkdir makes it; never near `inputs`: io/outputs)."""
    target = Path(target).absolute()
    check_output_place(target, force, inputs, directory=True)
    remove_stale_temps(target)  # a killed run's leftovers (GBs, maybe); never a live run's
    tmp: Path | None = None
    lock: int | None = None
    try:
        # made and locked at once: an interrupt comes before (nothing made) or after (known
        # to the cleanup below), never between (an empty `.NAME.tmp-*` left behind)
        with interrupts_deferred():
            tmp, lock = _temp_dir(target, "tmp")
        with _as_output_error(target):
            yield tmp
            fsync_tree(tmp)
            check_apart(target, inputs, directory=True)  # a link may have moved meanwhile
            _publish(tmp, target, force)
    except BaseException:
        if tmp is not None:
            remove_tree(tmp)
        raise
    finally:
        _unlock(lock)


@contextlib.contextmanager
def atomic_file(
    target: Path, *, force: bool = False, mode: str = "wb", inputs: tuple[str | Path, ...] = ()
) -> Iterator:
    """Yield a file object whose content becomes `target` when the block succeeds (never near
    `inputs`: io/outputs)."""
    target = Path(target).absolute()
    check_output_place(target, force, inputs, directory=False)
    remove_stale_temps(target)  # a killed run's leftover files; never a live run's
    tmp: Path | None = None
    held = -1  # a second descriptor whose flock `remove_stale_temps` sees until it is published
    try:
        with interrupts_deferred():  # the file is made and named at once: an interrupt comes
            try:  # after, when the cleanup below knows what to remove
                fd, name = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)
            except OSError as exc:
                raise _cannot_write(target, exc) from exc
            tmp = Path(name)
            fh = os.fdopen(fd, mode)
        with _as_output_error(target):
            with fh:
                if sys.platform != "win32":
                    import fcntl

                    held = os.dup(fh.fileno())
                    fcntl.flock(held, fcntl.LOCK_EX)
                yield fh
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o644)
            _publish(tmp, target, force)
    except BaseException:
        if tmp is not None:
            with interrupts_deferred(), contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        raise
    finally:
        if held >= 0:
            os.close(held)


def write_bytes_atomic(
    target: Path, data: bytes, *, force: bool = False, inputs: tuple[str | Path, ...] = ()
) -> None:
    with atomic_file(target, force=force, inputs=inputs) as fh:
        fh.write(data)
