"""q4k_gemv: y = dequant(w) @ x for GGML Q4_K rows (decode GEMV at batch 1, bandwidth bound).

Geometry (see `Q4kPlan`): a CTA of `warps` warps; each warp owns `rows_per_warp` consecutive
rows and walks them together, so every x value it takes from shared memory serves all of
them. In one warp *step* the 32 lanes cover four consecutive 144-byte blocks of each row:
lane L takes block 4*step + L/8 and, in it, the 16-byte piece u = L%8 of the 128 quant bytes
(one `ld.global.nc.v4.u32`, 32 weights) plus the block's 16-byte header (d, dmin, 12 scale
bytes; the eight lanes of a block load the same address, one broadcast transaction). The
weights of a row are therefore read once, in 16-byte coalesced loads. `unroll` steps of
loads (2 * rows_per_warp * unroll vectors a lane) are issued before the first is used; the
first batch is issued before x is staged so the weight latency overlaps the staging.
Defaults: 2 rows a warp and 2 steps (n >= 2048), else 1 row and 4 steps (more warps for
mid-sized n); 8 warps a CTA, or 4 where that leaves fewer than 128 CTAs; registers capped
at 128 (two 256-thread CTAs an SM).

x is staged once per CTA in dynamic shared memory (4.25*k bytes: 68 KB at k = 16384, within
every target's opt-in limit), permuted so that lane u's 32 values of a block sit in eight
16-byte slots read conflict-free by the eight lanes of a block, together with the sum of
each lane's two 16-value halves (needed for the min term). The fused kind stages x*gamma and
sums x^2 in the same pass; its RMS factor multiplies each finished row.

Dequantisation is `w = d*sc*q - dmin*m`. A 4-bit code q becomes the f32 1 + q/16 with one
`prmt` (the nibble lands in mantissa bits 19..22 under the exponent of 1.0), so a half
sub-block costs one fma per weight: sum((1+q/16) x) - sum(x) = sum(q x)/16. Scales and mins
are decoded with shifts, masks and one select per lane; nothing divides. About 4 issued
instructions per weight in all (SASS of the sm_90 loop), well under what the memory rate needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import Field, field_validator

from ..q4k import BLOCK_BYTES, BLOCK_WEIGHTS, dequantize_f64, random_weights, row_bytes
from .base import Geometry, Kind, KernelConfig, Param, Traffic, ceil_div

MAX_N = 2**31 - 1
BLOCKS_PER_STEP = 4  # 32 lanes / 8 lanes per block
STAGE_UNITS = 2  # 16-value x units each thread stages per round (4 vector loads each in flight)
# Rows per CTA is warps * rows_per_warp; below this many CTAs the auto geometry halves warps
# so that a mid-sized n (e.g. 1024 K/V rows) still spreads over an H100's 132 SMs.
MIN_CTAS = 128
SMALL_N = 2048
# Register cap: 16 warps per SM (2 CTAs of 256 threads) keep enough loads in flight; without a
# cap ptxas hoists every shared load of an unrolled trip and takes ~240 registers.
MAX_REGISTERS = 128
# Row-steps (32 weights + header, 8 registers) a lane has in flight: beyond 4 ptxas spills.
MAX_ROW_STEPS = 4


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


@dataclass(frozen=True)
class Q4kPlan:
    n: int
    k: int
    warps: int
    rows_per_warp: int
    unroll: int

    @classmethod
    def of(cls, config) -> Q4kPlan:
        n, steps = config.n, ceil_div(config.k // BLOCK_WEIGHTS, BLOCKS_PER_STEP)
        rows_per_warp, unroll = config.rows_per_warp, config.unroll
        if rows_per_warp is None:
            # Two rows a warp halve the shared-memory reads of x per weight, but below ~2048
            # rows a warp per row keeps more warps (and, with unroll 4, as many loads) in flight.
            rows_per_warp = 2 if n >= SMALL_N else 1
            if unroll is not None:
                rows_per_warp = min(rows_per_warp, MAX_ROW_STEPS // unroll)
        rows_per_warp = min(rows_per_warp, n)
        if unroll is None:
            unroll = MAX_ROW_STEPS // rows_per_warp
        warps = config.warps
        if warps is None:
            warps = 8 if ceil_div(n, 8 * rows_per_warp) >= MIN_CTAS else 4
            warps = min(warps, ceil_div(n, rows_per_warp))
        return cls(n, config.k, warps, rows_per_warp, min(unroll, steps))

    @property
    def blocks(self) -> int:
        return self.k // BLOCK_WEIGHTS

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def rows_per_cta(self) -> int:
        return self.warps * self.rows_per_warp

    @property
    def ctas(self) -> int:
        return ceil_div(self.n, self.rows_per_cta)

    @property
    def steps(self) -> int:
        return ceil_div(self.blocks, BLOCKS_PER_STEP)

    @property
    def main_trips(self) -> int:
        """Loop trips of `unroll` steps in which every lane has a block."""
        return self.blocks // BLOCKS_PER_STEP // self.unroll

    @property
    def tail_steps(self) -> int:
        """Steps after the loop; the last of them is partial when blocks % 4 != 0."""
        return self.steps - self.main_trips * self.unroll

    @property
    def shared_bytes(self) -> int:
        # x (f32, permuted) + one f32 sum per 16 values.
        return 4 * self.k + 4 * (self.k // 16)

    @property
    def units(self) -> int:
        """Staging units: 16 consecutive x values, the ones one lane uses for one sub-block."""
        return self.k // 16

    @property
    def units_per_thread(self) -> int:
        return ceil_div(self.units, self.threads)

    @property
    def stage_group(self) -> int:
        return min(STAGE_UNITS, self.units_per_thread)

    @property
    def stage_rounds(self) -> int:
        return ceil_div(self.units_per_thread, self.stage_group)

    def template_vars(self) -> dict:
        return {
            "n": self.n,
            "k": self.k,
            "blocks": self.blocks,
            "row_bytes": row_bytes(self.k),
            "warps": self.warps,
            "max_registers": MAX_REGISTERS,
            "threads": self.threads,
            "rows": self.rows_per_warp,
            "unroll": self.unroll,
            "main_trips": self.main_trips,
            "tail_steps": self.tail_steps,
            "partial_blocks": self.blocks % BLOCKS_PER_STEP,
            "xs_offset": 4 * self.k,
            "units": self.units,
            "stage_group": self.stage_group,
            "stage_rounds": self.stage_rounds,
            "stage_guard": self.stage_rounds * self.stage_group * self.threads > self.units,
        }


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
        plan = self.plan.template_vars()
        return {**plan, "plan": plan, "fused": self.fused, "eps": getattr(self.config, "eps", 0.0)}

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
        """bench's peer: dequantize with torch ops, then a matrix-vector product (both timed)."""
        w, c = tensors["w"], self.config
        return lambda: torch_dequantize(torch, w, c.n, c.k) @ self.torch_activations(torch, tensors)


def torch_dequantize(torch, w, n: int, k: int):
    """Q4_K rows (a uint8 [n, k/256*144] CUDA tensor) to float32 [n, k] with torch ops (bench's peer)."""
    blocks = w.view(n, k // 256, 144)
    d = blocks[..., 0:2].contiguous().view(torch.float16).float()  # [n, blocks, 1]
    dmin = blocks[..., 2:4].contiguous().view(torch.float16).float()
    s = blocks[..., 4:16].int()
    scales = torch.cat((s[..., 0:4] & 63, (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)), dim=-1)  # j = 0..7
    mins = torch.cat((s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)), dim=-1)
    qs = blocks[..., 16:].int().view(n, k // 256, 4, 32)  # chunk c, byte l
    q = torch.stack((qs & 15, qs >> 4), dim=3).view(n, k // 256, 8, 32)  # sub-block j = 2c + (high nibble)
    return (d[..., None] * scales[..., None] * q - dmin[..., None] * mins[..., None]).view(n, k)
