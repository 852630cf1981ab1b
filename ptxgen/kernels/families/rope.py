"""The rope family (rope, persistent_decoder's per-head rotation): NeoX rotate-half at positions
up to 2^24, accurate to a few 1e-7 (the method and its measured error: ptxgen/kernels/rope.py).
The PTX is the rope_pairs macro of templates/families/rope.ptx.j2; `RopePlan` is what it takes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def split_f32(value: float) -> tuple[float, float]:
    """value as hi + lo with hi = RN_f32(value), lo = RN_f32(value - hi) (about 48 bits)."""
    hi = float(np.float32(value))
    return hi, float(np.float32(value - hi))


@dataclass(frozen=True)
class RopePlan:
    """A thread's `vec` consecutive pairs and the immediate factors rope_pairs multiplies:
    chunk_factors[b] = R^(vec * 2^b) for each bit b of the chunk index, pair_factors[j] = R^j
    for j < vec, each as an f32 pair (hi, lo); R = theta^(-2/head_dim)."""

    half: int  # head_dim / 2: the distance between the two elements of a pair
    vec: int
    chunks: int  # chunks of vec pairs in a head
    chunk_factors: tuple[tuple[float, float], ...]
    pair_factors: tuple[tuple[float, float], ...]
    two_pi: tuple[float, float]
    inv_two_pi: float

    @classmethod
    def of(cls, theta: float, head_dim: int, vec: int) -> RopePlan:
        """`vec` pairs per thread must divide head_dim/2."""
        half = head_dim // 2
        if half % vec:
            raise ValueError(f"{vec} pairs per thread do not tile head_dim/2 = {half}")
        chunks = half // vec

        def power(exponent: int) -> tuple[float, float]:
            return split_f32(theta ** (-2.0 * exponent / head_dim))

        return cls(half=half, vec=vec, chunks=chunks,
                   chunk_factors=tuple(power(vec << b) for b in range((chunks - 1).bit_length())),
                   pair_factors=tuple(power(j) for j in range(vec)),
                   two_pi=split_f32(2 * np.pi), inv_two_pi=float(np.float32(1 / (2 * np.pi))))
