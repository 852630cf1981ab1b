"""flash_attention (prefill, tensor cores): FlashAttention-2 forward on mma.sync m16n8k16.

o[h] = softmax(scale * q[h] @ k[g].T + mask) @ v[g], g = h // (num_heads / num_kv_heads);
with `causal`, query i sees keys j <= i. Any seq_len >= 1.

Geometry: a CTA of block_m / warp_rows warps owns block_m query rows of one head (warp_rows per
warp: one or two m16 tiles); grid (ceil(seq_len/block_m), num_heads). K/V tiles of block_n keys
stream through a ring of `stages` XOR-swizzled shared-memory buffers filled by cp.async, one
barrier per tile. The tile shape, warp shape, ring depth, softmax/MMA overlap and register cap are
config fields so a GPU sweep can pick them. One PTX serves every arch of a spec, so the defaults
(64x64 tiles, 16-row warps, 2 stages: 64 KB at d128) fit them all; occupancy at d128 from ptxas's
registers and the shared memory (warps per SM):
    defaults                                  sm_80 8, sm_86/89 4, sm_90 8
    max_registers=168                         sm_80 8, sm_86/89 4, sm_90 12
    block_n=32, stages=3, max_registers=168   sm_80 12, sm_86/89 8, sm_90 12
    block_m=128, warp_rows=32 (FA2's shape)   sm_80 4, sm_86/89 4, sm_90 8 (half the ldmatrix per MMA)
    stages=3, overlap                         sm_80 4, sm_86/89 4, sm_90 8
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..abi import minimum, scalar
from ..dtypes import DTYPES, from_float, half_ulp, to_float64
from ..hardware_errors import MMA_SUM, RCP_REL
from .base import Geometry, Kind, KernelConfig, Param, SmCount, Traffic, ceil_div

MAX_SEQ_LEN = 1 << 24  # keeps every in-kernel u32 row index far from overflow
SHARED_ALIGN = 1024  # the XOR swizzle is applied to absolute shared addresses (bits 4..7)
# Q fragments stay in registers when they take at most this many per thread (warp_rows*head_dim/64);
# more (32 rows of d128: 64 registers next to 128 of O) would spill, so Q is re-read from shared.
Q_REGISTERS_MAX = 32
# The running row max is only moved when a tile's max exceeds it by more than 2^8 (in exp2
# units): p <= 256 then, exact in f16/bf16 and far from overflow, and O is rescaled rarely.
RESCALE_THRESHOLD = 8.0
# sample_inputs' key in the first key tile (visited last) that moves the max of rows past the first
# query block (of every block_m up to 128)
OUTLIER_KEY, OUTLIER_ROW = 5, 130
# sample_inputs' last row and key gain sqrt(LAST_SCORE / head_dim) in every dimension: that row's
# score with the key it meets first (the last tile is visited first) rises by about LAST_SCORE,
# past the ~1000 at which 2^(old max - new max) overflows f32 if a kernel forgot its running max.
LAST_SCORE = 1200.0


# SPLIT_KV: a causal launch of one wave or less is as long as its longest CTA, the heaviest query
# block of a head against all the keys before it: at 1k tokens in 128-row CTAs 1.75x an even
# spread of the work over the H100's 264 slots (`show`'s dispatch), and the measured TFLOP/s
# followed that figure (H200, 2026-11-28: 64-row CTAs, 1.38x, ran 1.09x faster at 1k where at 4k,
# both ~1.0x, their tiles ran 0.87x as fast; 0.87 x 1.75 / 1.38 = 1.10). With split_kv_len = L a
# launch of at most L tokens splits each head's SPLIT_BLOCKS heaviest query blocks into two CTAs
# (the upper half of the block's key tiles, with the diagonal, and the lower half), each writing
# its unnormalised O, running max and row sum to the `partials` workspace; the second to count
# in (`counters`) merges them (o = (O0 a0 + O1 a1) / (l0 a0 + l1 a1), a_i = 2^(c (m_i - max m)),
# in the same order whichever piece merges). Listed over the slots (split_work), 1k tokens falls
# from 1.75x to 1.34x, 512 from 3.09x to 1.89x; at 2k (two waves) it would rise from 1.03x to
# 1.07x, hence the length bound. The grid keeps SPLIT_BLOCKS more CTAs a head at any length (they
# end at once above L). The key loop is the unsplit one (tile numbers count from the piece's
# lowest tile); with 128-row CTAs of 32-row warps (254 registers unsplit) ptxas takes 255 and
# spills 16 bytes, none inside a loop (SASS: a pointer stored before the key loop and read after
# it, two registers in the merge); the other tile shapes spill nothing. Not timed yet: off by
# default.
SPLIT_BLOCKS = 2
# The CTA's role (its split block's index, upper piece, alone) is kept in shared memory through
# the key loop: recomputed from the CTA's ids after it, ptxas kept the first computation live
# instead and spilled 16 bytes (128-row CTAs of 32-row warps, 254 registers unsplit).
ROLE_BYTES = 16
# A merge's share of a split CTA's work, in key tiles: half the CTAs of a split block merge, each
# reading a partial of the CTA's size from L2 and rescaling it (about a tile's loads).
MERGE_WORK = 0.5


def causal_cta_work(seq_len: int, heads: int, block_m: int, block_n: int) -> np.ndarray:
    """Work of each CTA of a causal launch by linear id (id = rank * heads + head, query block =
    blocks - 1 - rank: query_block in templates/families/prefill.ptx.j2): its key tiles, plus one
    for its Q tile and output (counted on the portable kernel at 1k tokens, 64-key tiles: a CTA's
    fixed instructions are those of 1.6 tiles; with the + 1, a sample of the heaviest half of the
    CTAs scales to 1.5% under the whole grid's count, without it 4.5%)."""
    blocks = ceil_div(seq_len, block_m)
    block = blocks - 1 - np.arange(blocks * heads) // heads
    return -(-np.minimum(seq_len, (block + 1) * block_m) // block_n) + 1


def split_work(seq_len: int, heads: int, block_m: int, block_n: int, split_kv_len: int) -> np.ndarray:
    """causal_cta_work for a launch with split_kv_len (SPLIT_KV; the template's split_role): ranks
    0 .. 2 SPLIT_BLOCKS - 1 are the two pieces (upper, lower) of the heaviest blocks, each its half
    of the block's tiles + 1 + MERGE_WORK (a block of one tile is not split: its lower piece is
    idle), then the other blocks, heaviest first; above split_kv_len the whole blocks, then the
    idle CTAs the grid keeps."""
    whole = causal_cta_work(seq_len, 1, block_m, block_n).astype(float)  # a head's blocks, heaviest first
    spare = min(SPLIT_BLOCKS, len(whole))
    if seq_len > split_kv_len:
        work = np.concatenate([whole, np.zeros(spare)])
    else:
        pieces = []
        for count in whole[:spare] - 1:
            lower = count // 2
            pieces += [count - lower + 1 + MERGE_WORK, lower + 1 + MERGE_WORK] if lower else [count + 1, 0.0]
        work = np.concatenate([pieces, whole[spare:]])
    return np.repeat(work, heads)


class Sm90aTuning(BaseModel):
    """Knobs of the Hopper (sm_90a) variant; see ptxgen/kernels/flash_attention_sm90a.py."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    block_n: Literal[32, 64, 128, 256] = 128
    consumers: int = Field(default=2, ge=1, le=3)
    stages: int = Field(default=2, ge=1, le=4)
    producer_warps: Literal[1, 4] = 1
    overlap: bool | None = None  # None: wherever the registers allow it
    pingpong: bool = False       # two consumer warpgroups take turns issuing their MMAs (overlap only)
    persistent: bool = False     # sm_count CTAs walk the query blocks (the next one's loads overlap this epilogue)
    tma: bool = False            # one producer lane copies each tile with cp.async.bulk.tensor (tensor maps)
    sm_count: int = SmCount      # the persistent grid


class FlashAttentionConfig(KernelConfig):
    kind: Literal["flash_attention"]
    num_heads: int = Field(ge=1, le=65535)  # grid.y
    num_kv_heads: int = Field(ge=1)
    head_dim: Literal[64, 128]
    dtype: Literal["f16", "bf16"] = "f16"
    out_dtype: Literal["f32", "f16", "bf16"] = "f32"
    causal: bool = True
    # Bounded so that scale*log2(e) and the rescale threshold over it are normal f32 numbers.
    scale: float | None = Field(default=None, ge=1e-6, le=1e6)
    # Query rows per CTA and per warp (16: one m16 tile, Q in registers; 32: two m16 tiles share
    # every K/V fragment read from shared memory, half the ldmatrix traffic per MMA).
    block_m: Literal[64, 128] = 64
    warp_rows: Literal[16, 32] = 16
    # Keys per K/V tile and buffers in the cp.async ring (prefetch distance stages-1 tiles).
    block_n: Literal[32, 64, 128] = 64
    stages: Literal[2, 3, 4] = 2
    # Software-pipeline each warp: S = Q K^T of the next tile is issued in the same basic block as
    # the softmax of this one, so the tensor and FP32/MUFU pipes work at once (needs stages >= 3).
    overlap: bool = False
    # .maxnreg: cap registers per thread to fit more CTAs per SM (None: ptxas decides).
    max_registers: int | None = Field(default=None, ge=64, le=255)
    # Causal launches of at most this many tokens split the key tiles of each head's SPLIT_BLOCKS
    # heaviest query blocks over two CTAs (SPLIT_KV); 0: never. The sm_90a variant ignores it.
    split_kv_len: int = Field(default=0, ge=0, le=MAX_SEQ_LEN)
    # Used only when the spec lists sm_90a (the Hopper variant's own PTX).
    sm90a: Sm90aTuning = Sm90aTuning()

    @model_validator(mode="after")
    def consistent(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_kv_heads must divide num_heads, got num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}")
        if self.block_m // self.warp_rows * 32 < self.head_dim:
            # One cp.async pass must cover 8 whole rows (head_dim/8 threads per row) so that every
            # pass has the same XOR swizzle and its offset is an immediate.
            raise ValueError(f"block_m / warp_rows = {self.block_m // self.warp_rows} warps cannot load "
                             f"head_dim={self.head_dim} rows; use at least {self.head_dim // 32} warps")
        if self.overlap and self.stages < 3:
            raise ValueError(f"overlap needs stages >= 3 (three tiles are live at once), got stages={self.stages}")
        if self.split_kv_len and not self.causal:
            raise ValueError("split_kv_len needs causal = true (without the mask every query block has the same "
                             "work: nothing to split)")
        return self


def attention_reference(q, k, v, scale: float, causal: bool) -> np.ndarray:
    """Float64 softmax(scale q k^T + mask) v for q [H, S, D], k/v [G, S, D] (H a multiple of G)."""
    heads, seq_len, _ = q.shape
    group = heads // k.shape[0]
    out = np.empty_like(q)
    future = np.triu(np.ones((seq_len, seq_len), dtype=bool), 1)
    for h in range(heads):
        scores = scale * (q[h] @ k[h // group].T)
        if causal:
            scores[future] = -np.inf
        scores -= scores.max(axis=1, keepdims=True)
        weights = np.exp(scores)
        out[h] = (weights / weights.sum(axis=1, keepdims=True)) @ v[h // group]
    return out


UNIT_ROUNDOFF = {"f32": 0.0, "f16": 2.0**-11, "bf16": 2.0**-8}
# Largest error of a P the kernel rounds below the normal range: half the f16 subnormal spacing;
# for bf16 the flush of ex2.approx.ftz below 2^-126 (bf16 has f32's exponent range).
SUBNORMAL_ERROR = {"f16": 2.0**-25, "bf16": 2.0**-126}
F32_ROUNDOFF = 2.0**-24
MMA_ERROR = MMA_SUM  # per mma: this times (sum |a*b| + |c|) (hardware_errors, measured)
EX2_ERROR = 2.0**-21  # ex2.approx.ftz.f32: 2^-22 relative (PTX ISA), doubled
ERROR_ROWS = 64  # rows per step of the bound's [rows, keys, head_dim] temporary


def attention_error_bound(q, k, v, scale: float, causal: bool, dtype: str, out_dtype: str, block_n: int,
                          rounded_sum: bool = True, merged: bool = False) -> np.ndarray:
    """Per-element bound on |kernel o - exact o| (float64 q [H, S, D], k/v [G, S, D] of the stored inputs).

    In row i the kernel weighs key j by P_j = p_j (1 + d_j) + a_j, p_j = 2^(c (s_j - m)) for its
    reference max m (at most the row max, so sum p >= 1): |d_j| <= u + eta (P rounded to 16 bits,
    plus the f32 errors of the scores, of the folded exponent and of ex2.approx: eta), |a_j| <= the
    subnormal rounding error. With sum_j p_j (v_j - o) = 0,
        o_kernel - o = sum_j (p_j d_j + a_j) (v_j - o) / sum_j P_j,
        |o_kernel - o| <= ((u + eta) sum_j w_j |v_j - o| + a sum_j |v_j - o|) / (1 - u - eta - n a).
    That holds when the row sum l adds the same rounded P as P V does (`rounded_sum`, sm_80: l is
    P times a ones matrix). The sm_90a kernel adds the unrounded f32 P into l, so the rounding r_j
    (|r_j| <= u) reaches O alone: o_kernel - o = (sum_j p_j d_j (v_j - o) + sum_j p_j r_j v_j) / sum_j P_j
    with |d_j| <= eta, and the rounding is bounded by u sum_j w_j |v_j| (|v_j|, not |v_j - o|: up to
    36x more where a row's values agree in a dimension, measured on the tests' shapes).
    On top: the f32 mma chains summing P V and l (MMA_ERROR per mma, one per 16 keys; sm_90a: l
    by f32 adds, block_n / 4 a tile and thread in any order plus 2 shuffles), the O/l rescales (one rounding
    per tile), the reciprocal (rcp.rn, or sm_90a's rcp.approx) and the final multiply, and the
    output rounding. `merged` (split_kv_len): two pieces' O and l scaled by a_i = 2^(c (m_i - max m))
    and added, 3 more roundings of each, and a_i's error (ex2.approx, and its argument's two f32
    roundings of up to twice the largest exponent) is each of its piece's p_j's: it joins eta.
    """
    heads, seq_len, head_dim = q.shape
    group = heads // k.shape[0]
    c = scale * math.log2(math.e)
    unit, tiny = UNIT_ROUNDOFF[dtype], SUBNORMAL_ERROR[dtype]
    tiles = ceil_div(seq_len, block_n)
    merges = 3 if merged else 0
    accumulate = MMA_ERROR * (ceil_div(seq_len, 16) + 2) + F32_ROUNDOFF * (tiles + 4 + merges)
    if rounded_sum:
        row_sum = accumulate
    else:
        row_sum = F32_ROUNDOFF * (tiles * (block_n // 4 + 1) + 4 + merges) + RCP_REL
        accumulate += RCP_REL
    visible = np.tril(np.ones((seq_len, seq_len), bool)) if causal else np.ones((seq_len, seq_len), bool)
    keys = visible.sum(axis=1)[:, None]
    bound = np.empty_like(q)
    for h in range(heads):
        kh, vh = k[h // group], v[h // group]
        scores = np.where(visible, q[h] @ kh.T, -np.inf)
        weights = np.exp(scale * (scores - scores.max(axis=1, keepdims=True)))
        weights /= weights.sum(axis=1, keepdims=True)
        out = weights @ vh
        score_error = MMA_ERROR * (head_dim // 16 + 1) * np.where(visible, np.abs(q[h]) @ np.abs(kh).T, 0).max(axis=1)
        exponent = c * np.where(visible, np.abs(scores), 0).max(axis=1)
        merge = (math.log(2) * F32_ROUNDOFF * 4 * exponent + EX2_ERROR) if merged else 0.0
        eta = (math.log(2) * (c * score_error + F32_ROUNDOFF * (5 + 6 * tiles) * exponent) + EX2_ERROR + merge)[:, None]
        # sum_j w_ij |v_j - o_i| in f32 (6x faster), enlarged by its own worst rounding error.
        spread = np.empty(out.shape, np.float32)
        weights32, v32, out32 = weights.astype(np.float32), vh.astype(np.float32), out.astype(np.float32)
        for rows in range(0, seq_len, ERROR_ROWS):
            part = slice(rows, rows + ERROR_ROWS)
            deviation = np.abs(v32[None, :, :] - out32[part, None, :])
            spread[part] = (weights32[part, None, :] @ deviation)[:, 0, :]
        spread = spread * (1 + (seq_len + 3) * 2.0**-23)
        absolute = (weights @ np.abs(vh)) * (1 + unit + eta) / (1 - unit - eta)
        if rounded_sum:
            below_normal = tiny * (visible @ np.abs(vh) + keys * np.abs(out))  # >= tiny sum_j |v_j - o_i|
            softmax = ((unit + eta) * spread + below_normal) / (1 - unit - eta - keys * tiny)
        else:
            rounded_in_o = unit * absolute + tiny * (visible @ np.abs(vh))
            softmax = (eta * spread + rounded_in_o) / (1 - eta - keys * tiny)
        softmax = softmax + row_sum * (np.abs(out) + softmax) / (1 - row_sum)
        total = softmax + accumulate * absolute / (1 - row_sum)
        # the output's rounding: half an ulp where the result lies, f16's fixed subnormal spacing below 6.1e-5
        bound[h] = total + half_ulp(np.abs(out) + total, out_dtype)
    return bound


class FlashAttention(Kind):
    name = "flash_attention"
    Config = FlashAttentionConfig
    ptx_version = (7, 0)  # cp.async, ldmatrix, mma.m16n8k16 bf16, cvt.rn.bf16x2.f32
    splits_kv = True  # the kernel honours split_kv_len (the sm_90a variant does not)

    @property
    def scale(self) -> float:
        c = self.config
        return c.scale if c.scale is not None else 1.0 / math.sqrt(c.head_dim)

    @property
    def group(self) -> int:
        return self.config.num_heads // self.config.num_kv_heads

    def params(self) -> list[Param]:
        c = self.config
        # split_kv_len: each piece's partial, 16-byte chunks of the thread's registers (O, then
        # its rows' l and m) in register-major order, and a count-in word per split block.
        split = [Param("partials", "f32", (c.num_heads, SPLIT_BLOCKS, 2, self.partial_chunks, self.threads, 4),
                       "workspace"),
                 Param("counters", "u32", (c.num_heads, SPLIT_BLOCKS), "workspace")] if c.split_kv_len else []
        return [
            Param("q", c.dtype, (c.num_heads, "seq_len", c.head_dim)),
            Param("k", c.dtype, (c.num_kv_heads, "seq_len", c.head_dim)),
            Param("v", c.dtype, (c.num_kv_heads, "seq_len", c.head_dim)),
            Param("o", c.out_dtype, (c.num_heads, "seq_len", c.head_dim), "out"),
            Param("seq_len", "u32", role="scalar"),
            *split,
        ]

    @property
    def partial_chunks(self) -> int:
        """16-byte chunks of a thread's partial: its O accumulators (warp_rows/16 x head_dim/8
        fragments of 4), then one (l of row g, l of row g+8, m of both) per m16 tile."""
        c = self.config
        return c.warp_rows // 16 * (c.head_dim // 8 + 1)

    # --- geometry --------------------------------------------------------------------------
    @property
    def warps(self) -> int:
        return self.config.block_m // self.config.warp_rows

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def q_in_registers(self) -> bool:
        return self.config.warp_rows * self.config.head_dim // 64 <= Q_REGISTERS_MAX

    @property
    def row_bytes(self) -> int:
        return 2 * self.config.head_dim

    @property
    def stage_bytes(self) -> int:
        """One ring buffer: a K tile then a V tile of block_n rows."""
        return 2 * self.config.block_n * self.row_bytes

    @property
    def q_offset(self) -> int:
        # Q kept in registers is staged in the last ring buffer: the prologue fills only the
        # first stages-1 buffers, and the first tile's barrier orders every warp's Q reads
        # before the first prefetch overwrites it.
        c = self.config
        return (c.stages - 1 if self.q_in_registers else c.stages) * self.stage_bytes

    def dynamic_shared(self) -> int:
        c = self.config
        return self.role_offset + (ROLE_BYTES if c.split_kv_len else 0)

    @property
    def role_offset(self) -> int:
        """Where split_kv_len's role word lives, past the ring and Q."""
        c = self.config
        return max(c.stages * self.stage_bytes, self.q_offset + c.block_m * self.row_bytes)

    def geometry(self) -> Geometry:
        blocks = ceil_div(scalar("seq_len"), self.config.block_m)
        if self.config.split_kv_len:   # the split blocks' second pieces (idle above split_kv_len)
            blocks = blocks + minimum(blocks, SPLIT_BLOCKS)
        return Geometry(grid=(blocks, self.config.num_heads, 1), block=(self.threads, 1, 1),
                        dynamic_shared=self.dynamic_shared())

    @property
    def block_shape(self) -> tuple[int, int]:
        """(query rows, keys) of a CTA's block and of a key tile."""
        return self.config.block_m, self.config.block_n

    def cta_work(self, scalars):
        """Causal: each CTA's key tiles, in the order templates/families/prefill.ptx.j2's
        query_block deals them (the heaviest block of every head first)."""
        c = self.config
        if not c.causal:
            return None
        if c.split_kv_len and self.splits_kv:
            return split_work(scalars["seq_len"], c.num_heads, *self.block_shape, c.split_kv_len)
        return causal_cta_work(scalars["seq_len"], c.num_heads, *self.block_shape)

    def launch_note(self) -> str:
        c = self.config
        order = ", the heaviest query blocks of every head first (longest causal rows)" if c.causal else ""
        split = (f"; up to {c.split_kv_len} tokens the {SPLIT_BLOCKS} heaviest blocks of a head split their key "
                 "tiles over two CTAs, the second to finish merging" if c.split_kv_len else "")
        return (f"one CTA per {c.block_m} query rows of one head, {c.warp_rows} per warp, "
                f"{c.block_n}-key tiles in a {c.stages}-stage ring{order}{split}")

    def template_vars(self) -> dict:
        c = self.config
        return {
            "head_dim": c.head_dim,
            "dtype": c.dtype,
            "out_dtype": c.out_dtype,
            "causal": c.causal,
            "num_heads": c.num_heads,
            "group": self.group,
            "scale_log2": self.scale * math.log2(math.e),
            "rescale_threshold": RESCALE_THRESHOLD,
            "block_m": c.block_m,
            "block_n": c.block_n,
            "warp_rows": c.warp_rows,
            "stages": c.stages,
            "overlap": c.overlap,
            "max_registers": c.max_registers,
            "threads": self.threads,
            "q_in_registers": self.q_in_registers,
            "stage_bytes": self.stage_bytes,
            "q_offset": self.q_offset,
            "shared_align": SHARED_ALIGN,
            "split_kv_len": c.split_kv_len,
            "split_blocks": SPLIT_BLOCKS,
            "partial_chunks": self.partial_chunks,
            "role_offset": self.role_offset,
        }

    # --- runtime -----------------------------------------------------------------------------
    def scalar_limits(self) -> dict[str, tuple[int, int]]:
        return {"seq_len": (1, MAX_SEQ_LEN)}

    def example_scalars(self) -> dict[str, int]:
        return {"seq_len": 4096}

    def verify_scalars(self) -> list[dict[str, int]]:
        """One query block; then several, the last key tile holding one key at both tile sizes
        (257 = 4 * 64 + 1 = 2 * 128 + 1: the sm_90a variant's 128-key tiles too, and three of them
        wrap its two-stage ring, which 193 did not: a missing wait for a free stage and a tile
        count off by one there passed), and a key past the first 128 that moves some rows' max
        (sample_inputs)."""
        return [{"seq_len": 70}, {"seq_len": 257}]

    def sample_inputs(self, rng, scalars):
        """Gaussian q, K, V (V off zero). Past OUTLIER_ROW + 4 tokens, rows OUTLIER_ROW.. +3 of q and
        key OUTLIER_KEY gain 12/sqrt(head_dim) in every dimension: their score rises by about 144.
        The kernels walk key tiles from the last to the first, so those rows (in a later query block)
        meet the key in their last tile visited, their running max jumps by more than
        RESCALE_THRESHOLD allows (62.7 in score units at head_dim 128), and o and l must be rescaled;
        with four rows some lanes of a warp hold one of them and some do not: they disagree about it.
        The last row and key gain sqrt(LAST_SCORE / head_dim): the max of that row falls by about
        LAST_SCORE after its first tile visited, so the running max must be kept (a tile's own max
        in its place overflows the rescale factor: NaN)."""
        c = self.config
        seq_len = scalars["seq_len"]
        q = rng.standard_normal((c.num_heads, seq_len, c.head_dim))
        k = rng.standard_normal((c.num_kv_heads, seq_len, c.head_dim))
        v = rng.standard_normal((c.num_kv_heads, seq_len, c.head_dim)) + 0.25
        if seq_len > OUTLIER_ROW + 4:
            boost = 12 / math.sqrt(c.head_dim)
            q[:, OUTLIER_ROW:OUTLIER_ROW + 4] += boost
            k[:, OUTLIER_KEY] += boost
            q[:, -1] += math.sqrt(LAST_SCORE / c.head_dim)
            k[:, -1] += math.sqrt(LAST_SCORE / c.head_dim)
        return {"q": from_float(q, c.dtype), "k": from_float(k, c.dtype), "v": from_float(v, c.dtype)}

    def reference(self, arrays, scalars):
        c = self.config
        q, k, v = (to_float64(arrays[name], c.dtype) for name in ("q", "k", "v"))
        return {"o": attention_reference(q, k, v, self.scale, c.causal)}

    def tolerance(self, param: Param) -> float:
        # Relative L2 error expected for sample_inputs (attention_error_bound is the per-element
        # bound). u = unit roundoff: 2^-11 for f16, 2^-8 for bf16. (1) P rounded to 16 bits: the
        # error of row i is sum_j w_ij d_j (v_j - o_i) with independent |d_j| <= u (RMS u/sqrt(3)),
        # at most about u/sqrt(3) relative when a row has a few keys and less with many; allowed
        # 0.8 u_in. (2) An f16/bf16 output is rounded once on store: RMS u_out/sqrt(3); allowed
        # u_out. f32 accumulation and ex2.approx add ~1e-6.
        return 0.8 * UNIT_ROUNDOFF[self.config.dtype] + UNIT_ROUNDOFF[param.dtype]

    def error_bound(self, param, arrays, reference, scalars):
        c = self.config
        q, k, v = (to_float64(arrays[name], c.dtype) for name in ("q", "k", "v"))
        return attention_error_bound(q, k, v, self.scale, c.causal, c.dtype, c.out_dtype, c.block_n,
                                     merged=scalars["seq_len"] <= c.split_kv_len)

    def traffic(self, scalars) -> Traffic:
        c = self.config
        seq_len = scalars["seq_len"]
        size = DTYPES[c.dtype].size
        rows = seq_len * c.head_dim
        nbytes = (c.num_heads + 2 * c.num_kv_heads) * rows * size + c.num_heads * rows * DTYPES[c.out_dtype].size
        pairs = seq_len * (seq_len + 1) // 2 if c.causal else seq_len * seq_len
        return Traffic(bytes=nbytes, flops=4 * c.num_heads * c.head_dim * pairs)

    def torch_peer(self, torch, tensors, scalars):
        """bench's peers: torch SDPA per backend, FlashInfer prefill, flash-attn (ptxgen.peers)."""
        from ..peers import prefill_attention_peers

        return prefill_attention_peers(torch, tensors["q"], tensors["k"], tensors["v"], self.config.causal, self.scale)
