"""Shard headers parsed ahead by forked workers, while this process reads the configs and the
index (issue 17: on 16 cores, identity's serial header parsing was ~40 % of its run).

Each worker runs the same `read_header` this process would, on one shard at a time. It sends
the result back only when that header is clean (not one finding, no dropped entry) and the
file did not change lately; otherwise the loader reads the shard itself, so every finding is
still made by this process, in its own order. A result is taken only for the file the loader
opens, with the stamp the worker read it under: a shard replaced or rewritten in between is
read again.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from collections.abc import Callable
from itertools import repeat
from operator import itemgetter
from pathlib import Path
from typing import Any

from exl3tool.io import forkpool, views
from exl3tool.io.progress import NO_PROGRESS
from exl3tool.io.safetensors import FileStamp, SafetensorsFile, TensorInfo, read_header
from exl3tool.rules.registry import Findings

MIN_SHARDS = 2  # one shard: nothing to parse beside it (and its header would be held twice)
MAX_SHARDS = 4096
MAX_HEADER = 16 << 20  # a larger header (~160,000+ tensors) is read by the loader itself
MIN_WORKERS = 4  # below this the cores are the hashing's
# Workers per core to use: a quarter parse faster than the loader takes their results (16 cores,
# 14 shards of ~5,800 tensors), and every worker adds its parse to the peak memory of the run
# (14 workers: +30 MB, over the 300 MB target with the compatibility block).
SHARE = 4

# (stamp fields, header length, metadata, tensor rows): a clean header, as plain values
_Packed = tuple[tuple[int, ...], int, "dict[str, str] | None", list[tuple[Any, ...]]]
_NAME = itemgetter(0)


class HeadersAhead:
    """Workers parsing the headers of `paths`; the loader `take`s each."""

    def __init__(self, paths: list[Path], workers: int) -> None:
        self._index = {os.fspath(p): i for i, p in enumerate(paths)}
        self._got: dict[int, _Packed | None] = {}
        self._taken: set[int] = set()
        self._done = False
        self._cond = threading.Condition()
        self._pool: forkpool.ForkPool | None = forkpool.ForkPool(
            workers, range(len(paths)), _starter(paths), self._accept, NO_PROGRESS
        )
        self._waiter = threading.Thread(target=self._wait, name="exl3-headers", daemon=True)
        self._waiter.start()

    def _accept(self, result: tuple[int, _Packed | None]) -> None:
        with self._cond:
            self._got[result[0]] = result[1]
            self._cond.notify_all()

    def _wait(self) -> None:
        pool = self._pool
        try:
            if pool is not None:
                with contextlib.suppress(Exception):  # a failed worker: the loader reads
                    pool.wait()
        finally:
            with self._cond:
                self._done = True
                self._cond.notify_all()

    def take(self, path: Path, label: str) -> SafetensorsFile | None:
        """The header of `path` as the loader would read it now, or None (read it yourself)."""
        i = self._index.get(os.fspath(path))
        if i is None or i in self._taken:  # asked again (another spelling of the same shard)
            return None
        self._taken.add(i)
        with self._cond:
            while i not in self._got and not self._done:
                self._cond.wait()
            packed = self._got.pop(i, None)
        if packed is None:
            return None
        fields, header_len, metadata, rows = packed
        stamp = views.stamp_of_path(path)  # `open` follows a final link, and so does this
        if stamp is None or stamp != FileStamp(*fields):
            return None  # replaced or rewritten since the worker read it
        out = SafetensorsFile(path, label, stamp.size, header_len, stamp)
        infos = map(tuple.__new__, repeat(TensorInfo), rows)
        out.tensors = dict(zip(map(_NAME, rows), infos, strict=True))
        out.metadata = metadata
        return out

    def stop(self) -> None:
        """Stop the workers (what they did not send is read by the loader); the waiting thread
        then reaps them."""
        pool = self._pool
        if pool is not None:
            pool.cancel()
        self._waiter.join()


def _starter(paths: list[Path]) -> Callable[[Any], Callable[[int], tuple[int, Any]]]:
    def start(_progress: Any) -> Callable[[int], tuple[int, Any]]:  # in each worker
        def work(i: int) -> tuple[int, _Packed | None]:
            return i, _read_clean(paths[i])

        return work

    return start


def _read_clean(path: Path) -> _Packed | None:
    """`read_header(path)` as plain values when it makes no finding; else None."""
    findings = Findings()
    began = time.time_ns()
    try:
        if not _small_header(path):
            return None
        st = read_header(path, findings)
    except Exception:  # the loader reads it again and says what is wrong
        return None
    if st is None or len(findings) or st.invalid_entries:
        return None
    if views.changed_lately(st.stamp, began):  # see views.RACY_NS
        return None
    s = st.stamp
    rows = list(map(tuple, st.tensors.values()))  # plain tuples: unpickled without Python calls
    return (s.dev, s.ino, s.size, s.mtime_ns, s.ctime_ns), st.header_len, st.metadata, rows


def _small_header(path: Path) -> bool:
    """Whether `path` is a regular file whose header length is at most MAX_HEADER (a FIFO is
    not waited for)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        head = os.pread(fd, 8, 0)
    finally:
        os.close(fd)
    return len(head) == 8 and 0 < int.from_bytes(head, "little") <= MAX_HEADER


def start(root: Path, names: list[str], workers: int) -> HeadersAhead | None:
    """Workers parsing the headers of `names` (shards under `root`), or None where that cannot
    pay (under MIN_WORKERS cores to use, one shard) or cannot be done (no fork;
    EXL3TOOL_NO_FORK or EXL3TOOL_NO_AHEAD set)."""
    if workers < MIN_WORKERS or not MIN_SHARDS <= len(names) <= MAX_SHARDS:
        return None
    if os.environ.get("EXL3TOOL_NO_FORK") or os.environ.get("EXL3TOOL_NO_AHEAD"):
        return None
    if not forkpool.available():
        return None
    paths = [root / n for n in names]
    try:
        return HeadersAhead(paths, min(max(2, workers // SHARE), len(paths)))
    except OSError:  # no process or pipe left: the loader reads them all
        return None
