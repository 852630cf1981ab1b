"""The rope family (rope, persistent_decoder's per-head rotation) at positions up to 2^24, accurate
to a few 1e-7 (the method and its measured error: ptxgen/kernels/rope.py), in either pairing:

- "rotate_half" (NeoX; Qwen, and Hugging Face's order for every model): pair i is (i, i + d/2);
- "interleaved" (GPT-J; llama.cpp's "normal" rope, for which GGUF conversion permutes llama's Q/K
  rows): pair i is (2i, 2i + 1).

Pair i turns by pos * theta^(-2i/d) in both; only where its two elements sit differs. The PTX is
the macros of templates/families/rope.ptx.j2 (rope_pairs rotates registers; pair_load/pair_store
move a thread's pairs to and from memory in the plan's pairing); `RopePlan` is what they take.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

RopeStyle = Literal["rotate_half", "interleaved"]


def split_f32(value: float) -> tuple[float, float]:
    """value as hi + lo with hi = RN_f32(value), lo = RN_f32(value - hi) (about 48 bits)."""
    hi = float(np.float32(value))
    return hi, float(np.float32(value - hi))


@dataclass(frozen=True)
class RopePlan:
    """A thread's `vec` consecutive pairs and the immediate factors rope_pairs multiplies:
    chunk_factors[b] = R^(vec * 2^b) for each bit b of the chunk index, pair_factors[j] = R^j
    for j < vec, each as an f32 pair (hi, lo); R = theta^(-2/head_dim)."""

    half: int  # head_dim / 2: pairs in a head (and rotate_half's distance between a pair's elements)
    vec: int
    chunks: int  # chunks of vec pairs in a head
    chunk_factors: tuple[tuple[float, float], ...]
    pair_factors: tuple[tuple[float, float], ...]
    two_pi: tuple[float, float]
    inv_two_pi: float
    style: RopeStyle = "rotate_half"

    @property
    def stride(self) -> int:
        """Elements from one pair's first element to the next pair's: a thread's pairs i0.. start
        at element i0 * stride of the head."""
        return 1 if self.style == "rotate_half" else 2

    def pieces(self, a: list[str], b: list[str], size: int) -> list[tuple[list[str], int]]:
        """The memory accesses of a thread's pairs (registers a[j], b[j]) of `size`-byte elements, as
        (registers, byte offset from the first pair's a): rotate_half a[j] at element j and b[j] at
        half + j, one access each; interleaved a[j], b[j] at 2j, 2j + 1, in accesses of at most 16
        bytes over a0, b0, a1, b1, ... (aligned: the rope kind's vec tiles the head, the decoder's
        lane spans are 2 * vec elements)."""
        if self.style == "rotate_half":
            return [(list(a), 0), (list(b), self.half * size)]
        both = [register for pair in zip(a, b) for register in pair]
        width = min(len(both), 16 // size)
        return [(both[start:start + width], start * size) for start in range(0, len(both), width)]

    @classmethod
    def of(cls, theta: float, head_dim: int, vec: int, style: RopeStyle = "rotate_half") -> RopePlan:
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
                   two_pi=split_f32(2 * np.pi), inv_two_pi=float(np.float32(1 / (2 * np.pi))), style=style)
