"""swiglu: out = gate * sigmoid(gate) * up, elementwise over f32[n].

Memory-bound: every thread moves 16-byte vectors (4 elements of gate, up and out), the n % 4
leftover elements are done by scalar loads in the first CTA. sigmoid(g) = 1 / (1 + 2^(-g log2 e))
with ex2.approx / rcp.approx: for g -> -inf the power overflows to +inf and the result is -0
(the true value is below f32's smallest subnormal from g < -104), for g -> +inf it underflows
to 0 and sigmoid is exactly 1. Error about 1e-6 relative per element (f32 rounding of the
exponent argument, ex2.approx 2^-22, rcp.approx 1 ulp).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from .base import Kind, KernelConfig, Launch, Param, Traffic, ceil_div, round_up

MAX_N = 2**30
VEC = 4  # f32 elements per 16-byte vector
SMALL_UNITS = 2**18  # up to here: 128-thread CTAs, one vector per thread (spread over many SMs)


def swiglu_plan(n: int) -> dict:
    units, tail = divmod(n, VEC)
    if units <= SMALL_UNITS:
        threads, per_thread = min(128, round_up(max(units, tail), 32)), 1
    else:  # large n: fewer, fuller CTAs with 4 independent vectors in flight per thread
        threads, per_thread = 256, 4
    grid = max(1, ceil_div(units, threads * per_thread))
    return {"units": units, "tail": tail, "threads": threads, "per_thread": per_thread, "grid": grid}


def silu_mul(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """Float64 gate * sigmoid(gate) * up, without overflow warnings for very negative gate."""
    gate = np.asarray(gate, dtype=np.float64)
    up = np.asarray(up, dtype=np.float64)
    e = np.exp(-np.abs(gate))
    sigmoid = np.where(gate >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
    return gate * sigmoid * up


class SwigluConfig(KernelConfig):
    kind: Literal["swiglu"]
    n: int = Field(ge=1, le=MAX_N)


class Swiglu(Kind):
    name = "swiglu"
    Config = SwigluConfig

    def params(self) -> list[Param]:
        n = self.config.n
        return [Param("gate", "f32", (n,)), Param("up", "f32", (n,)), Param("out", "f32", (n,), "out")]

    @property
    def plan(self) -> dict:
        return swiglu_plan(self.config.n)

    def launch(self, scalars: dict[str, int]) -> Launch:
        plan = self.plan
        return Launch(grid=(plan["grid"], 1, 1), block=(plan["threads"], 1, 1))

    def launch_rule(self) -> str:
        plan = self.plan
        return (f"grid=({plan['grid']},1,1) block=({plan['threads']},1,1): {plan['per_thread']} 16-byte vector(s) "
                f"per thread, {plan['tail']} scalar tail element(s) in CTA 0")

    def template_vars(self) -> dict:
        return {**self.plan, "n": self.config.n}

    def scalar_limits(self) -> dict[str, tuple[int, int]]:
        return {}

    def example_scalars(self) -> dict[str, int]:
        return {}

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
