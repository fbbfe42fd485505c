"""Keep freed memory in a short-lived forked worker (glibc's malloc).

By default glibc gives large freed blocks back to the system (a block of its own mapping is
unmapped; a heap top past the trim threshold is trimmed), so a worker that allocates and frees
a few MB per shard, as validate's R7 read-ahead does (a packed read, numpy temporaries), can
page-fault its buffers afresh for every shard. Raising both thresholds keeps freed blocks for
reuse: in a forked child on the 2-core VM the read-ahead's packed reads and scans of a GLM-5.2
checkpoint took 0.22 s instead of 0.5-0.8 s, and `validate` ran 12 % faster paired. The
effect depends on the machine (on one 16-core host pinned to 2 cores it cost 5-6 %):
benchmarks/RESULTS.md, twenty-fourth landing.
The worker exits when done, so nothing is held for long. A C library without `mallopt` (musl,
macOS) is left as it is.
"""

from __future__ import annotations

import contextlib

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
KEEP = 512 << 20  # freed bytes at the top of the heap kept before trimming
OWN_MAPPING = 32 << 20  # blocks from this size get a mapping of their own (glibc's largest)


def keep_freed_memory() -> bool:
    """Ask malloc to keep freed memory for reuse; whether it took both settings."""
    with contextlib.suppress(OSError, AttributeError, TypeError, ValueError):
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
        return bool(mallopt(M_MMAP_THRESHOLD, OWN_MAPPING)) and bool(
            mallopt(M_TRIM_THRESHOLD, KEEP)
        )
    return False
