"""Element types shared by specs, kernels, runners and references."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DType:
    name: str
    numpy: np.dtype  # storage dtype (bf16 is stored as its uint16 bit pattern)
    size: int
    is_float: bool


DTYPES = {
    d.name: d
    for d in (
        DType("f32", np.dtype(np.float32), 4, True),
        DType("f16", np.dtype(np.float16), 2, True),
        DType("bf16", np.dtype(np.uint16), 2, True),
        DType("u8", np.dtype(np.uint8), 1, False),
        DType("u32", np.dtype(np.uint32), 4, False),
    )
}
# Unit roundoff (the largest relative error of rounding a normal value to nearest) and the
# exponent of the smallest normal value, per float dtype.
UNIT_ROUNDOFF = {"f32": 2.0**-24, "f16": 2.0**-11, "bf16": 2.0**-8}
MIN_NORMAL_EXPONENT = {"f32": -126, "f16": -14, "bf16": -126}


def half_ulp(values: np.ndarray, dtype: str) -> np.ndarray:
    """Half the spacing of `dtype` at each |value| (float64): the most a rounding to nearest of a
    value from that binade moves it (below the normal range, half the subnormal spacing; 0 counts
    as subnormal)."""
    magnitude = np.abs(np.asarray(values, dtype=np.float64))
    lowest = MIN_NORMAL_EXPONENT[dtype]
    exponent = np.where(magnitude > 0, np.frexp(magnitude)[1] - 1, lowest)  # |v| = m 2^exponent, 1 <= m < 2
    exponent = np.maximum(exponent, lowest)
    return np.ldexp(UNIT_ROUNDOFF[dtype], exponent)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """Widen bf16 bit patterns (uint16) to float32 exactly."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(values: np.ndarray) -> np.ndarray:
    """Round float32 to bf16 bit patterns, nearest-even, NaN kept a (quiet) NaN."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(np.asarray(values, dtype=np.float32))
    return np.where(nan, (bits >> 16) | 0x40, rounded).astype(np.uint16)


def to_float64(array: np.ndarray, dtype: str) -> np.ndarray:
    """Decode a stored array of a ptxgen dtype into float64 values."""
    if dtype == "bf16":
        return bf16_to_f32(array).astype(np.float64)
    return np.asarray(array, dtype=np.float64)


def from_float(values: np.ndarray, dtype: str) -> np.ndarray:
    """Encode float values into storage of a ptxgen dtype (round to nearest even)."""
    if dtype == "bf16":
        return f32_to_bf16(np.asarray(values, dtype=np.float32))
    return np.asarray(values).astype(DTYPES[dtype].numpy)


def poison(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """An array filled with NaN bits (floats) or 0xFF bytes (integers)."""
    if DTYPES[dtype].is_float:
        return from_float(np.full(shape, np.nan, dtype=np.float32), dtype)
    return np.full(shape, np.iinfo(DTYPES[dtype].numpy).max, dtype=DTYPES[dtype].numpy)
