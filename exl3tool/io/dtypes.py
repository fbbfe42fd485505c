"""safetensors dtypes: bit sizes and numpy equivalents (docs/formats/r7.md §10.1).

numpy is not imported here: header parsing and hashing (`validate`, `identity`) never need it.
`NUMPY` (safetensors dtype -> `np.dtype`) is built on first access.
"""

from __future__ import annotations

from typing import Any

BITS: dict[str, int] = {
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8,
    "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64,
}  # fmt: skip

# numpy dtype strings for the dtypes exl3tool reads; BF16 and FP8 are viewed as raw unsigned ints.
NUMPY_STR: dict[str, str] = {
    "BOOL": "bool", "U8": "<u1", "I8": "<i1", "I16": "<i2", "U16": "<u2", "F16": "<f2",
    "BF16": "<u2", "I32": "<i4", "U32": "<u4", "F32": "<f4", "F64": "<f8", "I64": "<i8",
    "U64": "<u8", "C64": "<c8", "F8_E5M2": "<u1", "F8_E4M3": "<u1", "F8_E8M0": "<u1",
}  # fmt: skip

# safetensors dtype -> str(torch.dtype), as quantization_config.json's tensor_storage writes it.
TORCH_NAMES: dict[str, str] = {
    "F16": "torch.float16", "BF16": "torch.bfloat16", "F32": "torch.float32",
    "F64": "torch.float64", "I16": "torch.int16", "I32": "torch.int32", "I64": "torch.int64",
    "I8": "torch.int8", "U8": "torch.uint8", "BOOL": "torch.bool",
    "F8_E4M3": "torch.float8_e4m3fn", "F8_E5M2": "torch.float8_e5m2",
}  # fmt: skip

FROM_NUMPY: dict[str, str] = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "uint16": "U16",
    "float16": "F16", "int32": "I32", "uint32": "U32", "float32": "F32", "float64": "F64",
    "int64": "I64", "uint64": "U64", "complex64": "C64",
}  # fmt: skip

_numpy: dict[str, Any] | None = None


def numpy_dtype(dtype: str) -> Any:
    """The `np.dtype` viewing a safetensors dtype (KeyError for dtypes numpy cannot view)."""
    return _numpy_map()[dtype]


def _numpy_map() -> dict[str, Any]:
    global _numpy
    if _numpy is None:
        import numpy as np

        _numpy = {k: np.dtype(v) for k, v in NUMPY_STR.items()}
    return _numpy


def __getattr__(name: str) -> Any:
    # PEP 562: `dtypes.NUMPY` stays available (dict of np.dtype) without importing numpy early.
    if name == "NUMPY":
        return _numpy_map()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def nbytes(dtype: str, shape: tuple[int, ...] | list[int]) -> int | None:
    """Byte length of a tensor, or None when the bit count is not a whole number of bytes."""
    n = 1
    for d in shape:
        n *= d
    bits = n * BITS[dtype]
    return bits // 8 if bits % 8 == 0 else None
