"""GGML Q4_K weights in numpy: the Q4_K entry of ``ptxgen.quants`` under the names kernels use.

Layout and quantiser: ``ptxgen.kquants``; rows, checks, random weights: ``ptxgen.quants``.
"""

from __future__ import annotations

import numpy as np

from . import kquants
from .gguf_model import load_gguf_tensor
from .quants import Q4_K

BLOCK_WEIGHTS = Q4_K.block_weights
BLOCK_BYTES = Q4_K.block_bytes

row_bytes = Q4_K.row_bytes
quantize = Q4_K.quantize
dequantize = Q4_K.dequantize
dequantize_f64 = Q4_K.dequantize_f64
random_weights = Q4_K.random_weights


def unpack(w: np.ndarray):
    """Split packed rows into fields: ``(d, dmin, scales, mins, q)``: d, dmin float32 [n, nb];
    scales, mins uint8 [n, nb, 8]; q uint8 [n, nb*256] (codes 0..15 in weight order)."""
    w = Q4_K.check_packed(w)
    d, dmin, sc, mn, q = kquants.unpack_q4_k(w.reshape(w.shape[0], -1, BLOCK_BYTES))
    return d, dmin, sc, mn, q.reshape(w.shape[0], -1)


__all__ = ["BLOCK_BYTES", "BLOCK_WEIGHTS", "dequantize", "dequantize_f64",
           "load_gguf_tensor", "quantize", "random_weights", "row_bytes", "unpack"]
