"""Where an output may be written: checks made before any work and again at publication, so
that no `--force` ever destroys or changes an input (io/atomic writes the output itself).

An output is refused, with or without `--force`, when it
- is an input, or a folder holding one (`-o .` next to the checkpoint, `-o CHECKPOINT`);
- is a folder output (a slice, a staged cartridge) inside an input folder: its files would
  become part of the input;
- would replace a `.safetensors` or `.json` file inside an input folder (a decoded tensor
  over a shard, a report over a config); a new file there (a `SHA256SUMS` manifest beside the
  shards) is allowed, and so is replacing another kind of file;
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
ARTIFACT_SUFFIXES = (".safetensors", ".json")


def real_location(path: Path) -> Path:
    """`path` with every link resolved but its last component (an output link is replaced,
    not followed); `.` and `..` as the folders they name."""
    path = Path(os.path.abspath(path))
    return Path(os.path.realpath(path.parent)) / path.name if path.name else path


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
        mode = st.st_mode
        if stat.S_ISDIR(mode) and not directory:
            raise OutputError(f"{target} is a folder; name a file to write")
        if stat.S_ISREG(mode) and directory:
            raise OutputError(f"{target} is a file; name a folder to write")
        if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
            raise OutputError(f"{target} is not a regular file or folder; it is not replaced")
    if not target.parent.is_dir():
        raise OutputError(f"{target.parent} is not a directory")


def check_apart(target: Path, inputs: Iterable[str | Path], *, directory: bool) -> None:
    """OutputError when writing `target` could destroy or change one of `inputs` (see the
    module docstring). An input that is not a local path (a Hub id) is skipped."""
    out = real_location(target)
    for item in inputs:
        src = Path(os.path.realpath(item))
        if not os.path.lexists(src):
            continue
        if out == src or src.is_relative_to(out):
            raise OutputError(f"{target} is or holds the input {item}; write the output elsewhere")
        if not src.is_dir() or not out.is_relative_to(src):
            continue
        if directory:
            raise OutputError(
                f"{target} is inside the input {item}; its files would become part of it"
            )
        if out.suffix in ARTIFACT_SUFFIXES and os.path.lexists(out):
            raise OutputError(
                f"{target} would replace a file of the input {item}; write the output elsewhere"
            )
