"""The slicer's read plan: which source bytes are read in which block, and what each consumer
(output stream or source hasher) takes from each block. Pure: headers only, no I/O.

The source is read once, in source order, in blocks of at most `size` bytes of one file:
consecutive tensors share a block, a larger tensor is cut into blocks of whole rows. Every
consumer then takes its pieces from the same block buffer (issue 17: at TP N each row block was
read N times, once per rank stream). A stream holding several slices of one tensor that spans
several blocks (the rank-sliced layout writes them one after the other) reads those slices on
its own (`OWN`), as does every consumer of a tensor whose rows do not fit a block.

`iter_blocks` yields each block as soon as no later tensor can add to it, so the reader can
start on the first blocks while the rest are planned.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from exl3tool.formats.checkpoint import Checkpoint
from exl3tool.tp.slices import TensorSlice

CONTIG, ROWS, OWN = 0, 1, 2  # Piece.kind


class Piece(NamedTuple):
    """Bytes a consumer takes from a block, in its write order.

    CONTIG: `run` bytes at `offset` of the block. ROWS: `count` runs of `run` bytes, `stride`
    apart, the first at `offset` (gathered). OWN: the whole slice or tensor, read by the
    consumer itself (`offset` is its payload start in the file). `item`: a stream's index in
    its flat slice list, a hasher's index in the source order. `first` / `last`: the piece
    opens / completes that slice or tensor."""

    kind: int
    offset: int
    run: int
    count: int
    stride: int
    item: int
    first: bool
    last: bool


@dataclass
class Block:
    """Bytes [start, end) of the shard `file` (empty: nothing to read), each consumer's pieces
    of it, and the source payload bytes finished with it (progress)."""

    file: str
    start: int
    end: int
    pieces: list[list[Piece]]
    done_bytes: int = 0

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass
class _Planner:
    """Blocks in source order; only the last one can still grow or take pieces, the ones
    before it are `ready` (final)."""

    size: int
    consumers: int
    ready: list[Block] = field(default_factory=list)
    last: Block | None = None

    def _new(self, file: str, start: int, end: int) -> Block:
        if self.last is not None:
            self.ready.append(self.last)
        self.last = Block(file, start, end, [[] for _ in range(self.consumers)])
        return self.last

    def current(self, file: str, start: int) -> Block:
        """The block to attach pieces that read nothing (a new empty one if there is none)."""
        return self.last if self.last is not None else self._new(file, start, start)

    def place(self, file: str, start: int, nbytes: int, *, alone: bool) -> Block:
        """The block that reads [start, start + nbytes) of `file`: the current one extended
        when the bytes follow it and fit, else a new one (always new with `alone`)."""
        cur = self.last
        if cur is not None and cur.nbytes == 0:  # only pieces that read nothing so far
            cur.file, cur.start, cur.end = file, start, start + nbytes
            return cur
        if (
            not alone
            and cur is not None
            and cur.file == file
            and cur.end == start
            and cur.nbytes + nbytes <= self.size
        ):
            cur.end += nbytes
            return cur
        return self._new(file, start, start + nbytes)


def _slice_piece(s: TensorSlice, item: int, p0: int, p1: int, off: int) -> Piece | None:
    """The piece of slice `s` within payload bytes [p0, p1) read at block offset `off`
    (p0 and p1 are whole rows of a strided slice), or None."""
    lay = s.layout
    n = lay.run * lay.count
    if n == 0:
        return Piece(CONTIG, off, 0, 0, 0, item, True, True) if p0 == 0 else None
    if lay.count <= 1 or lay.run == lay.stride:
        o = lay.offset
        a, b = max(o, p0), min(o + n, p1)
        if a >= b:
            return None
        return Piece(CONTIG, off + a - p0, b - a, 1, b - a, item, a == o, b == o + n)
    stride = lay.stride
    r0, r1 = p0 // stride, min(lay.count, -(-p1 // stride))
    if r0 >= r1:
        return None
    at = off + r0 * stride - p0 + lay.offset
    return Piece(ROWS, at, lay.run, r1 - r0, stride, item, r0 == 0, r1 == lay.count)


def iter_blocks(
    ckpt: Checkpoint,
    order: Sequence[str],
    flat: Sequence[Sequence[tuple[int, TensorSlice]]],
    hashed: set[str],
    hashers: int,
    size: int,
) -> Iterator[Block]:
    """Blocks of at most `size` bytes over the source tensors in `order`, each yielded once
    final.

    `flat[w]`: stream w's (source index, slice) in write order (source order). Consumers are
    the streams, then `hashers` source hashers; a tensor of `hashed` goes to hasher k % hashers
    for the k-th such tensor. Tensors no consumer needs are not read.
    """
    nst = len(flat)
    plan = _Planner(size, nst + hashers)
    by_src: list[dict[int, list[int]]] = []
    for items in flat:
        d: dict[int, list[int]] = {}
        for j, (i, _s) in enumerate(items):
            d.setdefault(i, []).append(j)
        by_src.append(d)
    k = 0
    for i, name in enumerate(order):
        ref = ckpt.tensors[name]
        n = ref.info.nbytes
        base = ref.shard.data_start + ref.info.begin
        users = [(w, d[i]) for w, d in enumerate(by_src) if i in d]
        h = None
        if hashers and name in hashed:
            h, k = nst + k % hashers, k + 1
        if not users and h is None:
            continue
        whole = n <= size
        shared = [(w, js) for w, js in users if whole or len(js) == 1]
        own = [(w, js) for w, js in users if not (whole or len(js) == 1)]
        own_hash = False
        unit = 1
        if not whole:
            strides = {
                lay.stride
                for w, js in shared
                for j in js
                if not (lay := flat[w][j][1].layout).contiguous and lay.nbytes
            }
            unit = math.lcm(*strides) if strides else 1
            if unit > size:  # rows that do not fit a block: every consumer reads its own
                own, shared, own_hash = own + shared, [], h is not None
        if n == 0 or not (shared or (h is not None and not own_hash)):
            spans: list[tuple[int, int]] = [(0, 0)]
            blocks = [plan.current(ref.file, base)]
        elif whole:
            spans = [(0, n)]
            blocks = [plan.place(ref.file, base, n, alone=False)]
        else:
            step = size // unit * unit
            spans = [(p, min(p + step, n)) for p in range(0, n, step)]
            blocks = [plan.place(ref.file, base + a, b - a, alone=True) for a, b in spans]
        first = blocks[0]
        for w, js in own:
            first.pieces[w] += [Piece(OWN, base, 0, 0, 0, j, True, True) for j in js]
        if own_hash:
            first.pieces[h] += [Piece(OWN, base, n, 0, 0, i, True, True)]  # type: ignore[index]
        for (p0, p1), blk in zip(spans, blocks, strict=True):
            off = base + p0 - blk.start
            for w, js in shared:
                mine = blk.pieces[w]
                for j in js:
                    piece = _slice_piece(flat[w][j][1], j, p0, p1, off)
                    if piece is not None:
                        mine.append(piece)
            if h is not None and not own_hash:
                blk.pieces[h].append(Piece(CONTIG, off, p1 - p0, 1, p1 - p0, i, p0 == 0, p1 == n))
        blocks[-1].done_bytes += n
        if plan.ready:
            yield from plan.ready
            plan.ready.clear()
    if plan.last is not None:
        yield plan.last
