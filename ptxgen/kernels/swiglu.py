"""swiglu: out = gate * sigmoid(gate) * up, elementwise over f32[n].

Memory-bound, on the launch plan and PTX skeleton shared with residual_add (the elementwise
family, ptxgen/kernels/families/elementwise.py): every thread moves 16-byte vectors (4 elements
of gate, up and out), several in flight for large n; the n % 4 leftover elements are done by
scalar loads in the first CTA.
sigmoid(g) = 1 / (1 + 2^(-g log2 e)) with ex2.approx / rcp.approx: for g -> -inf the power
overflows to +inf and the result is -0 (the true value is below f32's smallest subnormal from
g < -104), for g -> +inf it underflows to 0 and sigmoid is exactly 1. Error about 1e-6 relative per element (f32 rounding of the
exponent argument, ex2.approx 2^-22, rcp.approx 1 ulp).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from .base import Kind, Param, Traffic
from .families.elementwise import ElementwiseConfig, ElementwiseLaunch


def silu_mul(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """Float64 gate * sigmoid(gate) * up, without overflow warnings for very negative gate."""
    gate = np.asarray(gate, dtype=np.float64)
    up = np.asarray(up, dtype=np.float64)
    e = np.exp(-np.abs(gate))
    sigmoid = np.where(gate >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    return gate * sigmoid * up


class SwigluConfig(ElementwiseConfig):
    kind: Literal["swiglu"]


class Swiglu(ElementwiseLaunch, Kind):
    name = "swiglu"
    Config = SwigluConfig

    def params(self) -> list[Param]:
        n = self.config.n
        return [Param("gate", "f32", (n,)), Param("up", "f32", (n,)), Param("out", "f32", (n,), "out")]

    def sample_inputs(self, rng, scalars):
        n = self.config.n
        return {"gate": (2.0 * rng.standard_normal(n)).astype(np.float32),
                "up": (rng.standard_normal(n) + 0.25).astype(np.float32)}

    def reference(self, arrays, scalars):
        return {"out": silu_mul(arrays["gate"], arrays["up"])}

    def traffic(self, scalars) -> Traffic:
        # gate and up read, out written; per element mul, ex2, add, rcp, mul, mul.
        return Traffic(bytes=3 * 4 * self.config.n, flops=6 * self.config.n)

    def torch_peer(self, torch, tensors, scalars):
        """bench's peer: F.silu(gate) * up."""
        gate, up = tensors["gate"], tensors["up"]
        return lambda: torch.nn.functional.silu(gate) * up
