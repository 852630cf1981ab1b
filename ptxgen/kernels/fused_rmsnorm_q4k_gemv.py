"""fused_rmsnorm_q4k_gemv: y = dequant(w) @ (x * rsqrt(mean(x^2) + eps) * gamma).

The q4k_gemv kernel (same template, same geometry) with a different staging pass: each CTA
stages x*gamma into shared memory while it sums x^2 over all k, reduces that sum once per
CTA, and scales each finished row by rsqrt(sum/k + eps). rsqrt(.) is a scalar, so
W @ (x*r*gamma) = r * (W @ (x*gamma)): the factor is applied once per row, never per weight.
x is only read.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from .base import Param
from .q4k_gemv import Q4kGemv, Q4kGemvConfig
from .rmsnorm import rms_normalize


class FusedRmsnormQ4kGemvConfig(Q4kGemvConfig):
    kind: Literal["fused_rmsnorm_q4k_gemv"]
    eps: float = Field(default=1e-6, gt=0, lt=1)


class FusedRmsnormQ4kGemv(Q4kGemv):
    name = "fused_rmsnorm_q4k_gemv"
    Config = FusedRmsnormQ4kGemvConfig
    fused = True

    def params(self) -> list[Param]:
        return [*super().params(), Param("gamma", "f32", (self.config.k,))]

    def sample_inputs(self, rng, scalars):
        inputs = super().sample_inputs(rng, scalars)
        inputs["gamma"] = (1.0 + 0.25 * rng.standard_normal(self.config.k)).astype(np.float32)
        return inputs

    def activations(self, arrays) -> np.ndarray:
        x = arrays["x"].astype(np.float64)
        return rms_normalize(x, arrays["gamma"].astype(np.float64), self.config.eps)

    def torch_activations(self, torch, tensors):
        x = tensors["x"]
        return x * torch.rsqrt(x.pow(2).mean() + self.config.eps) * tensors["gamma"]
