"""q4k_gemv: y = dequant(w) @ x for GGML Q4_K rows (decode GEMV at batch 1, bandwidth bound).

The kernel is the Q4_K family's (geometry, defaults and the dequantisation trick in
ptxgen/kernels/families/q4k.py, its macros in templates/families/q4k.ptx.j2) under a
128-register cap: two 256-thread CTAs an SM.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field, field_validator

from ..q4k import BLOCK_BYTES, BLOCK_WEIGHTS, dequantize_f64, random_weights, row_bytes
from .base import Geometry, Kind, KernelConfig, Param, Traffic
from .families.q4k import MAX_ROW_STEPS, Q4kPlan

MAX_N = 2**31 - 1
# Register cap: 16 warps per SM (2 CTAs of 256 threads) keep enough loads in flight; without a
# cap ptxas hoists every shared load of an unrolled trip and takes ~240 registers.
MAX_REGISTERS = 128


def check_k(k: int) -> int:
    if k < BLOCK_WEIGHTS or k % BLOCK_WEIGHTS:
        raise ValueError(f"expected a multiple of {BLOCK_WEIGHTS} (Q4_K block) of at least {BLOCK_WEIGHTS}, got {k}")
    return k


class Q4kGemvConfig(KernelConfig):
    kind: Literal["q4k_gemv"]
    k: int
    n: int = Field(ge=1, le=MAX_N)
    # Optional tuning; None picks from n and k (see Q4kPlan).
    warps: int | None = Field(default=None, ge=1, le=16)
    rows_per_warp: int | None = Field(default=None, ge=1, le=4)
    unroll: int | None = Field(default=None, ge=1, le=4)

    @field_validator("k")
    @classmethod
    def k_is_blocks(cls, k: int) -> int:
        return check_k(k)

    @field_validator("unroll")
    @classmethod
    def fits_registers(cls, unroll: int | None, info) -> int | None:
        rows = info.data.get("rows_per_warp") or 1
        if unroll is not None and rows * unroll > MAX_ROW_STEPS:
            raise ValueError(f"expected rows_per_warp * unroll <= {MAX_ROW_STEPS} (weight vectors each lane keeps "
                             f"in flight within {MAX_REGISTERS} registers), got {rows} * {unroll}")
        return unroll


def q4k_param(name: str, n: int, k: int) -> Param:
    """A Q4_K weight matrix parameter: u8[n, (k/256)*144], loadable from a GGUF tensor."""
    return Param(name, "u8", (n, row_bytes(k)), layout="q4_k")


class Q4kGemv(Kind):
    name = "q4k_gemv"
    Config = Q4kGemvConfig
    fused = False

    @property
    def plan(self) -> Q4kPlan:
        return Q4kPlan.of(self.config)

    def params(self) -> list[Param]:
        c = self.config
        return [
            Param("y", "f32", (c.n,), "out"),
            q4k_param("w", c.n, c.k),
            Param("x", "f32", (c.k,)),
        ]

    # --- geometry --------------------------------------------------------------------------
    def geometry(self) -> Geometry:
        plan = self.plan
        return Geometry(grid=(plan.ctas, 1, 1), block=(plan.threads, 1, 1), dynamic_shared=plan.shared_bytes)

    def launch_note(self) -> str:
        p = self.plan
        return (f"{p.rows_per_cta} rows per CTA, {p.rows_per_warp} per warp; a warp step covers 4 blocks of "
                f"each of its rows (8 lanes x 16 B per block), {p.unroll} steps of loads in flight")

    def static_shared(self) -> int:
        return 4 * self.plan.warps if self.fused and self.plan.warps > 1 else 0

    def template_vars(self) -> dict:
        return {"plan": self.plan, "max_registers": MAX_REGISTERS, "fused": self.fused,
                "eps": getattr(self.config, "eps", 0.0)}

    # --- runtime -----------------------------------------------------------------------------
    def scalar_limits(self) -> dict[str, tuple[int, int]]:
        return {}

    def example_scalars(self) -> dict[str, int]:
        return {}

    def sample_inputs(self, rng, scalars):
        c = self.config
        return {"w": random_weights(rng, c.n, c.k), "x": (rng.standard_normal(c.k) + 0.25).astype(np.float32)}

    def activations(self, arrays) -> np.ndarray:
        return arrays["x"].astype(np.float64)

    def reference(self, arrays, scalars):
        return {"y": dequantize_f64(arrays["w"]) @ self.activations(arrays)}

    def traffic(self, scalars) -> Traffic:
        c = self.config
        vectors = 2 if self.fused else 1  # x (and gamma)
        return Traffic(bytes=c.n * (c.k // BLOCK_WEIGHTS) * BLOCK_BYTES + 4 * c.k * vectors + 4 * c.n,
                       flops=2 * c.n * c.k)

    def torch_activations(self, torch, tensors):
        """The vector the weights multiply, in torch (the fused kind normalises it first)."""
        return tensors["x"]

    def torch_peer(self, torch, tensors, scalars):
        """bench's peers: torch's int4 GEMV and a bf16 cuBLAS GEMV over the same weights (ptxgen.peers)."""
        from ..peers import q4k_gemv_peers

        return q4k_gemv_peers(torch, tensors["w"], self.config.n, self.config.k,
                              lambda: self.torch_activations(torch, tensors))
