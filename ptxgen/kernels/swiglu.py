"""swiglu: out = gate * sigmoid(gate) * up, elementwise over f32[n].

Memory-bound, on the launch plan and PTX skeleton shared with residual_add (the elementwise
family, ptxgen/kernels/families/elementwise.py): every thread moves 16-byte vectors (4 elements
of gate, up and out), several in flight for large n; the n % 4 leftover elements are done by
scalar loads in the first CTA.
sigmoid(g) = 1 / (1 + 2^(-g log2 e)) with ex2.approx / rcp.approx: for g -> -inf the power
overflows to +inf and the result is -0 (the true value is below f32's smallest subnormal from
g < -104), for g -> +inf it underflows to 0 and sigmoid is exactly 1.

Error analysis per element (u = 2^-24; s(g) = sigmoid(g)):
1. t = g * RN(-log2 e): the constant and the product round once each, so t is off by at most
   2u |g| log2 e, and 2^t by a factor within 2u |g| (ln 2 log2 e = 1) before ex2.approx's own
   EX2_REL (1.5e-7, measured on an H100).
2. 1 + 2^t rounds once (u); the power's relative error reaches it scaled by 2^t / (1 + 2^t) =
   1 - s(g); rcp.approx adds RCP_REL (9.5e-8).
3. s * g rounds once (u); * up is the last rounding: half an ulp of f32 (error_bound).
So |out - exact| <= ((1 + (1 - s) (2u|g| + EX2_REL)) (1 + u)^2 (1 + RCP_REL) - 1) |exact|
+ half an ulp, and where s(g) < FLUSHED (g < -86.6) + |exact|: once 1 + 2^t >= 2^126,
rcp.approx.ftz flushes the subnormal sigmoid to 0 (or 2^t overflows): the result is +-0.
The relative L2 error is at most the largest relative term, at the lowest gate that does not
flush (g = ln FLUSHED = -86.6: 2u * 86.6 dominates), plus u for the last rounding: 1.1e-5
(tolerance; typical inputs show ~1e-7: the per-element bound is the tight check).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from ..dtypes import UNIT_ROUNDOFF, half_ulp
from ..hardware_errors import EX2_REL, RCP_REL
from .base import Kind, Param, Traffic
from .families.elementwise import ElementwiseConfig, ElementwiseLaunch

FLUSHED = 2.0**-125  # above the largest sigmoid rcp.approx.ftz flushes to 0 (2^-126), with margin


def sigmoid(gate: np.ndarray) -> np.ndarray:
    """Float64 sigmoid without overflow warnings for very negative gate."""
    e = np.exp(-np.abs(gate))
    return np.where(gate >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def swiglu_error(gate: np.ndarray) -> np.ndarray:
    """Relative error bound of an element before its last rounding (the module's analysis)."""
    u = UNIT_ROUNDOFF["f32"]
    power = (1 - sigmoid(gate)) * (2 * u * np.abs(gate) + EX2_REL)
    return (1 + power) * (1 + u) ** 2 * (1 + RCP_REL) - 1


def silu_mul(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """Float64 gate * sigmoid(gate) * up, without overflow warnings for very negative gate."""
    gate = np.asarray(gate, dtype=np.float64)
    return gate * sigmoid(gate) * np.asarray(up, dtype=np.float64)


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

    def tolerance(self, param: Param) -> float:
        return float(swiglu_error(np.log(FLUSHED))) + UNIT_ROUNDOFF["f32"]

    def error_bound(self, param, arrays, reference, scalars):
        gate = arrays["gate"].astype(np.float64)
        flushed = np.where(sigmoid(gate) < FLUSHED, np.abs(reference), 0.0)
        return swiglu_error(gate) * np.abs(reference) + half_ulp(reference, "f32") + flushed

    def traffic(self, scalars) -> Traffic:
        # gate and up read, out written; per element mul, ex2, add, rcp, mul, mul.
        return Traffic(bytes=3 * 4 * self.config.n, flops=6 * self.config.n)

    def torch_peer(self, torch, tensors, scalars):
        """bench's peer: F.silu(gate) * up."""
        gate, up = tensors["gate"], tensors["up"]
        return lambda: torch.nn.functional.silu(gate) * up
