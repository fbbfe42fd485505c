"""Tensor digests hashed ahead: forked workers hash the stored tensors of an artifact's shards
while this process still reads, checks and plans their headers (serial Python work that
otherwise leaves every other core idle).

Each worker finds a shard's tensor spans itself (the `data_offsets` of its header, nothing
checked: an unusual shard is left to the engine), hashes the tensors that start in its 32 MiB
chunk of the file as the engine would (engine.hash_spans, the file verified unchanged after)
and sends the digests back with the file's stamp. The engine takes a digest only for a
one-segment job of a file whose stamp is the one its header was read with
(`hash_segments(known=...)`) and hashes the rest itself. Nothing here decides a digest on its
own or makes a finding: a worker's failure only means that less is known ahead.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from exl3tool.formats.checkpoint import list_safetensors
from exl3tool.identity import engine
from exl3tool.io import forkpool, views
from exl3tool.io.progress import NO_PROGRESS
from exl3tool.io.safetensors import FileStamp
from exl3tool.io.views import PayloadFile

EARLY_MIN_BYTES = 256 << 20  # below this the forks cost more than the overlap saves
EARLY_MAX_FILES = 4096
HEADER_MAX = 4 << 20  # a larger header (~40,000+ tensors) is left to the engine: each worker
# holds the spans of the shard it hashes, and this bounds them to a few MB
# Hashing ahead pays where the headers are a good part of the run: blake3 always. sha256 hashes
# ~1.5 GB/s a core, so on few cores the headers' share is small, and the workers' own costs
# (forks, a lease and an open per chunk: +0.11 s of CPU on 4 GB) exceed it: 2 cores, GLM mix
# 1.542 vs 1.505 s paired (2.7 % slower; the Qwen3 mix 1.5 % faster). With many workers the
# serial headers are the larger share. Qwen3 mix of 16 GB, hashing ahead vs not, medians of 5-6
# pairs (`benchmarks/ab.py`, 16-core host): 4 cores 4.068 vs 3.834 s (6 % slower), 8 cores
# 2.358 vs 2.472 s, 16 cores 2.002 vs 2.170 s (the GLM mix 0.79x of 16 x hashlib either way).
AHEAD_ALGOS = ("blake3",)
AHEAD_MANY_ALGOS = ("sha256",)  # hashed ahead where MANY_CORES cores or more are usable
MANY_CORES = 8
MAX_UNITS = 1 << 16  # chunks of all shards (2 TiB); a larger artifact is left to the engine
SPARSE = 8  # a shard with under 1/SPARSE of its size allocated on disk is left to the engine
MAX_DIGESTS = 1 << 19  # this process keeps no more (~200 bytes each); the engine hashes the rest
CHUNK = engine.MAP_BATCH  # a unit: the tensors that start in this many bytes of one file

# How a worker reads (True: leased mappings, False: pread). Which is faster depends on the
# machine (blake3, 2 workers: pread 0.61 s vs mapped 0.73 s on a 2-core AMD EPYC VM, mapped
# 0.77 s vs pread 0.95 s on a 16-core Intel Xeon host; benchmarks/early_read_probe.py), so
# each worker hashes its first units of at least TRIAL_BYTES one way each, then keeps the way
# that took the less CPU time per byte.
READS = (True, False)
TRIAL_BYTES = 4 << 20

_Spans = tuple[list[int], list[tuple[int, int]]]  # starts, (start, end) sorted


class EarlyDigests:
    """Workers hashing every tensor of `shards` ahead: the engine's `Known`."""

    def __init__(self, shards: list[tuple[Path, int]], algo: str, workers: int) -> None:
        units = [(i, lo) for i, (_, size) in enumerate(shards) for lo in range(0, size, CHUNK)]
        self._lock = threading.Lock()
        self._stamps: dict[int, FileStamp | None] = {}  # None: units saw different files
        self._tables: dict[int, dict[int, str]] = {}
        self._by_inode: dict[tuple[int, int], int] = {}
        self._kept = 0  # digests accepted
        self._workers: forkpool.ForkPool | None = None  # to cancel, from a reader thread too
        self._workers = forkpool.ForkPool(
            workers, units, _starter(shards, algo, workers), self._accept, NO_PROGRESS
        )
        self._pool: forkpool.ForkPool | None = self._workers  # until waited for or stopped
        if self._kept > MAX_DIGESTS:  # filled up while the workers were forked
            self._workers.cancel()

    def _accept(self, result: tuple[int, FileStamp | None, list[int], list[str]]) -> None:
        i, stamp, keys, hexes = result
        if stamp is None:
            return
        with self._lock:
            self._kept += len(keys)
            if self._kept > MAX_DIGESTS:
                if self._workers is not None:
                    self._workers.cancel()
                return
            seen = self._stamps.get(i, stamp)
            if seen is None or seen != stamp:  # ctime too: a rewrite that kept its mtime
                self._stamps[i] = None
                self._tables.pop(i, None)
                return
            self._stamps[i] = stamp
            self._by_inode[(stamp.dev, stamp.ino)] = i
            self._tables.setdefault(i, {}).update(zip(keys, hexes, strict=True))

    def _finish(self) -> None:
        """Wait for the workers. A worker that dies stops them all: only the units sent by
        then are known."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        try:
            with contextlib.suppress(Exception):  # only less is known: the engine hashes the rest
                pool.wait()
        finally:
            pool.close()

    def lookup(self, path: Path, stamp: FileStamp) -> Mapping[int, str] | None:
        """The digests hashed ahead of the file `path` named when it had `stamp`."""
        self._finish()
        i = self._by_inode.get((stamp.dev, stamp.ino))
        seen = self._stamps.get(i) if i is not None else None
        # The whole stamp, ctime included: these bytes were read before the header was, so a
        # rewrite in between that kept the size and mtime (a copy with its times preserved)
        # must not pass.
        if seen is None or seen != stamp:
            return None
        return self._tables.get(i)  # type: ignore[arg-type]

    def stop(self) -> None:
        """Stop the workers now: only the units they sent are known."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()


def start(path: Path, algo: str, threads: int | None) -> EarlyDigests | None:
    """Workers hashing the shards of the artifact at `path` ahead, or None where that cannot
    pay (one thread, a small artifact, sha256 on few cores: `_pays`) or cannot be done (no
    fork; torch loaded; EXL3TOOL_NO_FORK or EXL3TOOL_NO_EARLY set)."""
    workers = max(1, threads or engine.default_threads())
    if workers < 2 or os.environ.get("EXL3TOOL_NO_EARLY") or os.environ.get("EXL3TOOL_NO_FORK"):
        return None
    if not _pays(algo, engine.default_threads()):
        return None
    if not forkpool.available() or engine.fork_unsafe():
        return None
    shards = _shards(path)
    if not shards or sum(size for _, size in shards) < EARLY_MIN_BYTES:
        return None
    if sum(-(-size // CHUNK) for _, size in shards) > MAX_UNITS:
        return None
    try:
        return EarlyDigests(shards, engine.check_algo(algo), workers)
    except OSError:  # no process or pipe left: the engine alone
        return None


def _pays(algo: str, cores: int) -> bool:
    """Whether hashing `algo` ahead on a machine of `cores` usable cores can gain more than it
    costs (the cores, not `--threads`: the workers' costs weigh where cores are few)."""
    return algo in AHEAD_ALGOS or (algo in AHEAD_MANY_ALGOS and cores >= MANY_CORES)


def _shards(path: Path) -> list[tuple[Path, int]]:
    """(path, size) of each regular `*.safetensors` file of `path` (a file or a folder, not
    recursed, as the checkpoint loader lists them) that is not sparse (a stray file truncated
    to petabytes would be all units and no tensors); none if unreadable or more than
    EARLY_MAX_FILES."""
    try:
        paths = [path / n for n in list_safetensors(path)] if path.is_dir() else [path]
        if len(paths) > EARLY_MAX_FILES:
            return []
        out: list[tuple[Path, int]] = []
        for p in paths:
            st = os.stat(p)  # a Hugging Face snapshot's link: its blob
            # st_blocks 0: a file system that does not count them (not known to be sparse)
            sparse = 0 < st.st_blocks * 512 * SPARSE < st.st_size
            if stat.S_ISREG(st.st_mode) and not sparse:
                out.append((p, st.st_size))
    except (OSError, ValueError):
        return []
    return out


def _starter(
    shards: list[tuple[Path, int]], algo: str, workers: int
) -> Callable[[Any], Callable[[tuple[int, int]], tuple[int, FileStamp | None, list, list]]]:
    def start(_progress: Any) -> Callable[[tuple[int, int]], Any]:  # in each worker
        cache: dict[int, _Spans] = {}  # the last shard's offsets only
        cost = {way: [0.0, 0] for way in READS}  # CPU seconds and bytes, by way of reading

        def work(unit: tuple[int, int]) -> tuple[int, FileStamp | None, list, list]:
            i, lo = unit
            path = shards[i][0]
            try:
                if i not in cache:
                    cache.clear()
                    cache[i] = _spans(path)
                starts, spans = cache[i]
                mine = spans[bisect_left(starts, lo) : bisect_left(starts, lo + CHUNK)]
                if not mine:
                    return i, None, [], []
                way = _faster(cost)
                began, took = time.time_ns(), time.process_time()
                stamp, hexes = engine.hash_spans(path, mine, algo, workers, mapped=way)
                cost[way][0] += time.process_time() - took
                cost[way][1] += sum(e - s for s, e in mine)
            except Exception:  # the engine hashes these, and reports what is wrong
                return i, None, [], []
            if views.changed_lately(stamp, began):  # nothing kept: see views.RACY_NS
                return i, None, [], []
            return i, stamp, [engine.span_key(s, e - s) for s, e in mine], hexes

        return work

    return start


def _faster(cost: dict[bool, list]) -> bool:
    """The way of reading still on trial (under TRIAL_BYTES), else the cheaper per byte."""
    for way, (_, n) in cost.items():
        if n < TRIAL_BYTES:
            return way
    return min(cost, key=lambda way: cost[way][0] / cost[way][1])


def _spans(path: Path) -> _Spans:
    """The sorted file spans of the tensors of one shard that the engine batches (1 byte to
    `engine.batched_max()`, inside the file), found in its header by their `data_offsets`
    alone (twice as fast as `json.loads`, and nothing needs to be proven here: a span the
    header does not mean is a digest the engine never asks for); none if the spans add up to
    more than the file."""
    with PayloadFile(path) as f:  # a regular file, read with pread (InputChanged if it shrank)
        size = f.size
        n = int.from_bytes(f.buffer(0, 8), "little") if size >= 8 else -1
        if not 0 < n <= HEADER_MAX or 8 + n > size:
            return [], []
        raw = f.buffer(8, 8 + n)
    base, room, largest = 8 + n, size - 8 - n, engine.batched_max()
    spans: list[tuple[int, int]] = []
    total = 0
    for b, e in map(_to_ints, _OFFSETS.findall(raw)):
        if 0 <= b < e <= room and e - b <= largest:
            spans.append((base + b, base + e))
            total += e - b
    if total > room:  # overlapping spans: hashing them could cost far more than the file
        return [], []
    spans.sort()
    return [s for s, _ in spans], spans


_OFFSETS = re.compile(rb'"data_offsets"\s*:\s*\[\s*(\d{1,20})\s*,\s*(\d{1,20})\s*\]')


def _to_ints(pair: tuple[bytes, bytes]) -> tuple[int, int]:
    return int(pair[0]), int(pair[1])
