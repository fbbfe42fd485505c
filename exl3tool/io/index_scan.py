"""A checkpoint's `model.safetensors.index.json` read by its weight_map's groups, not parsed.

The loader only tests the weight_map against the shards' headers: every name in the file it
names, every tensor named. A GLM-5.2 index is 16 MB of 176,812 names; `json.loads` builds two
strings and a dict slot for each (~0.1 s, a tenth of `validate`). `scan_index` reads the plain
form of the document in one C pass (native/header_scan.c, `index_scan`): per file, how many
names it is given and the sum of their str hashes. A shard whose header holds as many names,
all ASCII, with the same sum holds those names, barring a 64-bit collision of Python's keyed
string hash, whose key no input can know:
- only ASCII names are compared: CPython hashes a string's stored bytes, and a name stored two
  bytes a character (U+0100 and up) can have the bytes of an ASCII one, under any key;
- a fixed PYTHONHASHSEED would let an input know the key, so it turns the scan off (read from
  the environment as this module is imported, as the interpreter read it as it started).
Anything that is not the plain form (escapes, bytes past ASCII, other members, a metadata value
with a JSON issue) is None: the loader parses the document strictly, as it does without C.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from exl3tool.io import native
from exl3tool.io.strict_json import loads

# native/header_scan.c: (metadata begin, end, entries, groups) of a plain index, or None
_native_index_scan: Callable[[bytes], tuple[int, int, int, dict[str, Any]] | None] | None = None
if native.ENABLED:
    with contextlib.suppress(ImportError):
        from exl3tool.io._header_scan import index_scan as _native_index_scan

_MOD = 1 << 64
# PYTHONHASHSEED set to a number fixes the string hash's key (sys.flags says only whether it
# is 0); unset, empty or "random", or ignored with the environment (-E, -I), the key is random.
_KEYED = sys.flags.ignore_environment or os.environ.get("PYTHONHASHSEED", "") in ("", "random")
_ABSENT = object()


@dataclass(frozen=True)
class IndexScan:
    """An index document's weight_map by file: `groups[file]` = (names, sum of their hashes mod
    2**64); `entries` its members (a repeated name counted each time); its metadata value,
    parsed strictly, when it has one."""

    entries: int
    groups: dict[str, tuple[int, int]]
    metadata: Any = _ABSENT

    @property
    def document(self) -> dict[str, Any]:
        """The document without its weight_map."""
        return {} if self.metadata is _ABSENT else {"metadata": self.metadata}


def scan_index(data: bytes) -> IndexScan | None:
    """The weight_map groups of the index `data`, or None (parse it)."""
    if _native_index_scan is None or not _KEYED:
        return None
    got = _native_index_scan(data)
    if got is None:
        return None
    begin, end, entries, groups = got
    if begin < 0:
        return IndexScan(entries, groups)
    value, issues = loads(b'{"metadata":' + data[begin:end] + b"}")
    if issues or not isinstance(value, dict):
        return None
    return IndexScan(entries, groups, value["metadata"])


def holds_group(names: Collection[str], group: tuple[int, int]) -> bool:
    """Whether the distinct `names` (a shard's) are the names of a weight_map group (whose
    names are ASCII: the scan takes no other)."""
    count, total = group
    if len(names) != count or not all(map(str.isascii, names)):
        return False
    return sum(map(hash, names)) % _MOD == total
