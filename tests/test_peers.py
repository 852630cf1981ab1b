"""bench's peers (ptxgen/peers.py) without torch: the regrouping of Q4_K weights for torch's int4
GEMV is exact up to its bf16 scales, and its packing is tinygemm's (the even k in the high nibble).
On a GPU, bench compares every peer's result with the float64 reference (its "error" figure)."""

from __future__ import annotations

import numpy as np

from ptxgen import q4k
from ptxgen.dtypes import bf16_to_f32
from ptxgen.peers import GROUP, int4_operands, q4k_dense, q4k_groups

N, K = 24, 512


def weights(seed: int = 0) -> np.ndarray:
    return q4k.random_weights(np.random.default_rng(seed), N, K, std=0.05)


def int4_dequantize(packed: np.ndarray, scales_zeros: np.ndarray) -> np.ndarray:
    """The weights tinygemm sees (float64 [n, k]) from int4_operands' packing, in numpy."""
    q = np.stack(((packed >> 4) & 15, packed & 15), axis=-1).reshape(packed.shape[0], -1).astype(np.float64)
    pairs = bf16_to_f32(scales_zeros).astype(np.float64).transpose(1, 0, 2)  # [n, k/32, 2]
    scale, zero = (np.repeat(pairs[..., i], GROUP, axis=1) for i in (0, 1))
    return (q - 8) * scale + zero


def test_q4k_groups_are_the_format_s_own_32_weight_sub_blocks():
    w = weights()
    q, scale, minimum = q4k_groups(w, N, K)
    assert q.shape == (N, K) and q.max() <= 15 and scale.shape == minimum.shape == (N, K // GROUP)
    expected = q4k.dequantize_f64(w)
    exact = q.astype(np.float64) * np.repeat(scale, GROUP, 1) - np.repeat(minimum, GROUP, 1)
    # scale = d * sc and minimum = dmin * m are exact in f32 (an f16 times a 6-bit code).
    np.testing.assert_allclose(exact, expected, rtol=0, atol=1e-7 * np.abs(expected).max())
    # the cuBLAS peer's dense weights (f32, before its bf16 cast) are the same weights
    np.testing.assert_allclose(q4k_dense(q, scale, minimum), expected, rtol=0, atol=1e-7 * np.abs(expected).max())


def test_int4_operands_are_tinygemm_s_layout_and_exact_but_for_bf16_rounding():
    w = weights(1)
    q, scale, minimum = q4k_groups(w, N, K)
    packed, scales_zeros = int4_operands(q, scale, minimum)
    assert packed.shape == (N, K // 2) and packed.dtype == np.uint8
    np.testing.assert_array_equal(packed >> 4, q[:, 0::2])  # even k in the high nibble
    np.testing.assert_array_equal(packed & 15, q[:, 1::2])
    assert scales_zeros.shape == (K // GROUP, N, 2) and scales_zeros.dtype == np.uint16
    seen = int4_dequantize(packed, scales_zeros)
    expected = q4k.dequantize_f64(w)
    # (code - 8) * bf16(scale) + bf16(zero): each rounded to 8 significant bits (unit roundoff 2^-8).
    scale_rep, zero_rep = (np.repeat(a, GROUP, 1) for a in (scale, 8 * scale - minimum))
    bound = 2.0**-8 * (8 * np.abs(scale_rep) + np.abs(zero_rep)) * (1 + 1e-6)
    assert (np.abs(seen - expected) <= bound).all()
    assert np.abs(seen - expected).max() > 0, "bf16 rounding shows: the check can fail"
