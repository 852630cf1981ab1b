"""The GGML tensor types real GGUF files mix, in numpy: one registry, one set of row functions.

A tensor of n rows of k weights is stored as ``u8 [n, row_bytes(k)]`` whatever its type: k /
block_weights blocks of block_bytes each, exactly as in a GGUF file. Types:

* ``q4_k``, ``q6_k``: GGML K-quants, 256 weights a block (layouts in ``ptxgen.kquants``);
  quantised by ptxgen's own renditions of ggml's reference quantisers (gguf-py has none).
* ``q8_0`` (``block_q8_0``, 34 bytes for 32 weights)::

      f16 d, i8 qs[32]          weight j = d * qs[j]

  quantised by gguf-py, whose Q8_0 is ggml's ``quantize_row_q8_0_ref`` bit for bit
  (``d = max|x| / 127``, ``qs = roundf(x / d)``, halves away from zero).
* ``f32``, ``f16``, ``bf16``: one weight a "block", little-endian; f16 and bf16 round to
  nearest even (bf16 keeps NaN a quiet NaN), as ggml does.

Every type has ptxgen's float32 dequantiser (the same rounding steps as ggml, tested equal to
gguf-py's bit for bit) and a float64 one that *is* gguf-py's, the ground truth of references.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import kquants
from .dtypes import bf16_to_f32, f32_to_bf16
from .errors import PtxgenError


def _quantize_q8_0(xb: np.ndarray) -> np.ndarray:
    import gguf

    return gguf.quants.quantize(xb, gguf.GGMLQuantizationType.Q8_0)


def _dequantize_q8_0(blocks: np.ndarray) -> np.ndarray:
    d = blocks[..., 0:2].copy().view(np.float16).astype(np.float32)  # [..., 1]
    return d * blocks[..., 2:].view(np.int8).astype(np.float32)


def _view_as(dtype) -> Callable[[np.ndarray], np.ndarray]:
    """Dequantiser of a plain float type: the bytes of each weight as dtype, widened to f32."""
    return lambda blocks: np.ascontiguousarray(blocks).view(dtype).astype(np.float32)


@dataclass(frozen=True)
class QuantType:
    """One GGML tensor type: its block geometry and its (de)quantisers on whole blocks."""

    name: str  # as specs, CLI options and Param.layout spell it: "q4_k"
    ggml_name: str  # gguf.GGMLQuantizationType member: "Q4_K"
    block_weights: int
    block_bytes: int
    quantize_blocks: Callable[[np.ndarray], np.ndarray]  # finite f32 [B, weights] -> u8 [B, bytes]
    dequantize_blocks: Callable[[np.ndarray], np.ndarray]  # u8 [..., bytes] -> f32 [..., weights]
    # A block's floating-point fields as (byte offset, "f16" | "bf16" | "f32"): the scales of a
    # quantised type (its codes are integers), the weight itself of a plain float type.
    float_fields: tuple[tuple[int, str], ...]

    @property
    def ggml_type(self):
        import gguf

        return gguf.GGMLQuantizationType[self.ggml_name]

    def row_bytes(self, k: int) -> int:
        """Bytes of one row of k weights (k a multiple of block_weights)."""
        if k % self.block_weights:
            raise PtxgenError(f"{self.ggml_name} row length must be a multiple of {self.block_weights}, got k={k}")
        return k // self.block_weights * self.block_bytes

    def check_packed(self, w: np.ndarray, k: int | None = None) -> np.ndarray:
        """Validate packed weights; return them as u8 [n, row_bytes]."""
        w = np.asarray(w)
        if w.dtype != np.uint8:
            raise PtxgenError(f"{self.ggml_name} weights must be uint8, got {w.dtype}")
        if w.ndim == 1:
            w = w[None, :]
        if w.ndim != 2:
            raise PtxgenError(f"{self.ggml_name} weights must be 1-D or 2-D [n, row bytes], got shape {w.shape}")
        if w.shape[1] % self.block_bytes:
            raise PtxgenError(f"{self.ggml_name} row must be a multiple of {self.block_bytes} bytes, got shape {w.shape}")
        if k is not None and w.shape[1] != self.row_bytes(k):
            raise PtxgenError(f"{self.ggml_name} weights for k={k} must have {self.row_bytes(k)} bytes a row, "
                              f"got shape {w.shape}")
        return w

    def quantize(self, x: np.ndarray) -> np.ndarray:
        """float [n, k] (or one row, 1-D) -> u8 [n, row_bytes(k)]."""
        x = np.asarray(x)
        if x.dtype.kind != "f":
            raise PtxgenError(f"{self.ggml_name} quantize needs a float array, got {x.dtype}")
        if x.ndim == 1:
            x = x[None, :]
        if x.ndim != 2:
            raise PtxgenError(f"{self.ggml_name} quantize needs a 1-D or 2-D [n, k] array, got shape {x.shape}")
        n, k = x.shape
        if k == 0 or k % self.block_weights:
            raise PtxgenError(f"{self.ggml_name} quantize needs k a positive multiple of {self.block_weights}, "
                              f"got shape {x.shape}")
        x = x.astype(np.float32)
        if not np.isfinite(x).all():
            raise PtxgenError(f"{self.ggml_name} quantize needs finite weights, got NaN or inf")
        blocks = x.reshape(-1, self.block_weights)
        out = np.empty((blocks.shape[0], self.block_bytes), np.uint8)
        # Bounds the quantisers' temporaries (~20 arrays of chunk * 256 float32 for the K-quants).
        chunk = (1 << 22) // self.block_weights
        for start in range(0, blocks.shape[0], chunk):
            out[start:start + chunk] = self.quantize_blocks(blocks[start:start + chunk])
        return out.reshape(n, self.row_bytes(k))

    def non_finite(self, w: np.ndarray) -> int:
        """How many floating-point fields of packed rows are NaN or infinite (an all-ones exponent)."""
        blocks = np.asarray(w).reshape(-1, self.block_bytes)
        found = 0
        for offset, kind in self.float_fields:
            size, exponent = _EXPONENT_BITS[kind]
            bits = np.ascontiguousarray(blocks[:, offset:offset + size]).view(f"<u{size}")
            found += int(np.count_nonzero(bits & exponent == exponent))
        return found

    def dequantize(self, w: np.ndarray, k: int | None = None) -> np.ndarray:
        """Packed u8 [n, row_bytes] (or one row, 1-D) -> float32 [n, k], ptxgen's own dequantiser."""
        w = self.check_packed(w, k)
        n, nb = w.shape[0], w.shape[1] // self.block_bytes
        return self.dequantize_blocks(w.reshape(n, nb, self.block_bytes)).reshape(n, nb * self.block_weights)

    def dequantize_f64(self, w: np.ndarray) -> np.ndarray:
        """The ground truth for references: gguf-py's own dequantisation, as float64 [..., k]
        (leading dimensions kept)."""
        import gguf

        w = np.asarray(w)
        if w.dtype != np.uint8 or w.ndim == 0 or w.shape[-1] % self.block_bytes:
            raise PtxgenError(f"{self.ggml_name} weights must be uint8 rows of whole {self.block_bytes}-byte blocks, "
                              f"got {w.dtype} {w.shape}")
        return gguf.quants.dequantize(np.ascontiguousarray(w), self.ggml_type).astype(np.float64)

    def random_weights(self, rng: np.random.Generator, n: int, k: int, std: float = 0.02) -> np.ndarray:
        """u8 [n, row_bytes(k)] of quantised N(0, std^2) weights; deterministic in rng.

        Large matrices draw whole blocks (with rng) from a pool of POOL_WEIGHTS quantised weights
        made once per (type, std), so every block is still a real quantised Gaussian block, and a
        model's worth of weights (Qwen3-8B: 7.6G) costs a gather, not the quantiser."""
        if n * k <= POOL_WEIGHTS:
            return self.quantize(rng.standard_normal((n, k), dtype=np.float32) * np.float32(std))
        pool = block_pool(self.name, float(std), POOL_WEIGHTS)
        picks = rng.integers(0, len(pool), size=n * (k // self.block_weights))
        return pool[picks].reshape(n, self.row_bytes(k))


_EXPONENT_BITS = {"f16": (2, 0x7C00), "bf16": (2, 0x7F80), "f32": (4, 0x7F800000)}  # bytes, exponent mask
QUANT_TYPES: dict[str, QuantType] = {
    q.name: q
    for q in (
        QuantType("q4_k", "Q4_K", kquants.QK_K, kquants.Q4_K_BYTES, kquants.quantize_q4_k, kquants.dequantize_q4_k,
                  ((0, "f16"), (2, "f16"))),  # d, dmin
        QuantType("q6_k", "Q6_K", kquants.QK_K, kquants.Q6_K_BYTES, kquants.quantize_q6_k, kquants.dequantize_q6_k,
                  ((kquants.Q6_K_BYTES - 2, "f16"),)),  # d, the last field
        QuantType("q8_0", "Q8_0", 32, 34, _quantize_q8_0, _dequantize_q8_0, ((0, "f16"),)),
        QuantType("f32", "F32", 1, 4, lambda xb: xb.view(np.uint8), _view_as(np.float32), ((0, "f32"),)),
        QuantType("f16", "F16", 1, 2, lambda xb: xb.astype(np.float16).view(np.uint8), _view_as(np.float16),
                  ((0, "f16"),)),
        QuantType("bf16", "BF16", 1, 2, lambda xb: f32_to_bf16(xb).view(np.uint8),
                  lambda blocks: bf16_to_f32(np.ascontiguousarray(blocks).view(np.uint16)), ((0, "bf16"),)),
    )
}
Q4_K = QUANT_TYPES["q4_k"]
# The kernel kind that multiplies a matrix of each type by a vector (y = W x, params y, w, x).
GEMV_KINDS = {"q4_k": "q4k_gemv", "q6_k": "q6k_gemv", "q8_0": "q8_0_gemv"}
# The fused RMSNorm + GEMV group kind of each type (projections that share the normed input).
NORMED_GROUP_KINDS = {quant: f"fused_rmsnorm_{kind}_group" for quant, kind in GEMV_KINDS.items()}


def quant_type(value) -> QuantType:
    """The registry entry for a name ("q6_k", "Q6_K") or a gguf.GGMLQuantizationType / its number."""
    if isinstance(value, str):
        found = QUANT_TYPES.get(value.lower())
        shown = repr(value)
    else:
        import gguf

        try:
            ggml = gguf.GGMLQuantizationType(int(value))
        except ValueError:
            ggml = None
        found = next((q for q in QUANT_TYPES.values() if ggml is not None and q.ggml_name == ggml.name), None)
        shown = ggml.name if ggml is not None else f"type number {int(value)}"
    if found is None:
        raise PtxgenError(f"unsupported tensor type {shown} (supported: {', '.join(q.ggml_name for q in QUANT_TYPES.values())})")
    return found


POOL_WEIGHTS = 1 << 22  # beyond this many weights, blocks are drawn from a quantised pool
POOL_SEED = 20250101


@functools.lru_cache(maxsize=16)
def block_pool(name: str, std: float, weights: int) -> np.ndarray:
    """Blocks [weights / block_weights, block_bytes] of type `name` quantised from N(0, std^2)
    weights of a fixed seed (read-only)."""
    quant = QUANT_TYPES[name]
    rng = np.random.default_rng(POOL_SEED)
    gaussian = rng.standard_normal((weights // quant.block_weights, quant.block_weights), dtype=np.float32)
    pool = quant.quantize(gaussian * np.float32(std))
    pool.setflags(write=False)
    return pool
