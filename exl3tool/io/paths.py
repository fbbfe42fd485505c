"""Path hygiene for files named inside manifests: relative, inside the root, no stray symlinks.

Files are opened component by component with O_NOFOLLOW relative to the artifact directory,
so a symlink anywhere on the way (or a swap to one) cannot redirect the read. Where a caller
allows it (`links=`), a symlink whose target stays inside the artifact or lies in the Hugging Face
cache's `blobs/` (how every snapshot file is stored) is read like the file it names.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath
from typing import Literal

from exl3tool.io.hf_cache import blob_root, is_cache_blob

# none: every symlink is a violation (what the serving runtime does for adapter files);
# cache: links into the artifact or the hub cache's blobs/ are files, others are violations;
# any: every link is followed (stage-cartridge reads them to write real files).
Links = Literal["none", "cache", "any"]
MAX_NAME, MAX_PATH = 255, 4095  # bytes: NAME_MAX and PATH_MAX - 1 of Linux file systems


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
    try:
        raw = rel.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode (a lone surrogate)"
    if len(raw) > MAX_PATH or any(len(p.encode()) > MAX_NAME for p in rel.split("/")):
        return f"is longer than file systems allow ({MAX_NAME} bytes a name, {MAX_PATH} a path)"
    parts = PurePosixPath(rel).parts
    if ".." in rel.split("/"):
        return "contains a '..' segment"
    if not parts or all(p == "." for p in parts):
        return "names the directory itself"
    return None


def link_escape(root: Path, path: Path) -> str | None:
    """Why the symlink `path` inside `root` leaves both the artifact and the hub cache's blobs/,
    or None (not a link, a link that stays inside, a link into the cache, or a dangling link,
    which readers report as missing)."""
    try:
        if not os.path.islink(path):
            return None
    except (OSError, ValueError):
        return None
    return _escape(root, path)


def _escape(root: Path, path: Path) -> str | None:
    """Why what `path` resolves to (through links at any component) lies outside `root` and the
    hub cache's blobs/, or None (also for a target that does not exist: readers report it)."""
    try:
        target = Path(os.path.realpath(path))
        if not target.exists():
            return None
    except (OSError, ValueError):
        return None
    if is_within(root, target):
        return None
    blobs = blob_root(root)
    if blobs is not None:  # a snapshot reads its own repository's blobs, no other
        if is_within(blobs, target):
            return None
    elif is_cache_blob(target):  # a folder of links into the cache (an older --local-dir)
        return None
    return f"symlink to {target}, outside the artifact and the Hugging Face cache"


def _open_link(root: Path, rel: str, shown: str, links: Links) -> int:
    """Open the file that the symlink path `root/rel` names, if `links` allows that target."""
    path = root / rel
    problem = _escape(root, path) if links == "cache" else None
    if problem:
        raise PathViolation("symlink", f"{rel}: {shown} is a {problem}")
    target = os.path.realpath(path)
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError as exc:
        raise PathViolation("missing", f"{rel}: {shown} is a dangling symlink") from exc
    except OSError as exc:
        raise PathViolation("not-regular", f"{rel}: {exc.strerror or exc}") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise PathViolation("not-regular", f"{rel}: not a regular file")
    return fd


def open_inside(root: Path, rel: str, *, links: Links = "none") -> int:
    """Open `root/rel` read-only; return the fd of a regular file. No symlink is followed unless
    `links` allows it (see `Links`)."""
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
            except OSError as exc:  # ENAMETOOLONG, ELOOP, EACCES ...
                raise PathViolation("missing", f"{rel}: {exc.strerror or exc}") from exc
            if stat.S_ISLNK(st.st_mode):
                shown = "/".join(parts[: i + 1])
                if links == "none":
                    raise PathViolation("symlink", f"{rel}: {shown} is a symlink")
                return _open_link(root, "/".join(parts), shown, links)
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
