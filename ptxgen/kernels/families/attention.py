"""The split-KV decode attention family (incremental_attention, persistent_decoder's phase C):
one query token against a KV cache, a CTA per (chunk of keys, KV head). The PTX is the macros
attn_split_rule / attn_split / attn_count_in of templates/families/attention.ptx.j2;
`AttentionPlan` is what they take. The design is described in
ptxgen/kernels/incremental_attention.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ...archs import STATIC_SHARED_LIMIT
from ...dtypes import DTYPES
from ...abi import Formula, maximum
from ..base import ceil_div, round_up

MAX_HEADS_PER_WARP = 8  # query heads whose q and o live in one lane's registers
PARTIAL_PAD = 4  # each partial row is o[head_dim] then (m, l) and 2 spare floats: 16-byte rows
LOG2E = 1.0 / math.log(2.0)


@dataclass(frozen=True)
class AttentionPlan:
    """Register, warp and split layout of one config (all compile-time constants)."""

    head_dim: int
    kv_dtype: str
    max_seq_len: int
    q_scale: float  # softmax scale * log2(e): scores are in the exp2 domain
    group: int  # query heads per KV head
    heads_per_warp: int
    key_warps: int
    keys_in_flight: int
    max_splits: int

    @classmethod
    def of(cls, config, warps: int | None = None, keys_in_flight: int | None = None,
           max_heads_per_warp: int = MAX_HEADS_PER_WARP) -> AttentionPlan:
        """The layout of an attention config (num_heads, num_kv_heads, head_dim, max_seq_len,
        kv_dtype, softmax_scale, sm_count, ctas_per_sm). With `warps` (a multiple of
        head_slices) the CTA has exactly that many warps: key_warps = warps / head_slices
        (persistent_decoder runs the split in its own CTAs); else the rule below.
        `keys_in_flight` overrides the rows a lane loads ahead and `max_heads_per_warp` caps the
        query heads a warp keeps in registers (fewer registers, more warps re-reading a K/V row)."""
        group = config.num_heads // config.num_kv_heads
        heads_per_warp = max(d for d in range(1, min(group, max_heads_per_warp) + 1) if group % d == 0)
        head_slices = group // heads_per_warp
        key_warps = max(1, 4 // head_slices)
        row = config.head_dim + PARTIAL_PAD
        while key_warps > 1 and key_warps * group * row * 4 > STATIC_SHARED_LIMIT:
            key_warps //= 2
        if warps is not None:
            if warps % head_slices:
                raise ValueError(f"{warps} warps cannot split a group of {group} query heads into {head_slices} slices")
            key_warps = warps // head_slices
        layout = cls(head_dim=config.head_dim, kv_dtype=config.kv_dtype, max_seq_len=config.max_seq_len,
                     q_scale=config.softmax_scale * LOG2E, group=group, heads_per_warp=heads_per_warp,
                     key_warps=key_warps, keys_in_flight=keys_in_flight or 0, max_splits=0)
        # Keys in flight per lane: fewer when q and o of many heads already fill the registers.
        if keys_in_flight is None:
            layout = replace(layout, keys_in_flight=4 if heads_per_warp * layout.elements <= 32 else 2)
        max_splits = max(1, min(ceil_div(config.sm_count * config.ctas_per_sm, config.num_kv_heads),
                                ceil_div(config.max_seq_len, layout.tile)))
        return replace(layout, max_splits=max_splits)

    # --- lane layout: `lanes_per_key` lanes read one K/V row with 16-byte loads ----------------
    @property
    def size(self) -> int:
        """Bytes of one cache element."""
        return DTYPES[self.kv_dtype].size

    @property
    def vec(self) -> int:
        """Elements per 16-byte load."""
        return 16 // self.size

    @property
    def lanes_per_key(self) -> int:
        return min(32, self.head_dim // self.vec)

    @property
    def lane_shift(self) -> int:
        return self.lanes_per_key.bit_length() - 1

    @property
    def vectors_per_lane(self) -> int:
        return self.head_dim // self.vec // self.lanes_per_key

    @property
    def keys_per_load(self) -> int:
        return 32 // self.lanes_per_key

    @property
    def elements(self) -> int:
        """Elements of one row a lane holds."""
        return self.vectors_per_lane * self.vec

    # --- CTA and splits -----------------------------------------------------------------------
    @property
    def head_slices(self) -> int:
        return self.group // self.heads_per_warp

    @property
    def tile(self) -> int:
        """Keys a CTA covers per trip of its key loop."""
        return self.key_warps * self.keys_per_load * self.keys_in_flight

    @property
    def threads(self) -> int:
        return self.key_warps * self.head_slices * 32

    @property
    def row(self) -> int:
        """Floats of one partial row: o[head_dim], m, l, 2 spare."""
        return self.head_dim + PARTIAL_PAD

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
    def splits_per_round(self) -> int:
        """Splits merged per round of the final combine (about 16 partial loads in flight per
        thread; the main loop's registers are free by then)."""
        return min(self.max_splits, max(1, 16 // self.items_per_thread))

    # --- shared scratch of one warp for the score sums (words) ---------------------------------
    # Per sub-row p, the partial dot products [score][lane] with rows of T+4 words (conflict-free
    # 16-byte row reads), sub-rows offset by T banks; then per sub-row the finished scores.
    @property
    def scores(self) -> int:
        return self.heads_per_warp * self.keys_in_flight

    @property
    def score_row(self) -> int:
        return self.lanes_per_key + 4

    @property
    def sub_stride(self) -> int:
        if self.keys_per_load == 1:
            return self.scores * self.score_row
        return round_up(self.scores * self.score_row, 32) + self.lanes_per_key

    @property
    def sums_stride(self) -> int:
        return round_up(self.scores, 4)

    @property
    def warp_stride(self) -> int:
        return self.keys_per_load * (self.sub_stride + self.sums_stride)

    @property
    def shared_bytes(self) -> int:
        merge_bytes = self.key_warps * self.group * self.row * 4
        return max(merge_bytes, self.key_warps * self.head_slices * self.warp_stride * 4)

    def split(self, length: Formula) -> tuple[Formula, Formula]:
        """(chunk, splits) for a clamped length: the rule attn_split_rule evaluates on the device
        (ints for a known length, launch formulas for one given by a runtime scalar)."""
        chunk = maximum(self.tile, round_up(ceil_div(length, self.max_splits), self.tile))
        return chunk, ceil_div(length, chunk)
