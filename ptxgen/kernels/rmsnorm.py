"""rmsnorm: y[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * gamma, f32 accumulation.

Error analysis (u = 2^-24, the f32 unit roundoff; x and gamma are exact in f32 once loaded):
1. sum of squares: each thread chains `elements` = chunks * vec fma.rn (one rounding each), the
   warp adds 5 partial sums (butterfly), a CTA of W warps adds its W warp sums in order (W - 1
   more). Every term is >= 0, so the relative error is at most gamma(chain), gamma(k) =
   k u / (1 - k u), chain = elements + 5 + W - 1 (W = 1 with one warp per row).
2. mean: a multiplication by the exact 1/n for n a power of two, else div.rn (one rounding);
   + eps: one rounding. m + eps >= m, so its relative error v <= gamma(chain + [n not 2^k] + 1)
   (squares below f32's normal range are lost, at most n 2^-149 against eps).
3. rsqrt.approx: relative RSQRT_REL (1.2e-7, measured on an H100); the input's v becomes at most
   v / (2 (1 - v)): inv_rms within (1 + v / (2 (1 - v))) (1 + RSQRT_REL) - 1.
4. y = (x * inv_rms) * gamma: two mul.rn (u each); the last is y's rounding for f32, and for
   f16/bf16 the store's cvt.rn rounds once more, to half an ulp of dtype.
So every element obeys |y - y_exact| <= f32_error * |y_exact| + half an ulp of dtype at |y_exact|
(error_bound: a rounding moves a value by at most half an ulp of its own binade, also across a
binade edge), f32_error being everything before the last rounding (about 1e-6 for the longest
chains). The relative L2 error is then at most f32_error + the unit roundoff of dtype (half an
ulp is at most u_dtype |y|): 1.0 u for f16/bf16 outputs, where a kernel exact to half an ulp
shows about 0.39 u (values with Benford-distributed mantissas), so within 3x of that.
The bound needs a finite f32 sum of squares (sum x^2 < 3.4e38: every |x| below about 1.8e19 /
sqrt(n)); past it the sum is inf, inv_rms 0 and y 0, as in llama.cpp's and torch's f32 rmsnorm.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field, field_validator

from ..dtypes import DTYPES, UNIT_ROUNDOFF, from_float, half_ulp, to_float64
from ..abi import scalar
from ..hardware_errors import RSQRT_REL
from .base import Geometry, Kind, Param, PdlConfig, Traffic, ceil_div, round_up

FloatDType = Literal["f32", "f16", "bf16"]
MAX_ROWS = 2**31 - 1  # grid.x limit
MAX_CHUNKS = 16  # vectors each thread keeps in registers
ROWS_PER_WARP_CTA = 8  # rows (warps) per CTA when one warp serves a row


def vector_width(length: int, size: int) -> int:
    """Elements per load: the widest 16/8/4-byte vector that tiles the row, else scalars."""
    for width_bytes in (16, 8, 4):
        width = width_bytes // size
        if width >= 1 and length % width == 0:
            return width
    return 1


def row_plan(length: int, size: int) -> dict:
    """Threads per row, vector width and vectors per thread for one row of `length`."""
    vec = vector_width(length, size)
    units = length // vec
    if units <= 32 * 4:  # short rows: one warp per row, shuffles only
        return {"vec": vec, "row_threads": 32, "chunks": ceil_div(units, 32), "warp_per_row": True}
    row_threads = min(1024, round_up(ceil_div(units, 4), 32))
    return {"vec": vec, "row_threads": row_threads, "chunks": ceil_div(units, row_threads), "warp_per_row": False}


def rms_normalize(x: np.ndarray, gamma: np.ndarray, eps: float) -> np.ndarray:
    """Float64 RMSNorm over the last axis."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * gamma


class RmsnormConfig(PdlConfig):
    kind: Literal["rmsnorm"]
    dtype: FloatDType = "f32"
    hidden: int = Field(ge=1)
    eps: float = Field(default=1e-6, gt=0, lt=1)

    @field_validator("hidden")
    @classmethod
    def fits_registers(cls, hidden: int, info) -> int:
        check_row_length(hidden, info.data.get("dtype", "f32"))
        return hidden


def check_row_length(length: int, dtype: str) -> None:
    plan = row_plan(length, DTYPES[dtype].size)
    if plan["chunks"] > MAX_CHUNKS:
        raise ValueError(
            f"expected a row of at most {1024 * MAX_CHUNKS * plan['vec']} {dtype} elements "
            f"for this length's alignment, got {length}"
        )


class Rmsnorm(Kind):
    name = "rmsnorm"
    Config = RmsnormConfig

    # How this kind's config maps onto rows (per_head_rmsnorm overrides these four).
    count_name = "rows"

    @property
    def row_length(self) -> int:
        return self.config.hidden

    @property
    def rows_per_count(self) -> int:
        return 1

    def params(self) -> list[Param]:
        dtype = self.config.dtype
        return [
            Param("x", dtype, (self.count_name, self.row_length)),
            Param("gamma", dtype, (self.row_length,)),
            Param("y", dtype, (self.count_name, self.row_length), "out"),
            Param(self.count_name, "u32", role="scalar"),
        ]

    # --- geometry --------------------------------------------------------------------------
    @property
    def plan(self) -> dict:
        return row_plan(self.row_length, DTYPES[self.config.dtype].size)

    @property
    def threads(self) -> int:
        plan = self.plan
        return 32 * ROWS_PER_WARP_CTA if plan["warp_per_row"] else plan["row_threads"]

    def geometry(self) -> Geometry:
        rows = scalar(self.count_name) * self.rows_per_count
        per_cta = ROWS_PER_WARP_CTA if self.plan["warp_per_row"] else 1
        return Geometry(grid=(ceil_div(rows, per_cta), 1, 1), block=(self.threads, 1, 1))

    def launch_note(self) -> str:
        return "one warp per row" if self.plan["warp_per_row"] else "one CTA per row"

    def static_shared(self) -> int:
        return 0 if self.plan["warp_per_row"] else 4 * (self.threads // 32)

    def template_vars(self) -> dict:
        return {
            **self.plan,
            "dtype": self.config.dtype,
            "hidden": self.row_length,
            "eps": self.config.eps,
            "threads": self.threads,
            "count_param": self.count_name,
            "rows_per_count": self.rows_per_count,
        }

    # --- runtime -----------------------------------------------------------------------------
    def scalar_limits(self) -> dict[str, tuple[int, int]]:
        return {self.count_name: (0, MAX_ROWS // self.rows_per_count)}

    def example_scalars(self) -> dict[str, int]:
        return {self.count_name: 1}

    def verify_scalars(self) -> list[dict[str, int]]:
        return [{self.count_name: 1}, {self.count_name: 3}]

    def sample_inputs(self, rng, scalars):
        """Rows in turn: Gaussian (mean 0.5), tiny (mean(x^2) = 1.25 eps, where eps counts as much
        as the row), all zeros (y must be 0, not NaN) and Gaussian again; gamma near 1."""
        dtype = self.config.dtype
        shape = self.param("x").concrete_shape(scalars)
        x = (rng.standard_normal(shape) + 0.5).reshape(-1, self.row_length)
        x *= np.resize([1.0, np.sqrt(self.config.eps), 0.0, 1.0], len(x))[:, None]
        gamma = 1.0 + 0.25 * rng.standard_normal(self.row_length)
        return {"x": from_float(x.reshape(shape), dtype), "gamma": from_float(gamma, dtype)}

    def reference(self, arrays, scalars):
        dtype = self.config.dtype
        y = rms_normalize(to_float64(arrays["x"], dtype), to_float64(arrays["gamma"], dtype), self.config.eps)
        return {"y": y}

    def f32_error(self) -> float:
        """Relative error of y's f32 value before its last rounding (the module's analysis)."""
        plan, u = self.plan, UNIT_ROUNDOFF["f32"]
        warps = 1 if plan["warp_per_row"] else plan["row_threads"] // 32
        roundings = plan["chunks"] * plan["vec"] + 5 + (warps - 1) + (self.row_length.bit_count() != 1) + 1
        v = roundings * u / (1 - roundings * u)
        multiplies = 1 if self.config.dtype == "f32" else 2
        return (1 + v / (2 * (1 - v))) * (1 + RSQRT_REL) * (1 + u) ** multiplies - 1

    def tolerance(self, param: Param) -> float:
        return self.f32_error() + UNIT_ROUNDOFF[param.dtype]

    def error_bound(self, param, arrays, reference, scalars):
        return self.f32_error() * np.abs(reference) + half_ulp(reference, param.dtype)

    def traffic(self, scalars) -> Traffic:
        elements = scalars[self.count_name] * self.rows_per_count * self.row_length
        size = DTYPES[self.config.dtype].size
        return Traffic(bytes=(2 * elements + self.row_length) * size, flops=4 * elements)

    def torch_peer(self, torch, tensors, scalars):
        """bench's peers: the usual torch expression, and F.rms_norm where torch has it."""
        x, gamma, eps = tensors["x"], tensors["gamma"], self.config.eps

        def expression():
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * gamma.float()).to(x.dtype)

        peers = {"torch": expression}
        if hasattr(torch.nn.functional, "rms_norm"):
            peers["torch rms_norm"] = lambda: torch.nn.functional.rms_norm(x, (x.shape[-1],), gamma, eps)
        return peers
