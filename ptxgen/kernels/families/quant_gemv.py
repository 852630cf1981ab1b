"""The quantised GEMV family (q4k_gemv, fused_rmsnorm_q4k_gemv, the grouped kinds,
persistent_decoder's GEMV phases, q6k_gemv, q8_0_gemv): y = dequant(w) @ x for GGML Q4_K, Q6_K or
Q8_0 rows at batch 1, bandwidth bound. The PTX is the macros of
templates/families/quant_gemv.ptx.j2; `QuantGemvPlan` is what they take, its `quant` the weight
type. Everything below holds for every type but a lane's loads and block dot product and the
records of x scales they read (GemvFormat, FORMATS; the Q6_K and Q8_0 kinds' docstrings); what is
said of blocks and quant bytes is Q4_K's.

x is quantised once per CTA (x is k floats, the weights n*k*0.56 bytes: every CTA reading x from
L2 costs nothing) into shared memory, as llama.cpp's Q8_1 path does: blocks of 32 values, each
with an f32 scale dx = max|v| / 127 and q = rint(v * 127 / max|v|) as int8 (one fma: adding
1.5 * 2^23 leaves the rounded integer, two's complement, in the low byte of the f32; 127 / max|v|
by div.rn's fast path written out, since ptxas spills around the call of its slow path), plus the
block's s = dx * sum(q) for the min term (staged negated: one accumulator takes both terms).
The product is then exact integer arithmetic on 4-bit codes and int8 values: for a word w of
quant bytes, `dp4a(w & 0x0F0F0F0F, x4)` is the low nibbles' dot and `dp4a(w & 0xF0F0F0F0, x4)`
16 times the high nibbles' (the 1/16 is folded into the staged scale of those blocks), so 8
weights cost 4 instructions. Per 32-weight sub-block j:
sum_i w_i xq_i = d * sc_j * dx_j * dot_j - dmin * m_j * s_j (xq_i = dx_j q_i). What the kernels
compute is therefore dequant(w) @ xq, xq the int8 quantisation of x; `quantize_x` reproduces it
bit for bit and the kinds' references use it (error against the unquantised product: see
q4k_gemv's docstring).

Geometry: every type gives lane L of a warp weights 64L .. 64L+63 of a 2048-weight step. Q4_K: a
lane takes one 64-weight chunk c (32 quant bytes: sub-blocks 2c and 2c+1 whole) of a
block, so its 6-bit scale/min decode (7 instructions for both sub-blocks' scales and mins) and the
f16 d/dmin serve 64 weights; 4 lanes a block, 8 blocks (1152 bytes) a warp *step*. Per step a lane
loads its 32 quant bytes (two 16-byte loads; each instruction uses half of every 32-byte sector,
the other half is the next instruction's, so the weights go through L1 and are fetched once) and
the block's 16-byte header (the 4 lanes of a block share the address). A warp runs a *sequence* of
row-steps (items): `rows_per_warp` consecutive rows x the steps of its part of k (`split_k` warps
share a row, each over a contiguous range of steps, their sums added in shared memory in a fixed
order). The sequence is a loop over its rows whose body (all of them when they make at most
MAX_ROW_STEPS row-steps, else the few rows that make the slots line up) is unrolled, with
`unroll` register slots rotating: the loads of item i+unroll are issued as soon as item i is
computed, so a lane always has unroll-1 .. unroll items (48 bytes each) in flight; the first
`unroll` go out before x is staged. Bounded bodies keep ptxas from hoisting more loads than the
64 registers hold (unrolled whole, long sequences spilled). A row's lane parts are summed after
the loop (through shared memory: lane r ends with row r's sum, and one store writes the warp's
rows).

Schedules. A *unit* is rows_per_cta = (warps / split_k) * rows_per_warp consecutive rows of one
matrix (a matrix's last unit clamps its groups' rows to the matrix, and stores only its own).
- static: a CTA a unit. Defaults aim at one wave of an H100 at 64 registers a thread (132 SMs x
  32 warps): split-K until there are enough warps (parts of at most MAX_ROW_STEPS steps, even when
  possible), rows per warp to fill the wave (at most DEFAULT_MAX_ROWS), and the largest CTA (up to
  32 warps) that still gives >= MIN_CTAS CTAs, since each CTA quantises all of x once (fewer,
  larger CTAs quantise it fewer times), and at least enough warps to quantise x in one round
  where 32 warps can (k <= 16384); a warp group left without rows only helps with that.
- queue: a persistent grid (ctas_per_sm CTAs on each of sm_count SMs) stages x once per CTA, then
  runs rounds of one unit each: CTA c's first unit is c, the others come from a work counter in
  the `queue` workspace (units grid, grid+1, ...), so CTAs on SMs that get their bytes sooner take
  more units. A one-wave static grid leaves that imbalance as idle SMs: Nsight Compute on the H100
  (12288 x 4096, 128 CTAs) saw SMs active 17,203 of 23,472 cycles. A unit is QUEUE_ROW_STEPS
  row-steps a warp (its loads are all in flight when its round starts), so whatever is left when
  the counter runs dry is already on its way; a CTA holds two units ahead (one computing, the
  next loading) plus the ticket being taken (at a round's end with late_grab, else its start).
  The loads of the next unit go out during a round, so its ticket is read from shared memory
  there (published by the previous round's bar.sync); the lane sums of a round go to shared
  memory and the first threads (one a row) sum them at the start of the next (no shuffles or
  warp barriers in the loop: nvJitLink turns those into a call-based fallback on sm_8x). The last
  CTA to finish puts the counter back to 0 (acq_rel count of finished CTAs), so a CUDA graph
  replays without re-zeroing; the launch is right on any grid. The default schedule queues
  where the grid gets at least the type's min_queue_rounds units a CTA (Q4_K 4, measured).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ...q4k import BLOCK_WEIGHTS
from ...quants import QUANT_TYPES
from ..base import SM_COUNT, ceil_div

LANE_WEIGHTS = 64  # a lane's part of a step, whatever the type (its x: two groups of 32)
STEP_WEIGHTS = 32 * LANE_WEIGHTS  # 2048 weights a warp step
LANES_PER_BLOCK = BLOCK_WEIGHTS // LANE_WEIGHTS  # Q4_K: a lane takes one 64-weight chunk (32 quant bytes)
STEP_BLOCKS = 32 // LANES_PER_BLOCK  # Q4_K blocks a warp step covers
X_GROUP = 32  # values per x scale (llama.cpp's Q8_1 block)
STAGE_VALUES = 16  # x values one thread quantises (two threads a scale group, one shuffle apart)
# Staged x per step: the int8 values (4 loads of 16 bytes a lane), then each lane's record of
# scales, 16 bytes a lane in each of the format's record planes (512 bytes a plane), side by
# side so that one pointer register reaches both.
STEP_X_BYTES = STEP_WEIGHTS
RECORD_PLANE_BYTES = 32 * 16
# Row-steps one warp's part of a row may have (its unrolled loop body holds at least a row: ~70
# PTX instructions a row-step); the defaults keep to MAX_ROW_STEPS.
MAX_ITEMS = 32
MAX_ROW_STEPS = 8  # the default split_k keeps a warp's part of a row within this many steps
MAX_ROWS = 32  # rows a warp computes: row r's sum ends in lane r
# The default rows a warp: past one wave, more CTAs cost nothing, while each row takes 128 bytes
# a warp of shared memory for its lane sums (32 warps x 8 rows: 32 KB).
DEFAULT_MAX_ROWS = 8
MAX_K = STEP_WEIGHTS * MAX_ITEMS  # 65536: longer rows would need split-K > 1 always
# The wave the defaults fill: an H100's 132 SMs x 32 resident warps (occupancy 0.5: 64 registers).
RESIDENT_WARPS = SM_COUNT * 32
MIN_CTAS = 128
MAX_WARPS = 32  # 1024 threads: one CTA an SM at 64 registers
MAX_REGISTERS = 64
# x is quantised in rounds of one 16-value unit a thread, unrolled (see q8_stage): at most this many.
MAX_STAGE_ROUNDS = 8
# The queue schedule (see the module docstring). A warp's row-steps of one unit: the loads of a
# whole unit are in flight when its round starts (unroll 2), so when the queue runs dry every
# CTA has at most what it already waits for left to do.
QUEUE_ROW_STEPS = 2
# The default schedule queues when every CTA of the grid can take at least this many units (one
# or two units a CTA leave nothing to balance; Q4_K's own threshold: GemvFormat.min_queue_rounds).
MIN_QUEUE_ROUNDS = 2
# A queued CTA's lane sums of one row: 32 f32 a part, then 16 bytes of padding so that the
# flushing lanes (one row each) read different banks.
ROW_SUMS_PAD = 16


@dataclass(frozen=True)
class GemvFormat:
    """What a weight type changes in the family: its lane's loads and block dot product (the
    template's <type>_load / <type>_item macros), its staged x record, and its f32 roundings.
    Every type gives a lane 64 consecutive weights of a 2048-weight step and x in the same int8
    layout, so the skeleton (staging, rows, schedules, reductions) is one."""

    quant: str  # a QUANT_TYPES name
    min_k: int  # the shortest row (and its multiple): a lane's 64 weights are whole blocks' parts
    record_planes: int  # 16-byte record planes a lane's staged x carries per step (see q8_unit)
    default_unroll: int  # row-steps of loads a lane has in flight (register slots)
    # f32 roundings on the path of a lane's first item's term into its accumulator (item_roundings),
    # and those each later item's accumulation adds (item_adds); see the kinds' error analysis.
    item_roundings: int
    item_adds: int
    # Row-steps of a queued unit (QUEUE_ROW_STEPS) and the most default rows a warp
    # (DEFAULT_MAX_ROWS): Q6_K's 30-register slot spilled with longer unrolled bodies (ptxas
    # hoists the next item's loads into fresh registers), Q8_0's 21 with queued units of 2.
    queue_row_steps: int = 2
    max_default_rows: int = 8
    min_queue_rounds: int = MIN_QUEUE_ROUNDS

    @property
    def block_weights(self) -> int:
        return QUANT_TYPES[self.quant].block_weights

    @property
    def block_bytes(self) -> int:
        return QUANT_TYPES[self.quant].block_bytes

    def row_bytes(self, k: int) -> int:
        return QUANT_TYPES[self.quant].row_bytes(k)


# Q4_K: 4 lanes a block, each a 64-weight chunk (32 quant bytes, two 16-byte loads) and the
# block's 16-byte header; records {dx, -s, dx/16, -s} of its two sub-blocks (gemv_item).
# Q6_K: 4 lanes a block, lane (n, h) = (L/2 % 2, L % 2) the weights l, l+32, l+64, l+96 for
# l = 16h .. 16h+15 of half n (ql bytes 64n+16h.., 64n+32+16h.., qh bytes 32n+16h..: three
# 16-byte pieces), its 4 scales and d; records {dx_j} and {-32 * sum of the x codes_j} of its
# four 16-weight pieces (q6k_item). Q8_0: 2 blocks (68 bytes) a lane; records {dx, dx} of each.
# Q6_K and Q8_0 blocks are only 2-byte aligned (210 and 34 bytes): their macros load each 16-byte
# piece as the aligned 16-byte words around it and shift it into place (unaligned_words).
FORMATS = {
    # Queued only from 4 units a CTA: each round costs the CTA a barrier. On an H100
    # (bench/results/H100-2026-11-27-lease) the queue took 17.25 / 17.79 us at 12288 x 4096 /
    # 4096 x 12288 (2.9 / 3.1 units a CTA) against the static schedule's 15.74 / 16.16, and Nsight
    # Compute saw its warps at that barrier 14.7 of every 34.9 cycles between issues. The fused
    # gate|up group (5.8 units a CTA) queued reached 72% of copy bandwidth, the best of the GEMVs
    # (static not measured there). Q6_K and Q8_0 are not measured on a GPU.
    "q4_k": GemvFormat("q4_k", min_k=256, record_planes=1, default_unroll=2,
                       item_roundings=4, item_adds=2, min_queue_rounds=4),
    "q6_k": GemvFormat("q6_k", min_k=256, record_planes=2, default_unroll=1,
                       item_roundings=5, item_adds=1, queue_row_steps=1, max_default_rows=1),
    "q8_0": GemvFormat("q8_0", min_k=64, record_planes=1, default_unroll=1,
                       item_roundings=3, item_adds=2, queue_row_steps=1),
}


@dataclass(frozen=True)
class Item:
    """One row-step of a warp's sequence: lane loads go to register slot `slot`."""

    row: int  # row of the trip (0 .. rows_per_trip-1)
    step: int  # step within the warp's part of k
    slot: int


@dataclass(frozen=True)
class QuantGemvPlan:
    matrices: tuple[int, ...]  # rows of each matrix (one for q4k_gemv); each has its own units
    k: int
    warps: int
    rows_per_warp: int
    split_k: int
    unroll: int
    # Rows of the unrolled loop body (the rows of a warp are a loop over bodies): see rows_per_trip.
    trip_rows: int = 0
    l1_no_allocate: bool = False
    l2_prefetch: int = 0  # bytes: the .L2::<N>B prefetch hint on weight loads (0: none)
    # The queue schedule: `grid` CTAs take units from a work counter (0: static, a CTA a unit).
    grid: int = 0
    late_grab: bool = False  # queue: the next ticket is taken at the end of a round, not its start
    quant: str = "q4_k"  # the weights' type (FORMATS)

    @classmethod
    def of(cls, config, matrices: tuple[int, ...], quant: str = "q4_k") -> QuantGemvPlan:
        """The geometry of a config (fields k, warps, rows_per_warp, split_k, unroll,
        l1_no_allocate, l2_prefetch, schedule, sm_count, ctas_per_sm, late_grab) over matrices of
        these row counts: its tuning fields, else the defaults described in the module. The
        config's validators have checked the fields against each other (see q4k_gemv.QuantGemvTuning)."""
        if config.schedule != "static":
            queued = cls.queued(config, matrices, quant)
            if config.schedule == "queue" or queued.units >= FORMATS[quant].min_queue_rounds * queued.grid:
                return queued
        n, fmt = sum(matrices), FORMATS[quant]
        steps = ceil_div(config.k, STEP_WEIGHTS)
        split, rows = config.split_k, config.rows_per_warp
        if split is None or rows is None:
            # Parts of at most MAX_ROW_STEPS steps (longer unrolled rows spilled on sm_80); of
            # those, the split and rows whose warps come closest to whole waves (the last wave's
            # idle share is what a wave costs), then a loop body that takes two slots (see
            # below: the one-slot fallback spilled on sm_86), an even part, the fewest parts.
            splits = [split] if split else [p for p in divisors(steps) if steps // p <= MAX_ROW_STEPS
                                            and (config.warps is None or config.warps % p == 0)] or [1]
            pairs = [(p, r) for p in splits for r in ([rows] if rows else sorted({default_rows(n, p, fmt.max_default_rows), 1}))]
            # At most two waves where that can be had; past that the last wave matters little and
            # the most rows a warp (the fewest CTAs: each quantises all of x) win.
            pairs = [pr for pr in pairs if waves(n, *pr) <= 2] or [max(pairs, key=lambda pr: pr[1])]
            split, rows = min(pairs, key=lambda pr: (round(wave_waste(n, *pr), 2), single_slot(steps // pr[0], pr[1]),
                                                     steps // pr[0] % 2, pr[0], -pr[1]))
        part = steps // split
        rows = min(rows, MAX_ROWS, *matrices)  # a warp group past its matrix's end recomputes its last rows
        warps = config.warps
        if warps is None:
            groups = MAX_WARPS // split
            while groups > 1 and ceil_div(ceil_div(n, rows), groups) < MIN_CTAS:
                groups //= 2
            # Enough threads to quantise x in one round where 32 warps can (k <= 16384): more
            # rounds cost a dependent trip to L2 each, and their registers (groups without a row
            # skip the rows).
            staging = ceil_div(ceil_div(config.k, 32 * STAGE_VALUES), split)
            warps = split * min(max(groups, staging), MAX_WARPS // split)
        unroll = min(config.unroll or FORMATS[quant].default_unroll, rows * part)
        # The loop body: all the rows if they make at most MAX_ROW_STEPS row-steps (longer bodies
        # spilled), else the fewest rows whose row-steps are a multiple of unroll (so the slots
        # line up from one trip to the next) if they divide the rows and are few enough, else one
        # row a trip with one slot.
        trip_rows = rows if rows * part <= MAX_ROW_STEPS else unroll // math.gcd(unroll, part)
        if single_slot(part, rows, unroll):
            trip_rows, unroll = 1, 1
        return cls(tuple(matrices), config.k, warps, rows, split, unroll, trip_rows, config.l1_no_allocate,
                   config.l2_prefetch, quant=quant)

    @classmethod
    def queued(cls, config, matrices: tuple[int, ...], quant: str = "q4_k") -> QuantGemvPlan:
        """The queue schedule's geometry: a unit is QUEUE_ROW_STEPS row-steps a warp (split-K and
        rows to make them, unless the config sets them), the largest CTA, and `ctas_per_sm` CTAs
        (default: as many as an SM holds at 64 registers a thread) on each of `sm_count` SMs, or
        fewer if there are fewer units."""
        steps = ceil_div(config.k, STEP_WEIGHTS)
        unit_steps = FORMATS[quant].queue_row_steps
        split = config.split_k or queue_split(steps, config.warps, unit_steps)
        part = steps // split
        rows = min(config.rows_per_warp or max(1, unit_steps // part), MAX_ROWS, *matrices)
        warps = config.warps or MAX_WARPS // split * split
        # The slots must line up from one round to the next: unroll divides the round's row-steps.
        unroll = max(u for u in divisors(rows * part) if u <= (config.unroll or FORMATS[quant].default_unroll))
        plan = cls(tuple(matrices), config.k, warps, rows, split, unroll, rows, config.l1_no_allocate,
                   config.l2_prefetch, late_grab=config.late_grab, quant=quant)
        per_sm = config.ctas_per_sm or max(1, MAX_WARPS // warps)
        return dataclasses.replace(plan, grid=min(plan.units, config.sm_count * per_sm))

    @property
    def queue(self) -> bool:
        return self.grid > 0

    # --- shapes ----------------------------------------------------------------------------
    @property
    def format(self) -> GemvFormat:
        return FORMATS[self.quant]

    @property
    def row_bytes(self) -> int:
        return self.format.row_bytes(self.k)

    @property
    def step_bytes(self) -> int:
        """Weight bytes of a warp step (a row's 2048 weights)."""
        return self.format.row_bytes(STEP_WEIGHTS)

    @property
    def steps(self) -> int:
        return ceil_div(self.k, STEP_WEIGHTS)

    @property
    def part_steps(self) -> int:
        """Steps of one warp's part of a row."""
        return self.steps // self.split_k

    @property
    def partial_lanes(self) -> int:
        """Lanes with weights in a row's last step when it is partial (the others idle), else 0."""
        return self.k % STEP_WEIGHTS // LANE_WEIGHTS

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def groups(self) -> int:
        """Warp groups of a CTA: the split_k warps of a group share rows."""
        return self.warps // self.split_k

    @property
    def rows_per_cta(self) -> int:
        return self.groups * self.rows_per_warp

    @property
    def matrix_units(self) -> tuple[int, ...]:
        """Units (rows_per_cta rows: a CTA's under the static schedule) of each matrix."""
        return tuple(ceil_div(n, self.rows_per_cta) for n in self.matrices)

    @property
    def units(self) -> int:
        return sum(self.matrix_units)

    @property
    def ctas(self) -> int:
        return self.grid or self.units

    # --- the warp's sequence -----------------------------------------------------------------
    @property
    def rows_per_trip(self) -> int:
        """Rows of the unrolled body of the warp's row loop (all its rows when trip_rows is 0)."""
        return self.trip_rows or self.rows_per_warp

    @property
    def trips(self) -> int:
        """Trips of the warp's row loop (under the queue schedule: per unit)."""
        return self.rows_per_warp // self.rows_per_trip

    @cached_property
    def items(self) -> tuple[Item, ...]:
        """The row-steps of one trip, in order."""
        count = self.rows_per_trip * self.part_steps
        return tuple(Item(i // self.part_steps, i % self.part_steps, i % self.unroll) for i in range(count))

    def next_load(self, index: int, chained: bool = False) -> tuple[Item, bool] | None:
        """What is loaded after item `index` of a trip: the item `unroll` further on, and whether
        it is the next trip's; None past the last trip, unless `chained` (the caller's next trip
        follows: the queue's next unit, the persistent decoder's next task)."""
        later = index + self.unroll
        if later < len(self.items):
            return self.items[later], False
        return (self.items[later - len(self.items)], True) if self.trips > 1 or chained else None

    def is_partial(self, item: Item) -> bool:
        """Whether the item is (in the last part) a row's last step with fewer than 32 lanes' weights."""
        return self.partial_lanes > 0 and item.step == self.part_steps - 1

    @property
    def weight_load(self) -> str:
        """The weight loads' opcode: read-only path; optional L1 and L2 hints."""
        hints = (".L1::no_allocate" if self.l1_no_allocate else "") + (
            f".L2::{self.l2_prefetch}B" if self.l2_prefetch else "")
        return f"ld.global.nc{hints}.v4.u32"

    # --- staged x (shared memory) ---------------------------------------------------------------
    @property
    def x_bytes(self) -> int:
        """Staged x, per step stage_step_bytes: the int8 values (load t = 0..3 of lane L at
        512 t + 16 L), then the format's record planes p, 16 bytes a lane (at 2048 + 512 p + 16 L)."""
        return self.steps * self.stage_step_bytes

    @property
    def stage_step_bytes(self) -> int:
        return STEP_X_BYTES + self.format.record_planes * RECORD_PLANE_BYTES

    @property
    def lane_sums_offset(self) -> int:
        """Each lane's part of each of its rows' dot products. Static: [warp][row][lane] f32
        (summed over the warp after its row loop: a shuffle inside a loop makes ptxas add a slow
        path that calls a subroutine, and spill around it). Queue: two buffers (rounds alternate)
        of [row of the unit][part][lane] f32, a row's record row_sums_bytes long."""
        return self.x_bytes

    @property
    def row_sums_bytes(self) -> int:
        return 128 * self.split_k + ROW_SUMS_PAD

    @property
    def partials_offset(self) -> int:
        """Static with split_k: each part's row sums, [row of the CTA][part] f32."""
        return self.lane_sums_offset + 128 * self.warps * self.rows_per_warp

    @property
    def shared_bytes(self) -> int:
        if self.queue:
            return self.lane_sums_offset + 2 * self.rows_per_cta * self.row_sums_bytes
        partials = 4 * self.rows_per_cta * self.split_k if self.split_k > 1 else 0
        return self.partials_offset + partials

    @property
    def sum_roundings(self) -> int:
        """Roundings on a lane's path from its accumulator to the row's sum: static, the 5-level
        shuffle tree and the parts added; queued, 4 chains of 8 * split_k adds (the first a
        copy) and 2 to join them."""
        return 8 * self.split_k + 1 if self.queue else 5 + self.split_k - 1

    @property
    def output_roundings(self) -> int:
        """The most f32 roundings on any term's path into a row's result (the kinds' error
        analysis): the lane's first item (format.item_roundings, its accumulation included),
        format.item_adds for each later item of the warp's part, then sum_roundings."""
        return self.format.item_roundings + self.format.item_adds * (self.part_steps - 1) + self.sum_roundings

    @property
    def stage_units(self) -> int:
        """Staging units of STAGE_VALUES values (half a scale group)."""
        return self.k // STAGE_VALUES

    def stage_rounds(self, threads: int) -> int:
        return ceil_div(self.stage_units, threads)


def default_rows(n: int, split: int, most: int = DEFAULT_MAX_ROWS) -> int:
    """Rows a warp by default: the warps of the rows' parts in about one wave, at most `most`."""
    return max(1, min(round(n * split / RESIDENT_WARPS), most))


def waves(n: int, split: int, rows: int) -> float:
    """Waves of warps of n rows in parts of `split` warps, `rows` a warp."""
    return n * split / rows / RESIDENT_WARPS


def wave_waste(n: int, split: int, rows: int) -> float:
    """Warp slots of the last wave left idle, as a fraction of the waves'."""
    return math.ceil(waves(n, split, rows)) / waves(n, split, rows) - 1


def single_slot(part: int, rows: int, unroll: int = 2) -> bool:
    """Whether a warp's rows need the one-slot loop body: more than MAX_ROW_STEPS row-steps, and
    no few rows whose row-steps are a multiple of `unroll` (and at most MAX_ROW_STEPS) divide them."""
    trip_rows = unroll // math.gcd(unroll, part)
    return rows * part > MAX_ROW_STEPS and (rows % trip_rows > 0 or trip_rows * part > MAX_ROW_STEPS)


def queue_split(steps: int, warps: int | None, unit_steps: int = QUEUE_ROW_STEPS) -> int:
    """The queue's default split-K: the fewest parts of at most `unit_steps` steps (that `warps`
    is a multiple of, when given)."""
    fits = [p for p in divisors(steps) if warps is None or warps % p == 0]
    return next((p for p in fits if steps // p <= unit_steps), fits[-1])


def min_warps(k: int) -> int:
    """Warps a CTA needs to quantise k values of x in MAX_STAGE_ROUNDS rounds."""
    return ceil_div(k // STAGE_VALUES, 32 * MAX_STAGE_ROUNDS)


def divisors(number: int) -> list[int]:
    return [d for d in range(1, number + 1) if number % d == 0]


def quantize_x(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The kernels' int8 quantisation of f32 values v [..., k] (k a multiple of 32), bit for bit:
    per group of 32 with m = max|v|, dx = f32(m * f32(1/127)) and q = rint(v * inv) with
    inv = f32(127 / m) (the product exact, halves to even); a group with m outside
    [2^-100, 2^100] (or NaN) is all zeros with dx = 0. Returns (q int8 [..., k], dx f32 [..., k/32])."""
    v = np.asarray(v, np.float32)
    groups = v.reshape(*v.shape[:-1], -1, X_GROUP)
    amax = np.abs(groups).max(axis=-1)
    normal = (amax >= np.float32(2.0**-100)) & (amax <= np.float32(2.0**100))
    safe = np.where(normal, amax, np.float32(1))
    inverse = np.where(normal, np.float32(127) / safe, np.float32(0)).astype(np.float32)
    scale = np.where(normal, amax * np.float32(1 / 127), np.float32(0)).astype(np.float32)
    q = np.rint(groups.astype(np.float64) * inverse[..., None].astype(np.float64))
    return q.astype(np.int8).reshape(v.shape), scale


def dequantize_x(v: np.ndarray) -> np.ndarray:
    """xq = dx * q in float64: the vector the kernels multiply the weights by."""
    q, scale = quantize_x(v)
    groups = q.reshape(*q.shape[:-1], -1, X_GROUP).astype(np.float64) * scale[..., None].astype(np.float64)
    return groups.reshape(q.shape)
