"""Payload reads of the checks: a random-access reader, deferred marker reads and a deferred
NaN/Inf scan, each one packed gather per shard (few preads, never the whole shard)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from exl3tool.formats.checkpoint import TensorRef
from exl3tool.io.safetensors import SafetensorsFile
from exl3tool.io.views import TensorReader
from exl3tool.rules.registry import Findings


class RandomAccessReader(TensorReader):
    """A TensorReader whose files are advised POSIX_FADV_RANDOM: the checks read 4-byte markers
    and small vectors scattered between large trellis payloads, and the kernel's default
    readahead would otherwise pull in megabytes of trellis around every read. Marker reads
    are deferred into `markers` and done in one gather per shard."""

    def __init__(self) -> None:
        super().__init__()
        self.markers = MarkerCheck()

    def _map(self, st: SafetensorsFile) -> Any:
        fresh = st.path not in self._maps
        m = super()._map(st)
        if fresh:
            m.advise_random()
        return m


def read_scalar_i32(reader: TensorReader, ref: TensorRef) -> int | None:
    """The int32 value of a 4-byte scalar tensor (read with pread), or None."""
    if ref.info.nbytes != 4:
        return None
    try:
        return int.from_bytes(reader.payload(ref.shard, ref.info), "little", signed=True)
    except (ValueError, OSError):
        return None


def _gather(reader: TensorReader, items: list[tuple[TensorRef, Any]]) -> tuple[np.ndarray, Any]:
    """The payloads of one shard's `items`, packed (`TensorReader.gather`: few preads, each
    position keeping its alignment mod 16); a shard that shrank since is InputChanged."""
    spans = [(r.info.begin, r.info.end) for r, _ in items]
    return reader.gather(items[0][0].shard, spans)


def _by_shard(items: list[tuple[TensorRef, Any]]) -> dict[Path, list[tuple[TensorRef, Any]]]:
    out: dict[Path, list[tuple[TensorRef, Any]]] = {}
    for ref, extra in items:
        out.setdefault(ref.shard.path, []).append((ref, extra))
    return out


class MarkerCheck:
    """Deferred reads of int32 scalar markers, one vectorised gather per shard (a GLM-5.2 R7
    checkpoint has 57,600 of them; a Python read each costs more than the page fault)."""

    def __init__(self) -> None:
        self._items: list[tuple[TensorRef, int]] = []

    def add(self, ref: TensorRef, expected: int) -> None:
        if ref.info.nbytes == 4 and ref.info.end + ref.shard.data_start <= ref.shard.file_size:
            self._items.append((ref, expected))

    def run(self, reader: TensorReader, report: Callable[[TensorRef, int, int], None]) -> None:
        """Call report(ref, value, expected) for every marker whose value differs."""
        for items in _by_shard(self._items).values():
            data, begins = _gather(reader, items)
            want = np.fromiter((e for _, e in items), dtype=np.int64, count=len(items))
            got = data[begins[:, None] + np.arange(4)].view("<i4").ravel().astype(np.int64)
            for i in np.flatnonzero(got != want):
                report(items[i][0], int(got[i]), int(want[i]))


# word view and exponent mask per float dtype; all exponent bits set = NaN or Inf
_EXPONENT_BITS = {"F16": ("<u2", 0x7C00), "F32": ("<u4", 0x7F800000)}


class FiniteCheck:
    """Deferred NaN/Inf scan of F16/F32 vectors: per shard, one gather over every vector's
    elements through a zero-copy view, testing the exponent bits (all ones = NaN/Inf)."""

    def __init__(self) -> None:
        self._items: list[tuple[TensorRef, None]] = []

    def add(self, ref: TensorRef) -> None:
        end_ok = ref.info.end + ref.shard.data_start <= ref.shard.file_size
        if ref.info.dtype in _EXPONENT_BITS and ref.info.nbytes and end_ok:
            self._items.append((ref, None))

    def run(self, reader: TensorReader, report: Callable[[TensorRef], None]) -> None:
        for items in _by_shard(self._items).values():
            data, pos = _gather(reader, items)
            for dtype, (view, mask) in _EXPONENT_BITS.items():
                sel = [
                    (r, int(p))
                    for (r, _), p in zip(items, pos, strict=True)
                    if r.info.dtype == dtype
                ]
                if sel:
                    self._scan(data, sel, view, mask, report)

    @staticmethod
    def _scan(
        data: np.ndarray,
        refs: list[tuple[TensorRef, int]],
        view: str,
        mask: int,
        report: Callable[[TensorRef], None],
    ) -> None:
        """`refs`: (tensor, position of its payload in `data`)."""
        size = np.dtype(view).itemsize
        aligned = [(r, p) for r, p in refs if p % size == 0]
        for r, p in refs:  # an odd offset cannot be viewed as a word array: check it alone
            if p % size:
                words = data[p : p + r.info.nbytes - r.info.nbytes % size].copy().view(view)
                if ((words & mask) == mask).any():
                    report(r)
        if not aligned:
            return
        words = data[: data.size - data.size % size].view(view)
        if not ((words & mask) == mask).any():
            return  # the usual case: no NaN/Inf word anywhere in the packed reads, not even in gaps
        starts = np.fromiter((p // size for _, p in aligned), np.int64, len(aligned))
        # words of each payload (its numel may disagree with its bytes: the header checks say so)
        counts = np.fromiter((r.info.nbytes // size for r, _ in aligned), np.int64, len(aligned))
        ends = np.cumsum(counts)
        index = np.repeat(starts - (ends - counts), counts) + np.arange(ends[-1])
        bad = (words[index] & mask) == mask
        if bad.any():
            for i in np.unique(np.searchsorted(ends, np.flatnonzero(bad), side="right")):
                report(aligned[i][0])


@dataclass(frozen=True)
class Scan:
    """Where one artifact's checks report, and how they read payload bytes (deferred reads)."""

    findings: Findings
    reader: TensorReader
    finite: FiniteCheck
