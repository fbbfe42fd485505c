"""Deterministic inputs for the exllamav3 oracle vectors (shared by the generator and the tests).

Inputs are a pure function of (seed, shape) through splitmix64, so the committed vectors need to
store only output hashes; no RNG library version can change them.
"""

from __future__ import annotations

import hashlib

import numpy as np

COMBOS = [(K, cb) for K in (1, 2, 3, 4, 5, 6, 7, 8) for cb in ("3inst", "mcg", "mul1")] + [
    (1.5, "mul1"),
    (2.5, "mul1"),
    (3.5, "mul1"),
]


def splitmix64(seed: int, count: int) -> np.ndarray:
    """count uint64 values of splitmix64 started at `seed`."""
    with np.errstate(over="ignore"):
        x = np.uint64(seed) + np.arange(1, count + 1, dtype=np.uint64) * np.uint64(
            0x9E3779B97F4A7C15
        )
        z = x
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def words(K: float) -> int:
    return int(16 * K)


def trellis_np(seed: int, k: int, n: int, K: float) -> np.ndarray:
    """int16 [k/16, n/16, 16K] of random words."""
    shape = (k // 16, n // 16, words(K))
    raw = splitmix64(seed, int(np.prod(shape))) >> np.uint64(48)
    return raw.astype(np.uint16).view(np.int16).reshape(shape)


def scales_np(seed: int, size: int) -> np.ndarray:
    """fp16 [size]: ±(0.25 .. 2.25), sign and magnitude from the hash."""
    h = splitmix64(seed, size)
    mag = 0.25 + (h & np.uint64(1023)).astype(np.float64) / 512.0
    sign = np.where((h >> np.uint64(20)) & np.uint64(1), -1.0, 1.0)
    return (sign * mag).astype(np.float16)


def fp16_np(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    """fp16 values roughly N(0, 1)-sized (sum of four uniforms), deterministic."""
    count = int(np.prod(shape))
    h = splitmix64(seed, count)
    acc = np.zeros(count)
    for i in range(4):
        acc += ((h >> np.uint64(16 * i)) & np.uint64(0xFFFF)).astype(np.float64) / 65536.0
    return ((acc - 2.0) * 1.7).astype(np.float16).reshape(shape)


def states_np(seed: int, lead: tuple[int, ...]) -> np.ndarray:
    """int16 [*lead, 256] of random 16-bit states (not necessarily a consistent ring)."""
    count = int(np.prod(lead)) * 256
    raw = splitmix64(seed, count) >> np.uint64(40)
    return raw.astype(np.uint16).view(np.int16).reshape(*lead, 256)


def sha(a: np.ndarray) -> str:
    """sha256 of the array's little-endian C-order bytes."""
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def combo_seed(K: float, cb: str, salt: int) -> int:
    return (int(K * 2) * 131 + ("3inst", "mcg", "mul1").index(cb) * 7 + salt * 1000003) & (
        (1 << 63) - 1
    )
