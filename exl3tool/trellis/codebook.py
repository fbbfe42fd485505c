"""Codebook tables: 16-bit trellis state -> fp16 weight (docs/formats/exl3.md §4)."""

from __future__ import annotations

import threading

import torch

from exl3tool.trellis.errors import TrellisError

CODEBOOKS = ("3inst", "mcg", "mul1")

# docs/formats/exl3.md §4: multipliers / offsets of the integer step, mod 2^32
_3INST_MUL, _3INST_ADD = 89226354, 64248484
_MCG_MUL = 0xCBAC1FED
_MUL1_MUL = 0x83DCD12D
_LOP3_MASK, _LOP3_XOR = 0x8FFF8FFF, 0x3B603B60
# MUL1: __hfma(1024 + b, k_inv = 0x1EEE, k_bias = 0xC931); exact in fp32 (≤ 22 significant bits)
_MUL1_K_INV = 1774 / 2**18
_MUL1_K_BIAS = -10.3828125

_cache: dict[tuple[str, str], torch.Tensor] = {}
_lock = threading.Lock()


def check_codebook(codebook: str) -> str:
    """Return the canonical codebook name or raise TrellisError."""
    name = codebook.lower() if isinstance(codebook, str) else codebook
    if name not in CODEBOOKS:
        raise TrellisError(f"unknown codebook {codebook!r}; expected one of {', '.join(CODEBOOKS)}")
    return name


def _fp16_from_bits(bits: torch.Tensor) -> torch.Tensor:
    """Reinterpret the low 16 bits of an int64 tensor as fp16."""
    signed = torch.where(bits >= 0x8000, bits - 0x10000, bits)
    return signed.to(torch.int16).view(torch.float16)


def _build(codebook: str) -> torch.Tensor:
    s = torch.arange(65536, dtype=torch.int64)
    if codebook == "mul1":
        x = (s * _MUL1_MUL) & 0xFFFFFFFF
        b = (x & 255) + ((x >> 8) & 255) + ((x >> 16) & 255) + (x >> 24)
        w = (1024 + b).to(torch.float32) * torch.tensor(_MUL1_K_INV, dtype=torch.float32)
        w = w + torch.tensor(_MUL1_K_BIAS, dtype=torch.float32)
        return w.to(torch.float16)
    if codebook == "3inst":
        x = (s * _3INST_MUL + _3INST_ADD) & 0xFFFFFFFF
    else:
        x = (s * _MCG_MUL) & 0xFFFFFFFF
    x = (x & _LOP3_MASK) ^ _LOP3_XOR
    lo = _fp16_from_bits(x & 0xFFFF).to(torch.float32)
    hi = _fp16_from_bits(x >> 16).to(torch.float32)
    # __hadd: the fp32 sum is exact (both halves in [0.125, 2)), one RNE to fp16
    return (lo + hi).to(torch.float16)


def codebook_lut(codebook: str, device: torch.device | str | None = None) -> torch.Tensor:
    """The 65,536-entry fp16 table for `codebook` on `device` (cached, read-only by convention)."""
    name = check_codebook(codebook)
    dev = torch.device(device if device is not None else "cpu")
    key = (name, str(dev))
    lut = _cache.get(key)
    if lut is None:
        with _lock:
            lut = _cache.get(key)
            if lut is None:
                cpu = _cache.get((name, "cpu"))
                if cpu is None:
                    cpu = _build(name)
                    _cache[(name, "cpu")] = cpu
                lut = cpu if dev.type == "cpu" else cpu.to(dev)
                _cache[key] = lut
    return lut


def codebook_from_markers(has_mcg: bool, has_mul1: bool) -> str:
    """Codebook selected by the presence of the `.mcg` / `.mul1` markers (docs/formats/exl3.md §1)."""
    if has_mcg and has_mul1:
        raise TrellisError("both .mcg and .mul1 markers present; at most one is allowed")
    if has_mul1:
        return "mul1"
    if has_mcg:
        return "mcg"
    return "3inst"
