"""Progress of verify-swap over layers and phases (rank 0 only).

On a terminal: one bar over layers × phases (`io.progress`). Otherwise (CI logs): one line per
layer on stderr with its time and that of each phase, so a long run shows it is alive, how fast it
goes and where a layer's time went.
"""

from __future__ import annotations

import sys
import time
from contextlib import ExitStack
from types import TracebackType

from exl3tool.io import progress as io_progress


class LayerProgress:
    def __init__(self, layers: int, phases: tuple[str, ...], *, enabled: bool) -> None:
        self.layers, self.phases, self.enabled = layers, phases, enabled
        self.bar: io_progress.Progress = io_progress.NO_PROGRESS
        self.tty = enabled and io_progress.enabled()
        self._stack = ExitStack()
        self._done = 0
        self._in_layer = 0
        self._t0 = time.perf_counter()
        self._marks: list[tuple[str, float]] = []  # (phase, start) of the current layer

    def __enter__(self) -> LayerProgress:
        if self.tty:
            self.bar = self._stack.enter_context(
                io_progress.progress_bar(
                    self.layers * len(self.phases), "verify-swap", unit="layer phases"
                )
            )
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stack.close()

    def phase(self, layer: int, name: str) -> None:
        """Layer `layer` enters phase `name` (advances the bar past the previous phase)."""
        if self._in_layer:
            self.bar.advance(1)
        self._in_layer += 1
        self._marks.append((name, time.perf_counter()))

    def layer_done(self, layer: int, seconds: float) -> None:
        self.bar.advance(max(0, len(self.phases) - self._in_layer + 1))
        self._in_layer = 0
        self._done += 1
        now = time.perf_counter()
        ends = [t for _, t in self._marks[1:]] + [now] if self._marks else []
        split = ", ".join(f"{n} {e - t:.2f}" for (n, t), e in zip(self._marks, ends, strict=True))
        self._marks = []
        if self.enabled and not self.tty:
            sys.stderr.write(
                f"verify-swap: layer {layer} done ({self._done}/{self.layers}) in "
                f"{seconds:.2f} s ({split}), {now - self._t0:.1f} s so far\n"
            )
            sys.stderr.flush()
