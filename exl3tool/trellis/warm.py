"""Compile the fused W_eff kernels a run will need before it needs them (issue 16).

A fresh machine compiles one Triton binary per (K, codebook, form) on first use, about a second
each, and Triton keeps them in its on-disk cache. The binaries do not depend on the matrix size:
only on K, the codebook and the divisibility of the integer arguments (a whole number of 256-wide
tile columns, as every expert projection has). So tiny zero matrices compile what a GLM-sized
layer uses. `start_warmup` does it in a child process, whose GIL is its own: a compile holds its
interpreter's GIL for seconds, which would stall the caller's reading and hashing threads.

    python -m exl3tool.trellis.warm --device cuda:0 --k 3,4,5
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterable

import torch

# 16 x 16 tiles: 256 columns, 16 tile columns (Triton specializes integers divisible by 16)
_TILES = 16


def warm_weight_kernels(
    device: torch.device | str, ks: Iterable[int], codebook: str = "mcg"
) -> None:
    """Compile (and run once, on zeros) the W_eff kernel of each K on `device`, and the check
    that picks its form."""
    from exl3tool.trellis.weight import effective_weights

    dev = torch.device(device)
    for k in sorted(set(ks)):
        t = torch.zeros((_TILES, _TILES, 16 * k), dtype=torch.int16, device=dev)
        s = torch.ones(_TILES * 16, dtype=torch.float16, device=dev)
        effective_weights([(t, s, s)], codebook, device=dev)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def start_warmup(device: torch.device, ks: Iterable[int]) -> subprocess.Popen | None:
    """A child process compiling the kernels of `ks` into Triton's cache (CUDA only), or None.
    The caller need not wait: a kernel it compiles first is compiled twice, never wrongly."""
    if device.type != "cuda" or os.environ.get("EXL3TOOL_NO_WARMUP"):
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    cmd = [sys.executable, "-m", "exl3tool.trellis.warm", "--device", f"cuda:{index}"]
    cmd += ["--k", ",".join(str(k) for k in sorted(set(ks)))]
    try:
        return subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
    except OSError:
        return None


def stop_warmup(proc: subprocess.Popen | None) -> None:
    """End a warm-up child that is still running (its partial cache entries are atomic)."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--k", default="2,3,4,5")
    a = ap.parse_args(argv)
    warm_weight_kernels(a.device, [int(x) for x in a.k.split(",") if x])
    return 0


if __name__ == "__main__":
    sys.exit(main())
