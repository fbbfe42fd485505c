"""Tensor bytes from files straight into torch tensors, on threads, ahead of their use (issue 16).

A verify-swap layer reads ~12 GB at the GLM geometry (the base, the staged stages, the cold
pass's base and stages). Each tensor is read once, with `pread` (`io.views.PayloadFile`: a
shrinking file is `InputChanged`, never SIGBUS), into an uninitialised tensor (page-locked when
the target is CUDA), by a pool of threads (`pread` releases the GIL); groups are read a bounded
number ahead of the consumer, so reading overlaps the GPU work on the previous group, and host
memory is bounded by `ahead` groups. (What it replaced, a zeroed bytearray per tensor copied into
numpy, into a tensor and from pageable memory to the GPU, one tensor after another, is where the
sampled GLM layer in benchmarks/RESULTS.md, "seventh landing", spent most of its time.)
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from exl3tool.identity.engine import default_threads
from exl3tool.io.safetensors import SafetensorsFile, TensorInfo
from exl3tool.io.views import PayloadFile, TensorReader
from exl3tool.rules.errors import InputError

__all__ = ["TORCH_DTYPES", "TensorRead", "read_all", "read_threads", "stream_groups", "tensor_read"]


# safetensors dtype names (docs/formats/exl3.md §2) of the tensors the runtime reads
TORCH_DTYPES = {
    "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "I16": torch.int16,
    "I32": torch.int32, "U8": torch.uint8, "I8": torch.int8,
}  # fmt: skip


@dataclass(frozen=True)
class TensorRead:
    """Bytes [offset, offset + nbytes) of an open file, as a tensor of `dtype` and `shape`."""

    file: PayloadFile
    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]


def tensor_read(rd: TensorReader, st: SafetensorsFile, info: TensorInfo) -> TensorRead:
    """The read of one tensor of shard `st` through `rd`'s open file."""
    dtype = TORCH_DTYPES.get(info.dtype)
    if dtype is None:
        raise InputError(f"{st.path}: tensor dtype {info.dtype} is not one the runtime reads")
    return TensorRead(
        rd.file(st), st.data_start + info.begin, info.end - info.begin, dtype, tuple(info.shape)
    )


def read_threads(world_size: int = 1) -> int:
    """Reader threads for one rank: the cores this process may use, shared by the ranks, 2 to 8."""
    return max(2, min(8, default_threads() // max(1, world_size)))


def _read(r: TensorRead, pin: bool) -> torch.Tensor:
    if math.prod(r.shape) * r.dtype.itemsize != r.nbytes:
        raise InputError(f"{r.file.path}: {r.nbytes} bytes are not a {r.dtype} {list(r.shape)}")
    host = torch.empty(r.nbytes, dtype=torch.uint8, pin_memory=pin)
    if r.nbytes:
        r.file.read_into(memoryview(host.numpy()), r.offset)
    return host.view(r.dtype).reshape(r.shape)


def stream_groups(
    groups: Iterable[Sequence[TensorRead]],
    device: torch.device,
    *,
    threads: int | None = None,
    ahead: int = 3,
) -> Iterator[list[torch.Tensor]]:
    """Each group's tensors on `device`, in order; up to `ahead` groups are read in advance.

    On CUDA the bytes land in pinned host memory and move with asynchronous copies on the
    current stream (the caching host allocator keeps a block until its copy is done)."""
    pin = device.type == "cuda"
    pool = ThreadPoolExecutor(max_workers=threads or read_threads(), thread_name_prefix="exl3read")
    pending: deque[list[Future[torch.Tensor]]] = deque()
    it = iter(groups)
    try:
        while True:
            while len(pending) < max(1, ahead):
                group = next(it, None)
                if group is None:
                    break
                pending.append([pool.submit(_read, r, pin) for r in group])
            if not pending:
                return
            hosts = [f.result() for f in pending.popleft()]
            if device.type == "cpu":
                yield hosts
            else:
                yield [h.to(device, non_blocking=pin) for h in hosts]
    finally:
        for group in pending:
            for f in group:
                f.cancel()
        pool.shutdown(wait=True, cancel_futures=True)


def read_all(
    reads: Sequence[TensorRead], device: torch.device, *, threads: int | None = None
) -> list[torch.Tensor]:
    """Every read's tensor on `device`, in order: chunks of one read per thread, two chunks in
    flight (host memory: twice `threads` tensors)."""
    n = threads or read_threads()
    chunks = [reads[i : i + n] for i in range(0, len(reads), n)]
    out: list[torch.Tensor] = []
    for got in stream_groups(chunks, device, threads=n, ahead=2):
        out.extend(got)
    return out
