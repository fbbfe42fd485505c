"""Deterministic safetensors writer that streams payloads (no whole-file buffering)."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from exl3tool.io.dtypes import FROM_NUMPY, nbytes


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = nbytes(self.dtype, self.shape)
        if n is None:
            raise ValueError(f"{self.name}: {self.dtype}{list(self.shape)} is not whole bytes")
        return n


def build_header(specs: Iterable[TensorSpec], metadata: Mapping[str, str] | None = None) -> bytes:
    """Header bytes (length prefix included), payloads laid out in the given order.

    The JSON is compact with keys in the given order; it is padded with spaces to a multiple
    of 8 so the data section is aligned.
    """
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    pos = 0
    for s in specs:
        n = s.nbytes
        header[s.name] = {"dtype": s.dtype, "shape": list(s.shape), "data_offsets": [pos, pos + n]}
        pos += n
    body = json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode()
    body += b" " * (-(8 + len(body)) % 8)
    return struct.pack("<Q", len(body)) + body


class SafetensorsStreamWriter:
    """Write a header, then each tensor's bytes in header order, checking lengths as it goes."""

    def __init__(
        self, fh: BinaryIO, specs: list[TensorSpec], metadata: Mapping[str, str] | None = None
    ) -> None:
        self._fh = fh
        self._specs = specs
        self._next = 0
        self._left = specs[0].nbytes if specs else 0
        fh.write(build_header(specs, metadata))
        self._skip_empty()

    def _skip_empty(self) -> None:
        while self._next < len(self._specs) and self._left == 0:
            self._next += 1
            if self._next < len(self._specs):
                self._left = self._specs[self._next].nbytes

    def write(self, data: bytes | memoryview) -> None:
        """Append payload bytes; chunks may split or span tensors only in order."""
        mv = memoryview(data).cast("B")
        while len(mv):
            if self._next >= len(self._specs):
                raise ValueError("more payload bytes than the header declares")
            take = min(self._left, len(mv))
            self._fh.write(mv[:take])
            mv = mv[take:]
            self._left -= take
            self._skip_empty()

    def close(self) -> None:
        self._skip_empty()
        if self._next < len(self._specs):
            raise ValueError(f"payload of {self._specs[self._next].name} is incomplete")


def spec_of(name: str, array: np.ndarray, dtype: str | None = None) -> TensorSpec:
    return TensorSpec(name, dtype or FROM_NUMPY[array.dtype.name], tuple(array.shape))


def write_arrays(
    fh: BinaryIO,
    tensors: Mapping[str, np.ndarray],
    metadata: Mapping[str, str] | None = None,
    dtypes: Mapping[str, str] | None = None,
) -> None:
    """Write numpy arrays (little-endian, C order) as one safetensors file, in mapping order."""
    dtypes = dtypes or {}
    specs = [spec_of(k, v, dtypes.get(k)) for k, v in tensors.items()]
    w = SafetensorsStreamWriter(fh, specs, metadata)
    for v in tensors.values():
        a = np.ascontiguousarray(v)
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        w.write(memoryview(a.reshape(-1).view(np.uint8)))
    w.close()
