"""Trellis codec: codebooks, bitstream pack/unpack, rotated decode, Hadamard, effective weight.

This package is the torch layer of exl3tool; nothing outside it imports torch at import time.
Everything is bit-exact with exllamav3 1.6.5 (docs/formats/exl3.md §3-§5) on CPU and CUDA.

    decode_rotated(trellis, codebook, *, rows=None, cols=None, device=None) -> fp16 [k, n]
    effective_weight(trellis, suh, svh, codebook, *, rows=None, cols=None, device=None,
                     method="auto") -> fp16 [k, n]
    decode_rotated_many / effective_weights: the same for many matrices, one launch per shape on CUDA
    unpack(trellis) -> int32 states [..., 256];  pack(states, K) -> int16 [..., 16K]
    had_r_128(x, pre_scale=None, post_scale=None, scale=1.0) -> fp16
    codebook_lut(codebook, device=None) -> fp16 [65536]

codebook is "3inst" | "mcg" | "mul1"; K is derived from trellis.shape[-1].
"""

from exl3tool.trellis.bitstream import (
    HALF_K,
    INTEGER_K,
    Rate,
    pack,
    rate_from_k,
    rate_from_words,
    tc_perm,
    unpack,
)
from exl3tool.trellis.codebook import CODEBOOKS, codebook_from_markers, codebook_lut
from exl3tool.trellis.decode import (
    check_rate_codebook,
    decode_rotated,
    decode_rotated_many,
    decode_states,
)
from exl3tool.trellis.errors import TrellisError
from exl3tool.trellis.hadamard import (
    fused_transform,
    had_left,
    had_r_128,
    had_right,
    matmul_matches_fma,
)
from exl3tool.trellis.weight import effective_weight, effective_weights

__all__ = [
    "CODEBOOKS",
    "HALF_K",
    "INTEGER_K",
    "Rate",
    "TrellisError",
    "check_rate_codebook",
    "codebook_from_markers",
    "codebook_lut",
    "decode_rotated",
    "decode_rotated_many",
    "decode_states",
    "effective_weight",
    "effective_weights",
    "fused_transform",
    "had_left",
    "had_r_128",
    "had_right",
    "matmul_matches_fma",
    "pack",
    "rate_from_k",
    "rate_from_words",
    "tc_perm",
    "unpack",
]
