"""Rotated-basis decode Ŵ = ext.reconstruct (docs/formats/exl3.md §3.5, §5.1).

The torch path folds the in-tile permutation (§3.4) and the state windows (§3.3) into one precomputed
gather index per (tile width, output width): for a block of tile rows it does one gather from the
per-tile word pairs, one shift, one mask and one codebook lookup per weight, writing straight into the
row-major output. Working memory is the output plus one int32 block (a few MB).
On CUDA a Triton kernel does the same in one pass (`exl3tool.trellis._triton`).
"""

from __future__ import annotations

import torch

from exl3tool.trellis import _triton
from exl3tool.trellis.bitstream import (
    POSITIONS,
    TILE,
    Rate,
    _cached,
    _check_trellis,
    _state_windows,
    tc_perm_inverse,
    word_pairs,
)
from exl3tool.trellis.codebook import check_codebook, codebook_lut
from exl3tool.trellis.errors import TrellisError

# int32 elements per block of the torch path; small enough to stay in L2 across the passes
BLOCK_ELEMS = 1 << 18


def check_rate_codebook(rate: Rate, codebook: str) -> str:
    """Canonical codebook name; half-integer K decodes only with MUL1 (docs/formats/exl3.md §1.1)."""
    name = check_codebook(codebook)
    if rate.half and name != "mul1":
        raise TrellisError(
            f"K = {rate.K} (trellis last dimension {rate.words}) is only defined for the mul1 "
            f"codebook, not {name}"
        )
    return name


def _as_range(r, size: int, what: str) -> tuple[int, int]:
    """(start, stop) in elements from None, a slice or a pair; both multiples of 16 within size."""
    if r is None:
        return 0, size
    if isinstance(r, slice):
        if r.step not in (None, 1):
            raise TrellisError(f"{what} slice step must be 1")
        start, stop, _ = r.indices(size)
    else:
        try:
            start, stop = (int(x) for x in r)
        except (TypeError, ValueError):
            raise TrellisError(f"{what} must be None, a slice or a (start, stop) pair") from None
    if not (0 <= start < stop <= size):
        raise TrellisError(f"{what} range [{start}, {stop}) is empty or outside [0, {size})")
    if start % TILE or stop % TILE:
        raise TrellisError(f"{what} range [{start}, {stop}) must lie on 16-element tile boundaries")
    return start, stop


def slice_trellis(trellis: torch.Tensor, rows=None, cols=None) -> torch.Tensor:
    """The tiles covering element rows/cols ranges (multiples of 16) of the [k, n] matrix."""
    _check_trellis(trellis)
    if trellis.dim() != 3:
        raise TrellisError(
            f"trellis must be 3-D [k/16, n/16, 16K], got shape {tuple(trellis.shape)}"
        )
    k, n = trellis.shape[0] * TILE, trellis.shape[1] * TILE
    r0, r1 = _as_range(rows, k, "rows")
    c0, c1 = _as_range(cols, n, "cols")
    return trellis[r0 // TILE : r1 // TILE, c0 // TILE : c1 // TILE]


def _gather_tables(words: int, tiles_n: int, device: torch.device):
    """Index into one tile row's word pairs [tiles_n·Wd] and right shift, for each of its 16·n outputs."""
    pair, shift = _state_windows(words)
    p = torch.tensor(tc_perm_inverse(), dtype=torch.int64).view(TILE, 1, TILE)  # [row, 1, col]

    def build_idx():
        tn = torch.arange(tiles_n, dtype=torch.int64).view(1, tiles_n, 1) * words
        return (torch.tensor(pair, dtype=torch.int64)[p] + tn).reshape(-1).to(device)

    def build_shift():
        sh = torch.tensor(shift, dtype=torch.int32)[p].expand(TILE, tiles_n, TILE)
        return sh.reshape(-1).to(device)

    return (
        _cached(("gidx", words, tiles_n, str(device)), build_idx),
        _cached(("gshift", words, tiles_n, str(device)), build_shift),
    )


def _decode_torch(trellis: torch.Tensor, lut: torch.Tensor, out: torch.Tensor) -> None:
    tiles_k, tiles_n, words = trellis.shape
    n = tiles_n * TILE
    idx, shift = _gather_tables(words, tiles_n, trellis.device)
    rows_per_block = max(1, BLOCK_ELEMS // (TILE * n))
    out_rows = out.view(tiles_k, TILE * n)
    for r0 in range(0, tiles_k, rows_per_block):
        r1 = min(tiles_k, r0 + rows_per_block)
        v = word_pairs(trellis[r0:r1]).view(r1 - r0, tiles_n * words)
        s = torch.gather(v, 1, idx.expand(r1 - r0, -1))
        s.bitwise_right_shift_(shift).bitwise_and_(0xFFFF)
        torch.index_select(lut, 0, s.view(-1), out=out_rows[r0:r1].view(-1))


def decode_rotated(
    trellis: torch.Tensor,
    codebook: str,
    *,
    rows=None,
    cols=None,
    device: torch.device | str | None = None,
    out: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Ŵ fp16 [k, n] (in, out), bit-exact with exllamav3's `ext.reconstruct`.

    rows / cols: element ranges (slice or (start, stop), multiples of 16) to decode only part of the
    matrix (TP slices); only those tiles are read. device: where to decode (default: the trellis's).
    backend: "auto" (Triton on CUDA when available, else torch), "torch" or "triton".
    """
    if (
        out is not None
        and rows is None
        and cols is None
        and device is None
        and backend == "auto"
        and _triton.HAVE_TRITON
        and _triton.relaunch(trellis, codebook, out)
    ):  # the same call as an earlier one (same shapes, dtypes, devices): checks already passed
        return out
    rate = _check_trellis(trellis)
    name = check_rate_codebook(rate, codebook)
    if rows is None and cols is None:
        if trellis.dim() != 3:
            raise TrellisError(
                f"trellis must be 3-D [k/16, n/16, 16K], got shape {tuple(trellis.shape)}"
            )
        sub = trellis
    else:
        sub = slice_trellis(trellis, rows, cols)
    dev = torch.device(device) if device is not None else trellis.device
    if sub.device != dev:
        sub = sub.to(dev, non_blocking=True)
    k, n = sub.shape[0] * TILE, sub.shape[1] * TILE
    if out is None:
        out = torch.empty((k, n), dtype=torch.float16, device=dev)
    elif out.shape != (k, n) or out.dtype != torch.float16 or not out.is_contiguous():
        raise TrellisError(f"out must be a contiguous fp16 tensor of shape {(k, n)}")
    if backend not in ("auto", "torch", "triton"):
        raise TrellisError(f"unknown backend {backend!r}")
    use_triton = backend == "triton" or (backend == "auto" and dev.type == "cuda")
    if use_triton:
        if _triton.available(dev):
            whole = sub is trellis and backend == "auto" and device is None
            _triton.decode_rotated(sub, name, rate, out, remember=codebook if whole else None)
            return out
        if backend == "triton":
            raise TrellisError("the Triton backend is not available on this device")
    _decode_torch(sub.contiguous(), codebook_lut(name, dev), out)
    return out


def decode_states(states: torch.Tensor, codebook: str) -> torch.Tensor:
    """Per-state codebook values (exllamav3's `ext.decode`): fp16 of the same shape."""
    lut = codebook_lut(codebook, states.device)
    return lut[(states.to(torch.int64) & 0xFFFF)]


def states_to_tiles(values: torch.Tensor) -> torch.Tensor:
    """Position-order values [..., 256] -> row-major 16x16 tiles [..., 16, 16] (§3.4)."""
    if values.shape[-1] != POSITIONS:
        raise TrellisError("values last dimension must be 256")
    inv = _cached(
        ("tcinv", str(values.device)),
        lambda: torch.tensor(tc_perm_inverse(), dtype=torch.int64, device=values.device),
    )
    return values.index_select(-1, inv).view(*values.shape[:-1], TILE, TILE)


def decode_rotated_many(
    trellises: list[torch.Tensor], codebook: str, *, device: torch.device | str | None = None
) -> list[torch.Tensor]:
    """Ŵ of many whole matrices, each as `decode_rotated` gives it.

    On CUDA, trellises of one shape and rate are decoded by one grouped kernel launch (all experts
    of a projection at once); elsewhere one `decode_rotated` call each.
    """
    if not trellises:
        return []
    dev = torch.device(device) if device is not None else trellises[0].device
    if not _triton.available(dev):  # CUDA, or the CPU under the interpreter (tests)
        return [decode_rotated(t, codebook, device=dev) for t in trellises]
    from exl3tool.trellis import _triton_group

    for t in trellises:
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            _check_trellis(t)  # the type error first, as decode_rotated gives it
            raise TrellisError(f"trellis must be 3-D [k/16, n/16, 16K], got {tuple(t.shape)}")

    def launch(idx, stacked, name, rate):
        ts = [t if t.device == dev else t.to(dev) for t in (trellises[i] for i in idx)]
        _triton_group.decode_group(ts, stacked, name, rate)

    return _triton_group.launch_grouped(trellises, codebook, dev, launch, stacked=True)
