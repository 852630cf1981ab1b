"""The Q4_K GEMV family (q4k_gemv, fused_rmsnorm_q4k_gemv, persistent_decoder's GEMV phases):
y = dequant(w) @ x for GGML Q4_K rows at batch 1, bandwidth bound. The PTX is the macros of
templates/families/q4k.ptx.j2; `Q4kPlan` is what they take.

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
mid-sized n); 8 warps a CTA, or 4 where that leaves fewer than 128 CTAs.

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

from ...q4k import BLOCK_WEIGHTS, row_bytes
from ..base import ceil_div

BLOCKS_PER_STEP = 4  # 32 lanes / 8 lanes per block
STAGE_UNITS = 2  # 16-value x units each thread stages per round (4 vector loads each in flight)
# Rows per CTA is warps * rows_per_warp; below this many CTAs the auto geometry halves warps
# so that a mid-sized n (e.g. 1024 K/V rows) still spreads over an H100's 132 SMs.
MIN_CTAS = 128
SMALL_N = 2048
# Row-steps (32 weights + header, 8 registers) a lane has in flight: beyond 4 ptxas spills
# (at q4k_gemv's 128-register cap).
MAX_ROW_STEPS = 4


@dataclass(frozen=True)
class Q4kPlan:
    n: int
    k: int
    warps: int
    rows_per_warp: int
    unroll: int

    @classmethod
    def of(cls, config) -> Q4kPlan:
        """The geometry of a q4k_gemv config: its tuning fields, or the defaults above."""
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
    def row_bytes(self) -> int:
        return row_bytes(self.k)

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
    def partial_blocks(self) -> int:
        """Blocks of the last step when it is partial (lanes of the other blocks idle), else 0."""
        return self.blocks % BLOCKS_PER_STEP

    @property
    def shared_bytes(self) -> int:
        # x (f32, permuted) + one f32 sum per 16 values.
        return self.xs_offset + 4 * (self.k // 16)

    @property
    def xs_offset(self) -> int:
        """Byte offset of the half sums in the staged x."""
        return 4 * self.k

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

    @property
    def stage_guard(self) -> bool:
        """Whether the last staging round has units past the end."""
        return self.stage_rounds * self.stage_group * self.threads > self.units
