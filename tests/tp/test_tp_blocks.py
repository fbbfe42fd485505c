"""The read plan (tp/blocks.py): every consumer's pieces of the blocks give exactly the bytes
of its slices (streams) or tensors (hashers), in write order, whatever the block size; each
source byte that anyone needs is read once."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from exl3tool.tp.blocks import CONTIG, OWN, ROWS, Block, iter_blocks
from exl3tool.tp.slices import TensorSlice


def _source(rng: np.random.Generator, n: int, files: int):
    """A fake checkpoint of `n` uint8 tensors packed back to back in `files` files."""
    tensors, raw, order = {}, {f"f{k}": bytearray(b"H" * 8) for k in range(files)}, []
    for i in range(n):
        label = f"f{i * files // n}"
        shape = (*(int(x) for x in rng.integers(1, 7, size=int(rng.integers(1, 4)))), 8)
        data = rng.integers(0, 256, int(np.prod(shape)), np.uint8)
        begin = len(raw[label]) - 8
        raw[label] += data.tobytes()
        name = f"t{i}"
        info = SimpleNamespace(nbytes=data.size, begin=begin, shape=shape)
        tensors[name] = SimpleNamespace(file=label, info=info, shard=SimpleNamespace(data_start=8))
        order.append(name)
    return SimpleNamespace(tensors=tensors), order, {k: bytes(v) for k, v in raw.items()}


def _slices(rng: np.random.Generator, ckpt, order: list[str], tp: int) -> list[list[TensorSlice]]:
    """Per rank, in source order: each tensor replicated, absent or cut on a random axis."""
    ranks: list[list[TensorSlice]] = [[] for _ in range(tp)]
    for name in order:
        shape = ckpt.tensors[name].info.shape
        how = int(rng.integers(0, 3))
        axis = int(rng.integers(0, len(shape)))
        cuts = np.linspace(0, shape[axis], tp + 1).astype(int)
        for r in range(tp):
            if how == 0:
                ranks[r].append(TensorSlice(name, name, None, 0, 0, True, "U8", shape))
            elif how == 1:  # may be empty on some ranks
                a, b = int(cuts[r]), int(cuts[r + 1])
                ranks[r].append(TensorSlice(name, name, axis, a, b, False, "U8", shape))
    return ranks


def _want(s: TensorSlice, raw: dict[str, bytes], ckpt) -> bytes:
    ref = ckpt.tensors[s.source]
    start = ref.shard.data_start + ref.info.begin
    arr = np.frombuffer(raw[ref.file][start : start + ref.info.nbytes], np.uint8)
    arr = arr.reshape(s.source_shape)
    if s.axis is None:
        return arr.tobytes()
    return np.take(arr, range(s.start, s.stop), axis=s.axis).tobytes()


def _replay(blocks: list[Block], c: int, raw: dict[str, bytes], ckpt, items) -> list[bytes]:
    """What consumer `c` writes: per item (slice or tensor), its bytes from the pieces."""
    out: dict[int, bytearray] = {}
    open_: set[int] = set()
    for blk in blocks:
        buf = np.frombuffer(raw[blk.file][blk.start : blk.end], np.uint8)
        for p in blk.pieces[c]:
            if p.kind == OWN:
                assert p.first and p.last and p.item not in out
                out[p.item] = bytearray(items(p.item, p.offset))
                continue
            assert p.first == (p.item not in out) and (p.item in open_ or p.first)
            got = out.setdefault(p.item, bytearray())
            open_.add(p.item)
            if p.kind == CONTIG:
                got += buf[p.offset : p.offset + p.run].tobytes()
            else:
                assert p.kind == ROWS
                rows = np.lib.stride_tricks.as_strided(
                    buf[p.offset :], shape=(p.count, p.run), strides=(p.stride, 1)
                )
                got += rows.tobytes()
            if p.last:
                open_.discard(p.item)
    assert not open_
    assert list(out) == sorted(out)  # write order
    return [bytes(out[k]) for k in sorted(out)]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("size", [16, 64, 300, 4096])
@pytest.mark.parametrize("layout", ["per-rank", "rank-sliced"])
def test_pieces_give_the_slices_and_tensors(seed: int, size: int, layout: str) -> None:
    rng = np.random.default_rng(seed)
    ckpt, order, raw = _source(rng, 12, 2)
    tp = 3
    ranks = _slices(rng, ckpt, order, tp)
    index = {n: i for i, n in enumerate(order)}
    if layout == "per-rank":
        streams = ranks
    else:  # each source tensor's slices of rank 0, 1, ... in one stream
        streams = [[s for name in order for r in ranks for s in r if s.source == name]]
    flat = [[(index[s.source], s) for s in st] for st in streams]
    hashed = {n for i, n in enumerate(order) if i % 3}
    blocks = list(iter_blocks(ckpt, order, flat, hashed, 2, size))  # type: ignore[arg-type]
    assert all(b.nbytes <= size for b in blocks)
    for w, items in enumerate(flat):
        got = _replay(
            blocks, w, raw, ckpt, lambda j, _o, items=items: _want(items[j][1], raw, ckpt)
        )
        assert got == [_want(s, raw, ckpt) for _i, s in items]
    whole = {
        i: _want(TensorSlice(n, n, None, 0, 0, True, "U8", ckpt.tensors[n].info.shape), raw, ckpt)
        for i, n in enumerate(order)
    }
    got_hashed: list[bytes] = []
    for k in range(2):
        got_hashed += _replay(blocks, len(flat) + k, raw, ckpt, lambda i, _o: whole[i])
    assert sorted(got_hashed) == sorted(whole[i] for i, n in enumerate(order) if n in hashed)
    # read once: no source byte is in two blocks
    spans = sorted((b.file, b.start, b.end) for b in blocks if b.nbytes)
    assert all(a[0] != b[0] or a[2] <= b[1] for a, b in itertools.pairwise(spans))
    assert sum(b.done_bytes for b in blocks) == sum(
        ckpt.tensors[n].info.nbytes
        for i, n in enumerate(order)
        if n in hashed or any(s.source == n for st in streams for s in st)
    )


def test_consecutive_tensors_share_a_block_and_large_ones_are_cut_into_rows() -> None:
    rng = np.random.default_rng(0)
    ckpt, order, raw = _source(rng, 6, 1)
    flat = [
        (i, TensorSlice(n, n, None, 0, 0, True, "U8", ckpt.tensors[n].info.shape))
        for i, n in enumerate(order)
    ]
    total = sum(len(v) - 8 for v in raw.values())
    one = list(iter_blocks(ckpt, order, [flat], set(), 0, total))  # type: ignore[arg-type]
    assert [(b.start, b.end) for b in one] == [(8, 8 + total)]
    cut = list(iter_blocks(ckpt, order, [flat], set(), 0, 8))  # type: ignore[arg-type]
    assert len(cut) > len(order) and all(b.nbytes <= 8 for b in cut)
