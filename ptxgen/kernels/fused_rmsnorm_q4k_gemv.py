"""fused_rmsnorm_q4k_gemv: y = dequant(w) @ (x * rsqrt(mean(x^2) + eps) * gamma), with x*gamma
quantised to int8 as q4k_gemv quantises x.

The q4k_gemv kernel (same template, same geometry) with a different staging pass: each CTA
quantises x*gamma into shared memory while it sums x^2 over all k, reduces that sum once per
CTA, and scales each finished row by rsqrt(sum/k + eps). rsqrt(.) is a scalar, so
W @ (x*r*gamma) = r * (W @ (x*gamma)): the factor is applied once per row, never per weight, and
the int8 quantisation (relative to each block's max) is of x*gamma, the same whatever r. The
reference is therefore r * (dequant(w) @ xq) with xq = quantize(f32(x*gamma)), r in float64.
x is only read.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from .families.q4k import dequantize_x
from .q4k_gemv import Q4kGemv, Q4kGemvConfig


class FusedRmsnormQ4kGemvConfig(Q4kGemvConfig):
    kind: Literal["fused_rmsnorm_q4k_gemv"]
    eps: float = Field(default=1e-6, gt=0, lt=1)


def normed_activations(arrays, eps: float) -> np.ndarray:
    """r * xq(x*gamma): the vector the fused kinds multiply the weights by, in float64."""
    x = arrays["x"].astype(np.float64)
    scaled = arrays["x"].astype(np.float32) * arrays["gamma"].astype(np.float32)  # as the kernel stages it
    return dequantize_x(scaled) / np.sqrt(np.mean(x * x) + eps)


class FusedRmsnormQ4kGemv(Q4kGemv):
    name = "fused_rmsnorm_q4k_gemv"
    Config = FusedRmsnormQ4kGemvConfig
    fused = True

    def activations(self, arrays) -> np.ndarray:
        return normed_activations(arrays, self.config.eps)

    def torch_activations(self, torch, tensors):
        x = tensors["x"]
        return x * torch.rsqrt(x.pow(2).mean() + self.config.eps) * tensors["gamma"]
