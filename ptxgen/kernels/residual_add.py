"""residual_add: x += y over f32[n] (llama.cpp's ADD), the residual connection of a decoder layer.

A ptxgen addition beyond ../shared/KERNELS.md, for running a decoder step as separate launches.

Contract:
- Config: `n` (int, 1..2^30).
- Params, in order: `x` f32[n] (inout: x += y), `y` f32[n] (in).
- Semantics: x[i] = x[i] + y[i], one f32 add rounded to nearest even.

Memory-bound: the launch plan and PTX skeleton shared with swiglu (ptxgen/kernels/families/elementwise.py):
16-byte vectors of x and y, 4 of them in flight per thread for large n, an n % 4 scalar tail in
CTA 0. x is read with plain loads (not .nc): this launch writes it.

Error: one add.rn.f32 of two f32 values: each element within half an ulp of f32 of the exact sum
(error_bound), so the relative L2 error is at most 2^-24, the f32 unit roundoff (tolerance).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from ..dtypes import UNIT_ROUNDOFF, half_ulp
from .base import Kind, Param, Traffic
from .families.elementwise import ElementwiseConfig, ElementwiseLaunch


class ResidualAddConfig(ElementwiseConfig):
    kind: Literal["residual_add"]


class ResidualAdd(ElementwiseLaunch, Kind):
    name = "residual_add"
    Config = ResidualAddConfig

    def params(self) -> list[Param]:
        n = self.config.n
        return [Param("x", "f32", (n,), "inout"), Param("y", "f32", (n,))]

    def sample_inputs(self, rng, scalars):
        n = self.config.n
        return {"x": rng.standard_normal(n).astype(np.float32),
                "y": (0.5 * rng.standard_normal(n) + 0.125).astype(np.float32)}

    def reference(self, arrays, scalars):
        return {"x": arrays["x"].astype(np.float64) + arrays["y"].astype(np.float64)}

    def tolerance(self, param: Param) -> float:
        return UNIT_ROUNDOFF["f32"]

    def error_bound(self, param, arrays, reference, scalars):
        return half_ulp(reference, "f32")

    def traffic(self, scalars) -> Traffic:
        # x and y read, x written; one add per element.
        return Traffic(bytes=3 * 4 * self.config.n, flops=self.config.n)

    def torch_peer(self, torch, tensors, scalars):
        """bench's peer: x + y (out of place: timing runs repeat, so x must keep its value)."""
        x, y = tensors["x"], tensors["y"]
        return lambda: x + y
