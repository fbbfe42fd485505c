"""Trellis bitstream: int16 words <-> 16-bit states (docs/formats/exl3.md §3.2, §3.3).

A tile is a tail-biting ring of R = 16·Wd bits, MSB-first inside little-endian u32 words. Position p's
state is the 16 ring bits ending at E(p). All index arithmetic is precomputed once per tile width into
small tables, so unpacking is one gather, one shift and one mask per weight.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import cache

import torch

from exl3tool.trellis.errors import TrellisError

TILE = 16
POSITIONS = 256
INTEGER_K = (1, 2, 3, 4, 5, 6, 7, 8)
HALF_K = (1.5, 2.5, 3.5)


@dataclass(frozen=True)
class Rate:
    """Bits per weight of a trellis, derived from its tile width `words` (= 16·K int16 words)."""

    words: int
    bits: int  # floor(K)
    half: bool  # K = bits + 0.5 (MUL1 only)

    @property
    def K(self) -> float:
        return self.bits + 0.5 if self.half else float(self.bits)

    @property
    def ring_bits(self) -> int:
        return 16 * self.words


@cache
def rate_from_words(words: int) -> Rate:
    """Rate for a trellis last dimension; raise TrellisError if no K matches it."""
    if words % 16 == 0 and 1 <= words // 16 <= 8:
        return Rate(words, words // 16, False)
    if words in (24, 40, 56):
        return Rate(words, (words - 8) // 16, True)
    raise TrellisError(
        f"trellis last dimension {words} is not 16·K for K in 1..8 or 1.5/2.5/3.5 "
        "(expected one of 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128)"
    )


def rate_from_k(K: float) -> Rate:
    """Rate for a bits-per-weight value K."""
    words = 16 * K
    if float(words).is_integer():
        return rate_from_words(int(words))
    raise TrellisError(f"K = {K} is not a valid bits-per-weight (1..8 or 1.5/2.5/3.5)")


def window_ends(rate: Rate) -> list[int]:
    """E(p) for p = 0..255: the ring bit just past position p's state (docs/formats/exl3.md §3.3)."""
    if rate.half:
        return [((p + 1) * (2 * rate.bits + 1)) // 2 for p in range(POSITIONS)]
    return [(p + 1) * rate.bits for p in range(POSITIONS)]


def tc_perm() -> list[int]:
    """TC_PERM[p] = row·16 + col of position p inside its tile (docs/formats/exl3.md §3.4)."""
    perm = []
    for p in range(POSITIONS):
        t, j = p >> 3, p & 7
        row = 2 * (t % 4) + (j & 1) + 8 * ((j >> 1) & 1)
        col = (t >> 2) + 8 * ((j >> 2) & 1)
        perm.append(row * TILE + col)
    return perm


@cache
def tc_perm_inverse() -> tuple[int, ...]:
    """Position p holding tile element row·16 + col."""
    inv = [0] * POSITIONS
    for p, q in enumerate(tc_perm()):
        inv[q] = p
    return tuple(inv)


@cache
def _state_windows(words: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per position: index of the stream-word pair holding its state, and the right shift."""
    rate = rate_from_words(words)
    pair, shift = [], []
    for e in window_ends(rate):
        st = (e - 16) % rate.ring_bits
        pair.append(st // 16)
        shift.append(16 - st % 16)
    return tuple(pair), tuple(shift)


_tables: dict[tuple, torch.Tensor] = {}
_tables_lock = threading.RLock()


def _cached(key: tuple, build) -> torch.Tensor:
    t = _tables.get(key)
    if t is None:
        with _tables_lock:
            t = _tables.get(key)
            if t is None:
                t = build()
                _tables[key] = t
    return t


def _pair_sources(words: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Stored-word indices of stream words m and m+1 (mod Wd): P[m] = u16[m XOR 1] (§3.2)."""

    def build_hi():
        return torch.tensor([m ^ 1 for m in range(words)], dtype=torch.int64, device=device)

    def build_lo():
        return torch.tensor(
            [((m + 1) % words) ^ 1 for m in range(words)], dtype=torch.int64, device=device
        )

    return (
        _cached(("pair_hi", words, str(device)), build_hi),
        _cached(("pair_lo", words, str(device)), build_lo),
    )


def word_pairs(trellis: torch.Tensor) -> torch.Tensor:
    """int32 [..., Wd]: stream words m and m+1 of each tile as one 32-bit value (P[m] << 16 | P[m+1])."""
    words = trellis.shape[-1]
    hi_idx, lo_idx = _pair_sources(words, trellis.device)
    u = trellis.to(torch.int32) & 0xFFFF
    hi = u.index_select(-1, hi_idx)
    lo = u.index_select(-1, lo_idx)
    return hi.bitwise_left_shift_(16).bitwise_or_(lo)


def _check_trellis(trellis: torch.Tensor) -> Rate:
    if not isinstance(trellis, torch.Tensor):
        raise TrellisError(f"trellis must be a torch.Tensor, got {type(trellis).__name__}")
    if trellis.dtype != torch.int16:
        raise TrellisError(f"trellis dtype must be int16, got {trellis.dtype}")
    if trellis.dim() < 1:
        raise TrellisError("trellis must have at least one dimension")
    return rate_from_words(trellis.shape[-1])


def unpack(trellis: torch.Tensor) -> torch.Tensor:
    """States (int32 in 0..65535) [..., 256] in position order from trellis int16 [..., Wd].

    Same result as exllamav3's `unpack_trellis` / `unpack_trellis_frac` (as uint16).
    """
    rate = _check_trellis(trellis)
    dev = trellis.device
    pair, shift = _state_windows(rate.words)
    pair_t = _cached(("upair", rate.words, str(dev)), lambda: torch.tensor(pair, device=dev))
    shift_t = _cached(
        ("ushift", rate.words, str(dev)),
        lambda: torch.tensor(shift, dtype=torch.int32, device=dev),
    )
    v = word_pairs(trellis)
    states = v.index_select(-1, pair_t)
    return states.bitwise_right_shift_(shift_t).bitwise_and_(0xFFFF)


@cache
def _bit_sources(words: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """For every stream bit b (MSB-first): the position whose symbol holds it and the shift."""
    rate = rate_from_words(words)
    src_p, src_sh = [], []
    prev = 0
    for p, e in enumerate(window_ends(rate)):
        for b in range(prev, e):
            src_p.append(p)
            src_sh.append(e - 1 - b)
        prev = e
    assert len(src_p) == rate.ring_bits
    return tuple(src_p), tuple(src_sh)


def pack(states: torch.Tensor, K: float) -> torch.Tensor:
    """Trellis int16 [..., 16·K] from states [..., 256]; each position stores its low D(p) bits.

    Same result as exllamav3's `pack_trellis` / `pack_trellis_frac` (MASK 0xAAAA).
    """
    rate = rate_from_k(K)
    if states.shape[-1] != POSITIONS:
        raise TrellisError(f"states last dimension must be 256, got {states.shape[-1]}")
    if states.dtype.is_floating_point or states.dtype == torch.bool:
        raise TrellisError(f"states must be an integer tensor, got {states.dtype}")
    dev = states.device
    src_p, src_sh = _bit_sources(rate.words)
    p_t = _cached(("psrc", rate.words, str(dev)), lambda: torch.tensor(src_p, device=dev))
    sh_t = _cached(
        ("psh", rate.words, str(dev)),
        lambda: torch.tensor(src_sh, dtype=torch.int32, device=dev).view(rate.words, 16),
    )
    weights = _cached(
        ("pw", str(dev)),
        lambda: torch.tensor([1 << (15 - i) for i in range(16)], dtype=torch.int32, device=dev),
    )
    lead = states.shape[:-1]
    s = states.reshape(-1, POSITIONS).to(torch.int32)
    bits = s.index_select(-1, p_t).view(-1, rate.words, 16)
    bits = bits.bitwise_right_shift_(sh_t).bitwise_and_(1).mul_(weights)
    stream = bits.sum(-1, dtype=torch.int32)  # P[m], 0..65535
    hi_idx, _ = _pair_sources(rate.words, dev)
    u = stream.index_select(-1, hi_idx)  # u16[m] = P[m XOR 1]
    u = (u ^ 0x8000) - 0x8000
    return u.to(torch.int16).view(*lead, rate.words)
