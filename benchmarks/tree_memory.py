"""Peak memory of a process and every process it forks, sampled (Linux /proc).

wait4's ru_maxrss is the peak of the largest single process: a command that hashes with forked
workers would look as small as one of them. `PeakPss(pid)` samples, every `interval` seconds
while it runs, the sum of the proportional set size (Pss: each shared page divided among the
processes that map it, so pages a fork shares are counted once) of `pid` and its descendants.
A sample can miss a peak shorter than the interval.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it (from each process's parent in /proc/N/stat)."""
    parent: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, todo = [pid], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        tree += kids
        todo += kids
    return tree


def pss(pid: int) -> int:
    """Bytes of Pss of one process (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


class PeakPss:
    """Samples the tree's Pss in a thread from `start()` to `stop()`; `peak` is the largest."""

    def __init__(self, pid: int, interval: float = 0.02) -> None:
        self.pid, self.interval, self.peak = pid, interval, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, sum(map(pss, descendants(self.pid))))
            self._done.wait(self.interval)

    def start(self) -> PeakPss:
        if Path("/proc/self/smaps_rollup").exists():
            self._thread.start()
        return self

    def stop(self) -> int:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()
        return self.peak
