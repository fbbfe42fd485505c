"""Keep freed memory in a short-lived forked worker (glibc's malloc).

By default glibc gives large freed blocks back to the system (a block of its own mapping is
unmapped; a heap top past the trim threshold is trimmed), so a worker that allocates and frees
a few MB per shard, as validate's R7 read-ahead does (a packed read, numpy temporaries), can
page-fault its buffers afresh for every shard. Raising both thresholds keeps freed blocks for
reuse: in a forked child on the 2-core VM the read-ahead's packed reads and scans of a GLM-5.2
checkpoint took 0.22 s instead of 0.5-0.8 s. Whether the whole command gains depends on the
machine (benchmarks/RESULTS.md, twenty-fourth landing): it is asked for by the caller that
measured it (`Forked(..., keep_freed=True)`). The worker exits when done, so nothing is held
for long. A C library without `mallopt` (musl, macOS) is left as it is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
KEEP = 512 << 20  # freed bytes at the top of the heap kept before trimming
OWN_MAPPING = 32 << 20  # blocks from this size get a mapping of their own (glibc's largest)


def freed_memory_keeper() -> Callable[[], bool] | None:
    """A call that asks malloc to keep freed memory for reuse (True when both settings took),
    looked up now, before a fork, so that the child spends no time on it; None without
    `mallopt`."""
    with contextlib.suppress(OSError, AttributeError, TypeError, ValueError):
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt

        def keep() -> bool:
            return bool(mallopt(M_MMAP_THRESHOLD, OWN_MAPPING)) and bool(
                mallopt(M_TRIM_THRESHOLD, KEEP)
            )

        return keep
    return None
