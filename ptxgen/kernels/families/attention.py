"""The split-KV decode attention family (incremental_attention, persistent_decoder's phase C):
one query token against a KV cache, a CTA per (chunk of keys, KV head). The PTX is the macros
attn_chunk / attn_active / attn_split / attn_count_in of templates/families/attention.ptx.j2;
`AttentionPlan` is what they take. The design is described in
ptxgen/kernels/incremental_attention.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ...abi import Formula, maximum
from ...dtypes import DTYPES
from ..base import DependentTail, TailStep, ceil_div, round_up

# Rows of an mma m16n8k16 A operand: a slice's query heads sit in rows 0..7 with their second
# part (the low bits of q, or of the probabilities) in rows 8..15 of the same lanes.
MAX_HEADS_PER_SLICE = 8
PARTIAL_PAD = 4  # each partial row is o[head_dim] then (m, l) and 2 spare floats: 16-byte rows
ROW_PAD = 16  # bytes after each K/V row in shared memory: ldmatrix's 8 rows hit 8 bank groups
LOG2E = 1.0 / math.log(2.0)
# f16 probabilities are scaled by 2^15 before the split into f16 high and low parts, so that
# weights down to 2^-29 stay normal numbers (l and o carry the same factor: o / l is unchanged).
P_SCALE_F16 = 2.0 ** 15
WARP_DIMS = (32, 64)
GROUP_KEYS = (16, 32)
MIN_STAGES, MAX_STAGES = 1, 4
# Registers a thread may use (.maxnreg), by (cache dtype, dims_per_warp, group_keys): the fewest
# with which the kernel assembles without spills on sm_80/86/90 (nvJitLink 13.5) for 1..64 query
# heads per KV head and head_dim 64/128/256 (searched in steps of 8). bf16/f32 keep 3-part q and
# probability fragments whose zero rows take registers too.
MAX_REGISTERS = {
    ("f16", 32, 16): 64, ("f16", 32, 32): 72, ("f16", 64, 16): 96, ("f16", 64, 32): 120,
    ("bf16", 32, 16): 80, ("bf16", 32, 32): 88, ("bf16", 64, 16): 144, ("bf16", 64, 32): 176,
    ("f32", 32, 16): 80, ("f32", 32, 32): 88, ("f32", 64, 16): 112, ("f32", 64, 32): 136,
}
# Warps per CTA when the config does not say: 2 CTAs of 16 warps an SM (f16, 64 registers) or
# 3 of 8 (bf16/f32): half of an SM's 64 warps either way.
TARGET_WARPS = {"f16": 16, "bf16": 8, "f32": 8}
# The SM the default split rule plans for: sm_90's register file, warps and shared memory.
SM_REGISTERS, SM_WARPS, SM_SHARED, CTA_RESERVED_SHARED = 65536, 64, 228 * 1024, 1024


def division_magic(divisor: int, bound: int) -> tuple[int, int]:
    """(multiplier, shift) with (n * multiplier) >> shift == n // divisor for every 0 <= n < bound
    (Granlund and Montgomery: with n < 2^b, shift = b + ceil(log2 divisor) and multiplier =
    ceil(2^shift / divisor), the rounding excess times n stays below 2^shift). The multiplier
    fits 32 bits for bound <= 2^30, so a u32 mul.wide and a 64-bit shift do it."""
    if divisor < 1 or not 1 <= bound <= 1 << 30:
        raise ValueError(f"division_magic: divisor {divisor}, bound {bound}")
    shift = (bound - 1).bit_length() + (divisor - 1).bit_length()
    return -(-(1 << shift) // divisor), shift


@dataclass(frozen=True)
class AttentionPlan:
    """Warp, tile and split layout of one config (all compile-time constants).

    Warp w of a CTA is (key group kg, head slice hs, dim slice dw), w = (kg*head_slices + hs)*
    dim_warps + dw. A head slice is up to 8 query heads (the rows of one mma tile); a dim slice
    `dims_per_warp` of head_dim; a key group takes `group_keys` keys of every ring tile."""

    head_dim: int
    kv_dtype: str
    max_seq_len: int
    q_scale: float  # softmax scale * log2(e): scores are in the exp2 domain
    group: int  # query heads per KV head
    dims_per_warp: int
    key_groups: int
    group_keys: int
    stages: int
    max_splits: int

    @classmethod
    def of(cls, config, *, warps: int | None = None, tile_keys: int | None = None, stages: int = 2,
           dims_per_warp: int | None = None, ctas_per_sm: int | None = None) -> AttentionPlan:
        """The layout of an attention config (num_heads, num_kv_heads, head_dim, max_seq_len,
        kv_dtype, softmax_scale, sm_count). `warps` (a multiple of head_slices * dim_warps;
        default about TARGET_WARPS), `tile_keys` (keys of one ring stage, key_groups * 16 or
        * 32; default * 16), `dims_per_warp` (32 or 64; default 32 unless a key group would
        exceed the target warps), `ctas_per_sm` (the split rule's resident CTAs per SM; default
        what fits an sm_90 SM). Raises ValueError for a layout that cannot be built."""
        group = config.num_heads // config.num_kv_heads
        head_slices = ceil_div(group, MAX_HEADS_PER_SLICE)
        target = TARGET_WARPS[config.kv_dtype]
        dims = dims_per_warp or (32 if head_slices * config.head_dim // 32 <= target else 64)
        if dims not in WARP_DIMS or config.head_dim % dims:
            raise ValueError(f"dims_per_warp: expected one of {WARP_DIMS} dividing head_dim {config.head_dim}, "
                             f"got {dims}")
        per_group = head_slices * (config.head_dim // dims)
        if warps is None:
            warps = per_group * max(1, target // per_group)
        if warps % per_group:
            raise ValueError(f"warps: a key group is {per_group} warps here ({head_slices} head slices x "
                             f"{config.head_dim // dims} dim slices); {warps} is no multiple of it")
        key_groups = warps // per_group
        group_keys = (tile_keys or 16 * key_groups) // key_groups
        if group_keys not in GROUP_KEYS or tile_keys not in (None, key_groups * group_keys):
            raise ValueError(f"tile_keys: expected {key_groups} key groups x {GROUP_KEYS[0]} or "
                             f"{GROUP_KEYS[1]} keys, got {tile_keys}")
        if not MIN_STAGES <= stages <= MAX_STAGES:
            raise ValueError(f"stages: expected {MIN_STAGES}..{MAX_STAGES}, got {stages}")
        plan = cls(head_dim=config.head_dim, kv_dtype=config.kv_dtype, max_seq_len=config.max_seq_len,
                   q_scale=config.softmax_scale * LOG2E, group=group, dims_per_warp=dims,
                   key_groups=key_groups, group_keys=group_keys, stages=stages, max_splits=1)
        resident = ctas_per_sm or plan.resident_ctas
        max_splits = max(1, min(config.sm_count * resident // config.num_kv_heads,
                                ceil_div(config.max_seq_len, plan.tile)))
        return replace(plan, max_splits=max_splits)

    @staticmethod
    def magic(divisor: int, bound: int) -> tuple[int, int]:
        """division_magic, for the templates (div_const)."""
        return division_magic(divisor, bound)

    @property
    def max_registers(self) -> int:
        return MAX_REGISTERS[self.kv_dtype, self.dims_per_warp, self.group_keys]

    @property
    def resident_ctas(self) -> int:
        """CTAs of this plan an sm_90 SM holds at max_registers (the split rule's default)."""
        return max(1, min(SM_REGISTERS // (self.max_registers * self.threads), SM_WARPS // self.warps,
                          SM_SHARED // (self.shared_bytes + CTA_RESERVED_SHARED)))

    # --- warps ---------------------------------------------------------------------------------
    @property
    def head_slices(self) -> int:
        return ceil_div(self.group, MAX_HEADS_PER_SLICE)

    @property
    def heads_per_slice(self) -> int:
        return ceil_div(self.group, self.head_slices)

    @property
    def dim_warps(self) -> int:
        return self.head_dim // self.dims_per_warp

    @property
    def warps(self) -> int:
        return self.key_groups * self.head_slices * self.dim_warps

    @property
    def threads(self) -> int:
        return 32 * self.warps

    # --- numbers: what the tensor cores multiply --------------------------------------------
    @property
    def size(self) -> int:
        """Bytes of one cache element."""
        return DTYPES[self.kv_dtype].size

    @property
    def mma_type(self) -> str:
        """f16 caches multiply in f16; bf16 and f32 caches (split into 3 bf16 parts) in bf16."""
        return "f16" if self.kv_dtype == "f16" else "bf16"

    @property
    def parts(self) -> int:
        """Parts of an f32 operand (q, probabilities) in mma_type: 2 f16 (22 bits, with the
        exponent range handled by scaling) or 3 bf16 (24 bits)."""
        return 2 if self.mma_type == "f16" else 3

    @property
    def kv_parts(self) -> int:
        """Parts of a cache element: f16 and bf16 are exact, f32 is split like q."""
        return 3 if self.kv_dtype == "f32" else 1

    @property
    def terms(self) -> tuple[tuple[str, int], ...]:
        """The mma products that add up one f32-accurate product: (A stack, cache part). The A
        stack names the f32 operand's parts in rows 0..7 and 8..15 ("12": part 1 over part 2,
        "30": part 3 over zeros, "10"), so a lane's rows g and g+8 hold two parts of the same
        head. Dropped products are below 2^-24 of the result."""
        if self.kv_parts == 3:
            return (("12", 0), ("12", 1), ("30", 0), ("10", 2))
        return (("12", 0), ("30", 0)) if self.parts == 3 else (("12", 0),)

    @property
    def q_rescaled(self) -> bool:
        """f16 q is scaled per head by a power of 2 (max |q| into [2^14, 2^15)) to fit f16."""
        return self.mma_type == "f16"

    @property
    def p_scale(self) -> float:
        return P_SCALE_F16 if self.mma_type == "f16" else 1.0

    @property
    def k_steps(self) -> int:
        """mma k-steps (16 dims) of one warp's dim slice."""
        return self.dims_per_warp // 16

    @property
    def key_tiles(self) -> int:
        """n-tiles of 8 keys in a key group's share of a ring tile."""
        return self.group_keys // 8

    @property
    def dim_tiles(self) -> int:
        """n-tiles of 8 dims of o in a warp's dim slice."""
        return self.dims_per_warp // 8

    @property
    def scores(self) -> int:
        """Scores a lane holds per ring tile: 2 per key tile, of its row."""
        return 2 * self.key_tiles

    # --- shared memory: the K/V ring, the score exchange ---------------------------------------
    @property
    def row_bytes(self) -> int:
        """Bytes of one cache row in global memory."""
        return self.head_dim * self.size

    @property
    def row_stride(self) -> int:
        return self.row_bytes + ROW_PAD

    @property
    def row_chunks(self) -> int:
        """16-byte cp.async copies of one row."""
        return self.row_bytes // 16

    @property
    def tile(self) -> int:
        """Keys of one ring tile (every key group's share)."""
        return self.key_groups * self.group_keys

    @property
    def tile_bytes(self) -> int:
        return self.tile * self.row_stride

    @property
    def stage_bytes(self) -> int:
        """One ring stage: the K tile, then the V tile."""
        return 2 * self.tile_bytes

    @property
    def copy_rows(self) -> int:
        """Rows one pass of the CTA's cp.asyncs covers (a thread copies one 16-byte chunk)."""
        return self.threads // self.row_chunks

    @property
    def copy_passes(self) -> int:
        return ceil_div(self.tile, self.copy_rows)

    @property
    def exchange_bytes(self) -> int:
        """Partial scores of every warp (zero with one dim slice: nothing to add up)."""
        return self.threads * self.scores * 4 if self.dim_warps > 1 else 0

    @property
    def row(self) -> int:
        """Floats of one partial row: o[head_dim], m, l, 2 spare."""
        return self.head_dim + PARTIAL_PAD

    @property
    def merge_bytes(self) -> int:
        """The key groups' (o, m, l) rows, merged after the key loop (over the ring)."""
        return self.key_groups * self.group * self.row * 4

    @property
    def ring_bytes(self) -> int:
        return self.stages * self.stage_bytes

    @property
    def shared_bytes(self) -> int:
        return max(self.ring_bytes, self.merge_bytes) + self.exchange_bytes

    # --- the merges: key groups in the CTA, splits in the last CTA ---------------------------
    @property
    def items(self) -> int:
        """float4 outputs one CTA merges."""
        return self.group * self.head_dim // 4

    @property
    def items_per_thread(self) -> int:
        return ceil_div(self.items, self.threads)

    @property
    def item_shift(self) -> int:
        return (self.head_dim // 4).bit_length() - 1

    @property
    def split_lanes(self) -> int:
        """Lanes that share one output float4 in the final combine, each merging every
        split_lanes-th split (adjacent lanes, combined by shuffles): the threads the items leave."""
        lanes = 1
        while lanes < 8 and lanes * 2 * self.items <= self.threads and lanes < self.max_splits:
            lanes *= 2
        return lanes

    @property
    def splits_per_round(self) -> int:
        """Splits a lane merges per round of the final combine (about 16 partial loads in
        flight per thread; the main loop's registers are free by then)."""
        own = ceil_div(self.max_splits, self.split_lanes)
        return min(own, max(1, 16 // self.items_per_thread))

    def count_in_tail(self, nsplit: int, active: int) -> DependentTail | None:
        """attn_count_in's steps after a CTA's last key tile, with `nsplit` CTAs a KV head (the
        grid's x) counting in and `active` of them holding keys; None for a lone split, which
        writes `out` itself. Every CTA's partial stores must be acknowledged before the atomic's
        release, the atomic returns the count, and the CTA that completes it then loads the
        partials, splits_per_round a lane at once with split_lanes lanes an output: each a round
        trip waiting for the one before, after every split is done."""
        if nsplit < 2:
            return None
        per_round = self.splits_per_round * self.split_lanes
        return DependentTail(steps=(
            TailStep("the split's partial stores acknowledged (the count-in's release waits for them)", 1,
                     every_cta=True, returns_value=False),
            TailStep("the count-in atom.acq_rel.gpu on the KV head's counter", 1, every_cta=True, returns_value=True),
            TailStep(f"the last CTA's loads of {active} partials, {per_round} a round", ceil_div(active, per_round),
                     every_cta=False, returns_value=True),
        ), group_ctas=nsplit)

    def split(self, length: Formula) -> tuple[Formula, Formula]:
        """(chunk, splits) for a clamped length: the rule attn_chunk and attn_active evaluate on the device
        (ints for a known length, launch formulas for one given by a runtime scalar). A chunk
        is at least one ring tile (every key group busy: below that, more splits add more fixed
        work per CTA than they save), in steps of group_keys."""
        chunk = maximum(self.tile, round_up(ceil_div(length, self.max_splits), self.group_keys))
        return chunk, ceil_div(length, chunk)
