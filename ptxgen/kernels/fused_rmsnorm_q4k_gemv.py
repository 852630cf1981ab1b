"""fused_rmsnorm_q4k_gemv: y = dequant(w) @ (x * rsqrt(mean(x^2) + eps) * gamma), with x*gamma
quantised to int8 as q4k_gemv quantises x.

The q4k_gemv kernel (same template, same geometry) with a different staging pass: each CTA
quantises x*gamma into shared memory while it sums x^2 over all k, reduces that sum once per
CTA, and scales each finished row by rsqrt(sum/k + eps). rsqrt(.) is a scalar, so
W @ (x*r*gamma) = r * (W @ (x*gamma)): the factor is applied once per row, never per weight, and
the int8 quantisation (relative to each block's max) is of x*gamma, the same whatever r. The
reference is therefore r * (dequant(w) @ xq) with xq = quantize(f32(x*gamma)), r in float64.
x is only read.

Error analysis: q4k_gemv's for the sum S = dequant(w) @ xq (gamma(depth) of magnitudes(w) @ |xq|),
then y = f32(S * inv_rms). inv_rms: each thread sums its x^2 with one mul and 15 fmas a staging
round and adds each round's sum (16 + rounds roundings), the CTA two 5-level shuffle trees: a
positive sum within gamma(26 + rounds); the mean (exact * 1/k for k a power of two, else
div.full, DIV_ULPS ulps) and + eps (one rounding) give v, and rsqrt.approx (RSQRT_REL) then
inv_rms = r (1 + e_r), |e_r| <= (1 + v / (2 (1 - v))) (1 + RSQRT_REL) - 1, as rmsnorm derives it.
So |y - r S| <= ((1 + gamma(depth)) (1 + e_r) (1 + u) - 1) * r * magnitudes(w) @ |xq|, since |S| is
at most that magnitude sum; the tolerance takes the same factor.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from ..dtypes import UNIT_ROUNDOFF
from ..hardware_errors import DIV_ULPS, RSQRT_REL
from .families.quant_gemv import dequantize_x
from .q4k_gemv import Q4kGemv, Q4kGemvConfig, gamma


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

    def f32_error(self) -> float:
        """Relative bound (against r * magnitudes(w) @ |xq|) of y's f32 arithmetic (the module's analysis)."""
        plan, u = self.plan, UNIT_ROUNDOFF["f32"]
        chain = 16 + plan.stage_rounds(plan.threads) + 5 + 5
        mean = 1.0 if plan.k.bit_count() == 1 else 1 + DIV_ULPS * 2 * u
        v = (1 + gamma(chain)) * mean * (1 + u) - 1
        rms = (1 + v / (2 * (1 - v))) * (1 + RSQRT_REL) - 1
        return (1 + super().f32_error()) * (1 + rms) * (1 + u) - 1

    def torch_activations(self, torch, tensors):
        x = tensors["x"]
        return x * torch.rsqrt(x.pow(2).mean() + self.config.eps) * tensors["gamma"]
