"""Where an output may be written: checks made before any work and again at publication, so
that no `--force` ever destroys or changes an input (io/atomic writes the output itself).

An output is refused, with or without `--force`, when it
- is an input, or a folder holding one (`-o .` next to the checkpoint, `-o CHECKPOINT`);
- is a folder output (a slice, a staged cartridge) inside an input folder: its files would
  become part of the input;
- is a file an input folder links to (a Hugging Face snapshot's blob);
- would replace a `.safetensors`, `.json`, `.model` or `.py` file or the R7 seal
  `MANIFEST.sha256` inside an input folder (a decoded tensor over a shard, a report over a
  config); a new file there (a `SHA256SUMS` manifest beside the shards) is allowed, and so is
  replacing another kind of file;
- exists and is of the other kind (a folder where a file goes, or a file where a folder
  goes), or is not a regular file, a folder or a link (a FIFO, a device): `--force` replaces
  outputs, not what happens to be at a path.
A link at the output path is replaced itself (never written through).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from exl3tool.rules.errors import OutputError

# the files an artifact is made of: an output never replaces one inside an input folder
ARTIFACT_SUFFIXES = (".safetensors", ".json", ".model", ".py")
ARTIFACT_NAMES = ("MANIFEST.sha256",)  # the R7 seal (a `--sha256sum` manifest has another name)
_NAMES = frozenset(n.lower() for n in ARTIFACT_NAMES)  # a case-insensitive file system too


def real_location(path: Path) -> Path:
    """`path` with every link resolved but its last component (an output link is replaced,
    not followed). `..` is resolved by the file system, after the link before it, as `open`
    would (never as text: `L/..` is the parent of where L points); `.` and `..` at the end
    name the folders they resolve to."""
    path = Path(path).absolute()  # absolute() keeps `..` as written
    if path.name in ("", ".", ".."):
        return Path(os.path.realpath(path))
    return Path(os.path.realpath(path.parent)) / path.name


def check_target(target: Path, force: bool, *, directory: bool) -> None:
    """OutputError unless `target` may be written: absent, or replaceable with `force` (a file
    for a file output, a folder for a folder output, or a link); its parent a folder."""
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise OutputError(f"{target}: {exc.strerror or exc}") from exc
    if st is not None:
        if not force:
            raise OutputError(f"{target} exists; pass --force to replace it")
        if directory and _holds_cwd(target):  # `-o "" --force` (an unset variable) is `-o .`
            raise OutputError(
                f"{target} is the current folder or holds it; it is not replaced (name a new "
                "folder for the output)"
            )
        mode = st.st_mode
        if stat.S_ISDIR(mode) and not directory:
            raise OutputError(f"{target} is a folder; name a file to write")
        if stat.S_ISREG(mode) and directory:
            raise OutputError(f"{target} is a file; name a folder to write")
        if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
            raise OutputError(f"{target} is not a regular file or folder; it is not replaced")
    if not target.parent.is_dir():
        raise OutputError(f"{target.parent} is not a directory")


def _holds_cwd(target: Path) -> bool:
    """Whether replacing the folder `target` would remove the current working folder."""
    try:
        here, there = Path.cwd().resolve(), Path(target).resolve()
    except (OSError, RuntimeError):
        return True  # cannot tell: do not replace
    return there == here or there in here.parents


def _identity(path: Path, follow: bool = True) -> tuple[int, int] | None:
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def _folders_of(path: Path) -> set[tuple[int, int]]:
    """The identity (device, inode) of every existing folder that holds `path`: links,
    `..`, bind mounts and case-insensitive names all end at the same inodes."""
    out = set()
    for folder in Path(path).absolute().parents:
        got = _identity(folder)
        if got is not None:
            out.add(got)
    return out


MAX_SCANNED = 20_000  # entries of an input folder looked at for links to the output
MAX_DEPTH = 2  # folder levels below it (a snapshot keeps its files at the top or one level in)


def _linked_files(folder: Path) -> set[tuple[int, int]]:
    """The identity of every file an input folder links to (a Hugging Face snapshot links each
    of its files into the cache's blobs/), at most MAX_SCANNED entries and MAX_DEPTH levels
    looked at (a shard given as a file may lie in a large folder)."""
    out: set[tuple[int, int]] = set()
    seen = 0
    top = len(Path(folder).parts)
    for dirpath, dirs, names in os.walk(folder):
        if len(Path(dirpath).parts) - top >= MAX_DEPTH:
            dirs[:] = []
        for name in names:
            seen += 1
            if seen > MAX_SCANNED:
                return out
            path = os.path.join(dirpath, name)
            got = _identity(Path(path)) if os.path.islink(path) else None
            if got is not None:
                out.add(got)
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(dirpath, d))]
    return out


def _local(item: str | Path) -> Path | None:
    """The local path an input argument names: itself, or a Hub id's cached snapshot (None
    when it is neither: the command reports that)."""
    if os.path.lexists(item):
        return Path(item)
    from exl3tool.io.hf_cache import resolve_artifact

    try:
        got = resolve_artifact(str(item))
    except Exception:  # not cached, no huggingface_hub: nothing to protect here
        return None
    return got if os.path.lexists(got) else None


def check_apart(target: Path, inputs: Iterable[str | Path], *, directory: bool) -> None:
    """OutputError when writing `target` could destroy or change one of `inputs` (see the
    module docstring). Places are compared by device and inode, so no link, `..` or letter
    case makes an input look like another place. An input that is a file (a shard, or the
    config.json naming its folder) protects the files beside it too."""
    out = real_location(target)
    out_id = _identity(out, follow=False)  # the output's own entry (a link is not followed)
    out_in = _folders_of(out)  # the folders the output would be written in
    for item in inputs:
        src = _local(item)
        src_id = _identity(src) if src is not None else None
        if src is None or src_id is None:
            continue
        if out_id is not None and (out_id == src_id or out_id in _folders_of(real_location(src))):
            raise OutputError(f"{target} is or holds the input {item}; write the output elsewhere")
        folder = src if src.is_dir() else src.parent
        if out_id is not None and not directory and out_id in _linked_files(folder):
            raise OutputError(  # a file an input links to (a Hugging Face cache blob)
                f"{target} is a file of the input {item} (through a link); write the output "
                "elsewhere"
            )
        if _identity(folder) not in out_in:
            continue
        if directory and src.is_dir():
            raise OutputError(
                f"{target} is inside the input {item}; its files would become part of it"
            )
        protected = out.suffix.lower() in ARTIFACT_SUFFIXES or out.name.lower() in _NAMES
        if not directory and protected and os.path.lexists(out):
            raise OutputError(
                f"{target} would replace a file of the input {item}; write the output elsewhere"
            )


def check_output_place(
    target: Path, force: bool, inputs: Iterable[str | Path], *, directory: bool
) -> None:
    """Both checks an output gets before any work: apart from every input (`check_apart`),
    and writable at its path (`check_target`)."""
    check_apart(target, inputs, directory=directory)
    check_target(target, force, directory=directory)
