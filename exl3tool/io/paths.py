"""Path hygiene for files named inside manifests: relative, inside the root, no symlinks.

Files are opened component by component with O_NOFOLLOW relative to the artifact directory,
so a symlink anywhere on the way (or a swap to one) cannot redirect the read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath


class PathViolation(Exception):
    """`kind` is one of: escape, symlink, missing, not-regular."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def relative_path_problem(rel: object) -> str | None:
    """Why `rel` is not an acceptable relative path inside an artifact, or None."""
    if not isinstance(rel, str) or not rel:
        return "must be a non-empty string"
    if rel.startswith("/") or (len(rel) > 1 and rel[1] == ":") or rel.startswith("\\"):
        return "must be relative"
    if "\\" in rel or "\x00" in rel or any(ord(c) < 0x20 for c in rel):
        return "contains a backslash or control character"
    parts = PurePosixPath(rel).parts
    if ".." in rel.split("/"):
        return "contains a '..' segment"
    if not parts or all(p == "." for p in parts):
        return "names the directory itself"
    return None


def open_inside(root: Path, rel: str) -> int:
    """Open `root/rel` read-only without following any symlink; return the fd of a regular file."""
    problem = relative_path_problem(rel)
    if problem:
        raise PathViolation("escape", f"{rel!r} {problem}")
    parts = [p for p in PurePosixPath(rel).parts if p != "."]
    flags_dir = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        dfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise PathViolation("missing", f"{root}: {exc.strerror}") from exc
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            try:
                st = os.stat(part, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError as exc:
                raise PathViolation("missing", f"{rel}: no such file") from exc
            if stat.S_ISLNK(st.st_mode):
                raise PathViolation("symlink", f"{rel}: {'/'.join(parts[: i + 1])} is a symlink")
            if not last:
                nfd = os.open(part, flags_dir, dir_fd=dfd)
                os.close(dfd)
                dfd = nfd
                continue
            if not stat.S_ISREG(st.st_mode):
                raise PathViolation("not-regular", f"{rel}: not a regular file")
            fd = os.open(
                part, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0), dir_fd=dfd
            )
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise PathViolation("not-regular", f"{rel}: not a regular file")
            return fd
        raise PathViolation("escape", f"{rel!r} names a directory")
    finally:
        os.close(dfd)


def is_within(root: Path, path: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return True
