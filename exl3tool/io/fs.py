"""File-system questions about names users and documents give, answered without raising, and
the one reader of small documents (configs, manifests, records).

`Path.exists()` raises for a name the OS cannot even look up (longer than NAME_MAX, a NUL
byte): such a name names nothing here, and the caller reports it as missing.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path


def exists(path: str | os.PathLike[str]) -> bool:
    """Whether `path` exists (following links); False for a name that cannot be looked up."""
    try:
        return Path(path).exists()
    except (OSError, ValueError):
        return False


SHOWN_MAX = 160  # characters of a path in a one-line message


def shown(path: str | os.PathLike[str]) -> str:
    """`path` for a one-line message: a hostile name of thousands of characters is cut."""
    text = os.fspath(path)
    if len(text) <= SHOWN_MAX:
        return text
    return f"{text[: SHOWN_MAX - 40]}…({len(text)} characters)…{text[-24:]}"


def shown_words(text: str) -> str:
    """`text` with every word longer than SHOWN_MAX cut as `shown` cuts a path."""
    return _LONG_WORD.sub(lambda m: shown(m.group()), text) if len(text) > SHOWN_MAX else text


_LONG_WORD = re.compile(rf"\S{{{SHOWN_MAX + 1},}}")


def read_document(path: str | os.PathLike[str], max_bytes: int) -> bytes:
    """The whole of a regular file of at most `max_bytes` (OSError, or ValueError when larger).
    Opened without blocking: a FIFO posing as the document is an error, not a hang."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with open(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
        if st.st_size > max_bytes:
            raise ValueError(f"{st.st_size} bytes, limit {max_bytes}")
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"more than {max_bytes} bytes")
    return data
