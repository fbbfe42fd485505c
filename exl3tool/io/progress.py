"""A progress bar for long operations (hashing, slicing, staging) that costs nothing when off.

    with progress_bar(total_bytes, "hashing") as bar:
        ...  # any thread may call
        bar.advance(len(chunk))

The total may be a function, called only when a bar is drawn (an identity's planned bytes
cost ~0.1 s on 20,000 tensors: nothing to pay for when no bar is shown).

The bar is drawn on stderr only when stderr is a terminal and nobody asked for silence:
`set_quiet(True)` (commands call it for `--quiet`), `EXL3TOOL_NO_PROGRESS` set, or `TERM=dumb`.
`NO_COLOR` keeps the bar but drops colour (rich honours it). Otherwise the yielded object is a
no-op whose `advance` does nothing, and rich is never imported.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

_quiet = False


class Progress(Protocol):
    def advance(self, n: int = 1) -> None: ...


class _NoProgress:
    __slots__ = ()

    def advance(self, n: int = 1) -> None:
        return None


NO_PROGRESS: Progress = _NoProgress()


class _RichProgress:
    """Thread-safe `advance` over one rich task (workers share it)."""

    def __init__(self, progress: Any, task: Any) -> None:
        self._progress = progress
        self._task = task
        self._lock = threading.Lock()

    def advance(self, n: int = 1) -> None:
        with self._lock:
            self._progress.advance(self._task, n)


def set_quiet(quiet: bool) -> None:
    """Silence (or re-enable) progress bars for this process; `--quiet` calls it."""
    global _quiet
    _quiet = quiet


def enabled() -> bool:
    """Whether a bar would be drawn now."""
    if _quiet or os.environ.get("EXL3TOOL_NO_PROGRESS") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False


@contextmanager
def progress_bar(
    total: int | Callable[[], int], description: str, unit: str = "bytes"
) -> Iterator[Progress]:
    """Yield an object with `.advance(n)`; a bar with rate only when `enabled()` (only then
    is a callable `total` called)."""
    if not enabled():
        yield NO_PROGRESS
        return
    if callable(total):
        total = total()
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        TaskProgressColumn,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )
    from rich.progress import Progress as RichProgress

    if unit == "bytes":
        columns: tuple[Any, ...] = (DownloadColumn(), TransferSpeedColumn())
    else:
        columns = (MofNCompleteColumn(), TextColumn(unit))
    progress = RichProgress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        *columns,
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    with progress:
        task = progress.add_task(description, total=max(total, 0))
        yield _RichProgress(progress, task)
