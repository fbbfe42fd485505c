"""How many hashing workers `identity` starts by default: one per core, or one fewer where
the artifact is mostly small tensors on many cores.

The parent process does serial work per tensor (plans, the digests it takes, the fold into
layers: ~10 us each on a 16-core host) while the workers hash. Where tensors are small, that
work and not the hashing is the run, and a worker on every core slows it down; where they are
large, the hashing is the run and needs every core. 16-core Intel host, 16 GB
(`benchmarks/identity_threads_sweep.py`, medians of 7): 200 KB tensors 1.199 s with 16
workers, 1.052 s with 15; the GLM-5.2 mix 0.619 s with 16, 0.660 s with 15. The share is
estimated from the shards' header lengths (the first 8 bytes of each file, ~130 header bytes
per tensor) before any header is parsed, as the workers that hash ahead are started first.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

MIN_CORES = 8  # below this every core hashes (the parent's work is a small share of it)
SMALL_TENSORS_PER_GB = 3000  # more tensors per GB than this: the parent's work is the run
HEADER_BYTES_PER_TENSOR = 128
MAX_FILES = 4096  # shards looked at (the estimate needs no more)


def header_share(paths: list[Path]) -> tuple[int, int]:
    """(header bytes, file bytes) over the regular files among `paths` whose 8-byte header
    length can be read; anything else (a FIFO, an unreadable file) is left out."""
    header = total = 0
    for path in paths[:MAX_FILES]:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size < 8:
                continue
            n = int.from_bytes(os.pread(fd, 8, 0), "little")
            if n < st.st_size:
                header, total = header + n, total + st.st_size
        except OSError:
            continue
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)
    return header, total


def hashing_workers(shards: list[Path], cores: int) -> int:
    """`cores`, or `cores - 1` for shards of many small tensors on MIN_CORES or more."""
    if cores < MIN_CORES:
        return cores
    header, total = header_share(shards)
    tensors = header / HEADER_BYTES_PER_TENSOR
    small = total > 0 and tensors * 1e9 > SMALL_TENSORS_PER_GB * total
    return cores - 1 if small else cores
