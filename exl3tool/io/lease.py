"""A file held under a Linux read lease, read through one read-only mapping of the whole file.

`fcntl(F_SETLEASE, F_RDLCK)` on a read-only descriptor succeeds only while nobody has the file
open for writing. While it is held, another process's open for writing, `O_TRUNC` or
`truncate(2)` blocks for up to /proc/sys/fs/lease-break-time seconds (45 by default) and the
lease shows as breaking. So a mapping of a leased file cannot lose its pages (the SIGBUS of
issue 15) as long as its reader calls `intact()` before each few MB it touches and, once that
is False, touches no mapping of the file again before `close()` (which lets the writer go on).

The file is mapped once (`whole`) and its readers drop the pages they are done with (`drop`:
madvise MADV_DONTNEED), so resident memory stays near the bytes being hashed. A mapping per
window instead serialises every thread's page faults behind each mmap and munmap (both take
the process's address-space lock for writing); dropping pages takes it for reading only.

The break is noticed by polling F_GETLEASE, not through its signal: the signal is set to
SIGURG, which is ignored by default, so no handler (Python runs them in the main thread only)
is needed and no late signal can end the process.

`LeaseRefused` (read the file with pread instead) when: not Linux; the caller neither owns the
file nor has CAP_LEASE (EACCES); a writer has it open (EAGAIN); the filesystem is not one of
LOCAL_FS, where every writer goes through this kernel (NFS, FUSE, 9p, overlay: a writer
elsewhere would not break the lease); the kernel has no leases (EINVAL: gVisor); the
lease-break-time is under MIN_BREAK_S. A mapped page can still fault on a disk read error,
where pread would return EIO.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import signal
import stat
import sys
import threading
from pathlib import Path

from exl3tool.io.safetensors import FileStamp

# linux/magic.h: filesystems whose every writer is a local open that breaks the lease
LOCAL_FS = {
    0xEF53: "ext2/3/4",
    0x58465342: "xfs",
    0x9123683E: "btrfs",
    0xF2F52010: "f2fs",
    0x2FC12FC1: "zfs",
    0x01021994: "tmpfs",
}
# A read fault maps more than its page: the cached pages of the aligned fault_around_bytes
# block around it (64 KiB by default), and since Linux 6.16 (ext4 large folios; tmpfs, xfs
# earlier) the whole page-cache folio it falls in, up to a PMD (2 MiB on x86-64 and arm64 with
# 4 KiB pages). A drop widened to 2 MiB blocks of the file leaves none of them behind; one
# widened to 64 KiB left up to a folio per drop point resident (16 GB hashed by 16 workers:
# ~40 MB more, growing with the bytes hashed; benchmarks/identity_memory_probe.py).
DROP_ALIGN = max(2 << 20, mmap.PAGESIZE)
MIN_BREAK_S = 5  # a reader checks `intact()` every few MB: well within this even when loaded
_F_SETSIG, _F_SETLEASE, _F_GETLEASE = 10, 1024, 1025  # linux/fcntl.h
_BREAK_TIME = Path("/proc/sys/fs/lease-break-time")


class LeaseRefused(Exception):
    """The file cannot be held under a read lease here (the reason is the message)."""


def _fs_type(fd: int) -> int | None:
    """statfs' f_type of an open file; None where it cannot be read (f_type is a word whose
    low 32 bits come first on little-endian Linux, whatever its width)."""
    if sys.byteorder != "little":
        return None
    import ctypes

    buf = ctypes.create_string_buffer(512)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.fstatfs(fd, buf) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return int.from_bytes(buf.raw[:4], "little")


def _refusal(fd: int, st: os.stat_result) -> str | None:
    """Why this open file may not be leased and mapped, or None."""
    if not sys.platform.startswith("linux") or sys.maxsize < 1 << 32:
        return "read leases are used on 64-bit Linux only"
    if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
        return "not a non-empty regular file"
    try:
        brk = int(_BREAK_TIME.read_text())
    except (OSError, ValueError):
        return f"{_BREAK_TIME} unreadable"
    if brk < MIN_BREAK_S:
        return f"lease-break-time {brk} s < {MIN_BREAK_S} s"
    fs = _fs_type(fd)
    if fs not in LOCAL_FS:
        return "filesystem type " + ("unknown" if fs is None else hex(fs)) + " is not local"
    return None


class LeasedMap:
    """An open regular file under a read lease: `stamp` and `size` cannot change while
    `intact()` is True; `whole` maps it read-only. Raises LeaseRefused (or OSError
    from open) when it cannot be held; `close()` releases the lease."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        # O_NONBLOCK: a FIFO posing as a shard must not hang the open
        self._fd: int | None = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            why = _refusal(self._fd, os.fstat(self._fd))
            if why:
                raise LeaseRefused(why)
            try:
                import fcntl

                fcntl.fcntl(self._fd, _F_SETSIG, signal.SIGURG)
                fcntl.fcntl(self._fd, _F_SETLEASE, fcntl.F_RDLCK)
            except OSError as exc:
                name = errno.errorcode.get(exc.errno or 0, "error")
                raise LeaseRefused(f"F_SETLEASE: {name} ({exc.strerror})") from exc
            self.stamp = FileStamp.of(os.fstat(self._fd))  # fixed from here while intact
        except BaseException:
            fd, self._fd = self._fd, None  # cleared first: never closed twice
            os.close(fd)
            raise
        self.size = self.stamp.size
        self._map: mmap.mmap | None = None
        self._whole: memoryview | None = None
        self._whole_lock = threading.Lock()

    def _fileno(self) -> int:
        if self._fd is None:
            raise ValueError(f"{self.path}: file is closed")
        return self._fd

    def intact(self) -> bool:
        """True while nobody waits to write or truncate the file (check before touching a
        mapping, and again every few MB)."""
        import fcntl

        try:
            return fcntl.fcntl(self._fileno(), _F_GETLEASE) == fcntl.F_RDLCK
        except OSError:
            return False

    def whole(self) -> memoryview:
        """A read-only view of the whole file, mapped once for every reader (thread-safe);
        `drop` the pages of each range once read. Valid until `close()`."""
        view = self._whole
        if view is None:
            with self._whole_lock:
                view = self._whole
                if view is None:
                    self._map = mmap.mmap(
                        self._fileno(), self.size, mmap.MAP_SHARED, mmap.PROT_READ
                    )
                    view = self._whole = memoryview(self._map)
        return view

    def drop(self, start: int, end: int) -> None:
        """Drop the pages of [start, end) of `whole` from this process's resident memory (the
        page cache keeps them; a later read faults them in again). The range is widened to
        whole DROP_ALIGN blocks: a fault maps the cached pages of its block or folio beside
        the one it asked for, so a page-aligned drop would leave an edge resident per range
        (resident memory that grew with the bytes hashed). A page of the widened range that
        another thread still reads is faulted in again from the cache."""
        if self._map is None or end <= start:
            return
        lo = start - start % DROP_ALIGN
        hi = min(end + (-end % DROP_ALIGN), self.size + (-self.size % mmap.PAGESIZE))
        self._map.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def fstat(self) -> FileStamp:
        return FileStamp.of(os.fstat(self._fileno()))

    def close(self) -> None:
        """Release the lease (a waiting writer goes on) and the file; every window of it must
        be closed, and none touched after a failed `intact()`, before this."""
        if self._whole is not None:
            self._whole.release()
            self._whole = None
        if self._map is not None:
            with contextlib.suppress(BufferError):  # a view outlived an error: unmapped when freed
                self._map.close()
            self._map = None
        if self._fd is not None:
            import fcntl

            # fails once the kernel's timeout broke it; closing releases it anyway
            with contextlib.suppress(OSError):
                fcntl.fcntl(self._fd, _F_SETLEASE, fcntl.F_UNLCK)
            fd, self._fd = self._fd, None  # cleared first: never closed twice
            os.close(fd)
