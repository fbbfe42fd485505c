"""Compile the W_eff kernel's variants on a thread at a rank's start (CUDA only).

A fresh machine compiles one Triton variant of the fused W_eff kernel per trellis rate K, about
a second each, and most of a compile runs outside the GIL. Compiling the rates of the base and the
adapters while the stagings copy and the first layer is read keeps those seconds off the first
layer's decode. A variant the decode needs while it is being compiled here is waited for, not
compiled twice (`trellis._triton_group.warm_weights`).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import torch

from exl3tool.formats.checkpoint import Checkpoint, TensorRef, load_checkpoint
from exl3tool.rules.registry import Findings
from exl3tool.trellis.bitstream import rate_from_words
from exl3tool.trellis.errors import TrellisError


def trellis_rates(refs: Iterable[TensorRef]) -> list[int]:
    """The integer K of every int16 trellis among refs (`…trellis`, `…trellis_<label>`), most
    frequent first; shapes that are no valid trellis are left to the checks."""
    seen: Counter[int] = Counter()
    for ref in refs:
        info = ref.info
        if info.dtype != "I16" or len(info.shape) != 3:
            continue
        if not info.name.rsplit(".", 1)[-1].startswith("trellis"):
            continue
        try:
            rate = rate_from_words(info.shape[2])
        except (TrellisError, TypeError):
            continue
        if not rate.half:  # half-integer K is MUL1 only; the runtime decodes MCG
            seen[rate.bits] += 1
    return [k for k, _ in seen.most_common()]


class KernelWarmup(threading.Thread):
    """Warms the base's rates and those only the adapters use, compiled together; `stop()` lets
    a warm-up in progress finish (a compile cannot be interrupted) and waits for it."""

    def __init__(self, device: torch.device, base: Checkpoint, adapters: list[Path]) -> None:
        super().__init__(name="exl3tool-kernel-warmup", daemon=True)
        self.device = device
        self.base = base
        self.adapters = adapters
        self.warmed: list[int] = []
        self._stop_at = threading.Event()

    def run(self) -> None:
        from exl3tool.trellis._triton_group import warm_weights

        ks = trellis_rates(self.base.tensors.values())
        for adapter in self.adapters:
            try:
                ckpt = load_checkpoint(adapter, Findings(), need_config=False)
            except Exception:  # an unreadable adapter is staging's finding; warming is optional
                break
            ks += [k for k in trellis_rates(ckpt.tensors.values()) if k not in ks]
        if ks and not self._stop_at.is_set():
            self.warmed = warm_weights(self.device, ks)

    def stop(self) -> None:
        self._stop_at.set()
        self.join()


def start_warmup(
    device: torch.device, base: Checkpoint, adapters: list[Path]
) -> KernelWarmup | None:
    """A started `KernelWarmup` where the fused kernel runs (CUDA with Triton), else None."""
    from exl3tool.trellis import _triton

    if device.type != "cuda" or not _triton.available(device):
        return None
    warm = KernelWarmup(device, base, adapters)
    warm.start()
    return warm
