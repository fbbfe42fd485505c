"""io/heap.py: a worker's malloc keeps freed memory where the C library has `mallopt`."""

from __future__ import annotations

import platform
import subprocess
import sys


def test_both_thresholds_take_on_glibc_and_nothing_breaks_elsewhere() -> None:
    code = (
        "from exl3tool.io.heap import freed_memory_keeper\n"
        "keep = freed_memory_keeper()\n"
        "print(keep is not None and keep())\n"
        "blocks = [bytearray(3 << 20) for _ in range(8)]\n"  # still allocates, frees, reuses
        "del blocks\n"
        "print(len(bytearray(40 << 20)))\n"  # past its own-mapping size
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    glibc = sys.platform == "linux" and platform.libc_ver()[0] == "glibc"
    assert out == [str(glibc), str(40 << 20)]
