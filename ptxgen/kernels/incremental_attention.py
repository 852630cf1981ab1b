"""incremental_attention: decode attention of one query token against a KV cache (GQA, split-KV).

Geometry (the attention family: `AttentionPlan` in ptxgen/kernels/families/attention.py decides
it, the macros of templates/families/attention.ptx.j2 write it out):

- grid (splits, num_kv_heads, 1). CTA (s, g) reads keys [s*chunk, min(L, (s+1)*chunk)) of KV
  head g once and serves every query head of that KV head, so K/V bytes are read once per KV
  head, not once per query head.
- K/V stream through a ring of `stages` shared-memory tiles filled by 16-byte cp.async.cg
  (stages - 1 tiles in flight while one is used; rows past the chunk are zero-filled), so the
  bytes in flight do not depend on registers: a CTA of 16 warps with 2 stages has 32 KB of
  K/V (f16, head_dim 128) in flight, 64 KB an SM at 2 CTAs.
- Fixed costs: the time of a launch is about a fixed cost plus bytes / copy bandwidth (H100,
  the previous version of this design: 12.8 us + bytes / 2.96 TB/s from 4k to 32k keys), so
  the fixed steps are kept short. q is requested first and the ring's first tiles right after
  it (about 45 SASS instructions from the start: no generic integer division before them,
  every division by a constant is a shift or a multiply), and q's fragments and the shared
  addresses are made while those loads travel.
- Tensor cores do both products (mma.sync m16n8k16, f32 accumulation): S = Q K^T with the
  query heads as the rows of A (up to 8 heads a "head slice") and K rows as B straight from
  ldmatrix, then O += P V with the exponentiated scores as A and V through ldmatrix.trans.
  That is about 2 thread-instructions per K/V byte instead of 5 (one f32 FMA per element per
  head plus conversions).
- Warps: key groups x head slices x dim slices. A warp owns `dims_per_warp` (32) of head_dim
  for its head slice and its key group's `group_keys` (16) keys of every ring tile: it adds up
  its part of each score, the dim slices of a key group add their partial scores through
  shared memory (one barrier), and every one applies the same online softmax to o of its own
  dims. So o takes 16 registers (not head_dim/2) and the whole loop fits 64 registers (f16):
  2 CTAs of 16 warps an SM, half of its warps. Key groups merge in shared memory at the end.
- Numerics, f32-accurate: q and the probabilities are f32, so each is split into parts of the
  mma type whose sum is the f32 value (f16: high + low, 22 bits, q first scaled per head and
  dim slice by a power of 2 into f16's range; bf16 caches: 3 bf16 parts, 24 bits); the parts
  sit in rows g and g+8 of the A operand, so a lane adds its two accumulator rows. f16 and
  bf16 cache elements are exact in the mma type; f32 caches are split into 3 bf16 parts too
  (4 products per step, the ones below 2^-24 dropped). f16 probabilities are scaled by 2^15
  before splitting so that weights down to 2^-29 stay normal (l and o share the factor).
- Online softmax in the exp2 domain: q is multiplied once by scale*log2(e), so every
  probability is a single ex2.approx. Running maxima start at -3e38 (not -inf), so no
  (-inf) - (-inf) ever occurs; keys past the end get a score of -inf and weigh exactly 0.
  o is rescaled only when a row's running max moves. Per-element error bound:
  decode_attention_error_bound (the score's error, not P's rounding, dominates it).
- Split-KV with the last CTA combining: with one split the CTA writes `out` directly.
  Otherwise it writes its unnormalised partial to the `partials` workspace and, after a CTA
  barrier, thread 0 bumps the per-KV-head counter in `counters` with one atom.acq_rel.gpu
  (its release publishes the whole CTA's partial, its acquire gives the CTA that completes
  the count everyone else's: SASS MEMBAR.ALL.GPU once a CTA, where membar.gl by every thread
  was a MEMBAR.SC.GPU a warp, and another in the merging CTA). The CTA that sees splits-1
  merges every split's partial (split_lanes lanes per output float4, each merging every
  split_lanes-th split with up to 16 loads in flight, 4 partials at a time: one max, then
  independent ex2s, then one fma each; then shuffles), writes `out` and puts the counter back
  to 0, so the next launch (or a CUDA graph replay) needs no re-zeroing.
- Split rule: max_splits = sm_count * ctas_per_sm // num_kv_heads (ctas_per_sm: what fits an
  sm_90 SM unless the config says); at runtime chunk = max(tile, round_up(ceil(L / max_splits),
  group_keys)) and splits = ceil(L / chunk). A chunk of at least one ring tile keeps every key
  group busy: below it, more splits would add more fixed work per CTA (q, merges) than they
  save. Qwen3-8B (8 KV heads): 16 splits of a KV head at 1k keys (a CTA an SM), 32-33 from 2k
  up (256-264 CTAs, one wave of 2 an SM). With `indirect_seq_len` the grid is max_splits wide
  whatever L (a replayed graph keeps its grid) and CTAs past the end only count in.
- Tuning fields: `warps`, `tile_keys` (keys of one ring stage), `stages` (1..4),
  `dims_per_warp` (32, 64), `ctas_per_sm`; registers are capped (.maxnreg) at what the loop
  needs without spilling (AttentionPlan.max_registers).
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from ..dtypes import DTYPES, UNIT_ROUNDOFF, from_float, to_float64
from ..abi import maximum, minimum, scalar
from ..hardware_errors import EX2_REL, MMA_SUM
from .base import F32_TOLERANCE, DependentTail, Geometry, Kind, Param, PdlConfig, SmCount, Traffic, ceil_div
from .families.attention import LOG2E, SM_REGISTERS, AttentionPlan

FloatDType = Literal["f32", "f16", "bf16"]
HEAD_DIMS = (64, 128, 256)
MAX_SEQ_LEN = 1 << 24
# Running maxima start at -3e38 (NEG_BIG of templates/families/attention.ptx.j2), so every score
# in the exp2 domain, scale * log2(e) * q.k, must stay finite and above it, its rounding included:
# the spec's scale is bounded so that scores of q and K in f16's range (|q.k| <= head_dim * 65504^2)
# stay within 2^127 (1.7e38) in magnitude.
MAX_SCORE = 2.0**127
F16_MAX = 65504.0
# KV_PREFETCH: a launch is about a fixed cost plus bytes at the streaming rate (H200, 2026-11-28,
# ten launches between two events: 7.62 us + bytes / 3998 GB/s, 4k to 32k keys), and at 4k keys
# the fixed cost is most of it. With kv_prefetch_keys = N every CTA first asks L2 for the first N
# keys of its chunk (K and V rows, prefetch.global.L2, a thread a 128-byte line; the attention
# family's kv_l2_prefetch): all of a 4k-key chunk (128 keys, 64 KB) is requested at once where
# the ring keeps 32 KB a CTA in flight, and with `pdl` the requests go out before
# griddepcontrol.wait (a prefetch reads no value), so they stream while the previous kernel of
# the stream drains; with indirect_seq_len they follow the wait, since seq_len_ptr may be the
# previous kernel's. The performance model counts neither. Not timed yet: off by default.
# TIMELINE: that fixed cost (and the model's shortfall there, 3-5 us) is not located. With
# `timeline` thread 0 of each CTA stamps %globaltimer at its start (words 0 and 1: low and high;
# read as it begins, stored after the PDL wait, before which nothing of the timeline is touched),
# after the PDL wait (2), before its count-in (3; 0 for a lone split) and at its end (4, after the
# merge in the CTA that does it): the launch ramp, the stream, and the count-in and merge chain
# after the last split, one by one (bench/lease/attention_timeline.py).
TIMELINE_WORDS = 5


class IncrementalAttentionConfig(PdlConfig):
    kind: Literal["incremental_attention"]
    num_heads: int = Field(ge=1)
    num_kv_heads: int = Field(ge=1)
    head_dim: int
    max_seq_len: int = Field(ge=1, le=MAX_SEQ_LEN)
    kv_dtype: FloatDType = "f16"
    scale: float | None = Field(default=None, gt=0)  # at most max_scale(head_dim): see MAX_SCORE
    indirect_seq_len: bool = False
    # The split rule: about `ctas_per_sm` CTAs on each of `sm_count` SMs at long contexts (default:
    # 32 warps an SM, e.g. 2 CTAs of 16 warps).
    sm_count: int = SmCount
    ctas_per_sm: int | None = Field(default=None, ge=1, le=32)
    # Tuning (see ptxgen/kernels/families/attention.py): warps per CTA (key groups x head slices
    # x dim slices), keys of one ring stage, ring stages, head dims per warp.
    warps: int | None = Field(default=None, ge=1, le=32)
    tile_keys: int | None = Field(default=None, ge=16, le=1024)
    stages: int = Field(default=2, ge=1, le=4)
    dims_per_warp: int | None = None
    # Keys of its chunk (the first ones) a CTA requests into L2 as it starts (KV_PREFETCH); 0: none.
    kv_prefetch_keys: int = Field(default=0, ge=0, le=MAX_SEQ_LEN)
    # Where a launch's time goes: thread 0 of each CTA stamps %globaltimer into the workspace
    # `timeline` (TIMELINE_WORDS a CTA; bench/lease/attention_timeline.py reads it). Off: no
    # stamps, no parameter.
    timeline: bool = False

    @model_validator(mode="after")
    def consistent(self) -> IncrementalAttentionConfig:
        if self.head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim: expected one of {', '.join(map(str, HEAD_DIMS))}, got {self.head_dim}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads ({self.num_kv_heads}) must divide num_heads ({self.num_heads})")
        if self.num_kv_heads * self.max_seq_len > (1 << 32) - (1 << 16):
            raise ValueError("num_kv_heads * max_seq_len must be below 2^32 - 2^16 (cache rows are indexed in u32)")
        if self.scale is not None and self.scale > max_scale(self.head_dim):
            raise ValueError(f"scale: at most {max_scale(self.head_dim):.4g} for head_dim {self.head_dim} (scores of "
                             "q and K in f16's range times scale * log2(e) must stay within 2^127, above the kernel's "
                             f"initial running max -3e38), got {self.scale!r}")
        plan = attention_plan(self)
        if self.num_kv_heads * plan.max_splits * plan.group * plan.row >= 1 << 31:
            raise ValueError("the split-KV workspace would need 2^31 floats or more")
        if plan.threads > 1024 or plan.threads * plan.max_registers > SM_REGISTERS:
            chosen = f"warps = {self.warps}" if self.warps is not None else f"a group of {plan.group} query heads per KV head"
            raise ValueError(f"{chosen} needs {plan.threads} threads of {plan.max_registers} registers per CTA; at "
                             f"most 1024 threads and {SM_REGISTERS} registers are possible")
        return self

    @property
    def softmax_scale(self) -> float:
        return self.scale if self.scale is not None else 1.0 / math.sqrt(self.head_dim)


class IncrementalAttention(Kind):
    name = "incremental_attention"
    Config = IncrementalAttentionConfig
    ptx_version = (7, 0)
    pdl_wait_in_body = True  # after kv_prefetch_keys' requests (templates/incremental_attention.ptx.j2)

    @property
    def plan(self) -> AttentionPlan:
        return attention_plan(self.config)

    def params(self) -> list[Param]:
        c, plan = self.config, self.plan
        kv_shape = (c.num_kv_heads, c.max_seq_len, c.head_dim)
        length = (Param("seq_len_ptr", "u32", (1,), values=(0, c.max_seq_len)) if c.indirect_seq_len
                  else Param("seq_len", "u32", role="scalar"))
        return [
            Param("q", "f32", (c.num_heads, c.head_dim)),
            Param("k_cache", c.kv_dtype, kv_shape),
            Param("v_cache", c.kv_dtype, kv_shape),
            Param("out", "f32", (c.num_heads, c.head_dim), "out"),
            length,
            Param("partials", "f32", (c.num_kv_heads, plan.max_splits, plan.group, plan.row), "workspace"),
            Param("counters", "u32", (c.num_kv_heads,), "workspace"),
            *([Param("timeline", "u32", (c.num_kv_heads * plan.max_splits, TIMELINE_WORDS), "workspace")]
              if c.timeline else []),
        ]

    # --- geometry --------------------------------------------------------------------------
    def clamped_length(self, scalars: dict[str, int]) -> int:
        return min(int(scalars["seq_len"]), self.config.max_seq_len)

    def splits(self, length: int) -> int:
        """Splits that hold keys at a (clamped) length."""
        return self.plan.split(length)[1]

    def geometry(self) -> Geometry:
        plan = self.plan
        if self.config.indirect_seq_len:
            width = plan.max_splits  # the length lives on the device; the grid must not move
        else:
            width = maximum(1, plan.split(minimum(scalar("seq_len"), self.config.max_seq_len))[1])
        return Geometry(grid=(width, self.config.num_kv_heads, 1), block=(plan.threads, 1, 1),
                        dynamic_shared=plan.shared_bytes)

    def dependent_tail(self, scalars: dict[str, int]) -> DependentTail | None:
        """The count-in and the last CTA's merge (AttentionPlan.count_in_tail) of a grid of several splits."""
        active = self.splits(self.clamped_length(scalars))
        nsplit = self.plan.max_splits if self.config.indirect_seq_len else max(1, active)
        return self.plan.count_in_tail(nsplit, active)

    def launch_note(self) -> str:
        plan = self.plan
        rule = (f"chunk = max({plan.tile}, round_up(ceil(L/{plan.max_splits}), {plan.group_keys})), "
                f"splits = ceil(L/chunk), L = min(seq_len, {self.config.max_seq_len})")
        prefetch = (f"; each CTA first requests the first {self.config.kv_prefetch_keys} keys of its chunk into L2"
                    if self.config.kv_prefetch_keys else "")
        return (f"one CTA per (KV chunk, KV head) serving its {plan.group} query heads ({plan.warps} warps, "
                f"{plan.stages} ring stages of {plan.tile} keys); {rule}; the last CTA of a KV head to finish "
                f"merges the splits{prefetch}")

    def static_shared(self) -> int:
        return 4  # the merge flag

    def template_vars(self) -> dict:
        return {"plan": self.plan, "indirect": self.config.indirect_seq_len,
                "kv_prefetch_keys": self.config.kv_prefetch_keys, "timeline": self.config.timeline,
                "timeline_words": TIMELINE_WORDS}

    # --- runtime -----------------------------------------------------------------------------
    def scalar_limits(self) -> dict[str, tuple[int, int]]:
        # With indirect_seq_len the length is seq_len_ptr[0] on the device; `seq_len` then only
        # says what sample_inputs writes there (and what bytes a call moves).
        return {"seq_len": (0, self.config.max_seq_len)}

    def example_scalars(self) -> dict[str, int]:
        return {"seq_len": min(self.config.max_seq_len, 8192)}

    def verify_scalars(self) -> list[dict[str, int]]:
        """Empty, one key, one split; more keys than max_splits tiles (a CTA's running max moves
        across its ring tiles: o rescaled); then fewer splits after more, twice (the merge must not
        read a split the launch before left); two lengths end past the middle of a key group (the
        tail mask's upper lanes)."""
        plan, top = self.plan, self.config.max_seq_len
        tail = plan.group_keys // 2 + 1
        lengths = (0, 1, 37, plan.max_splits * plan.tile + tail, 5 * plan.tile + 3, 2 * plan.tile + tail)
        return [{"seq_len": n} for n in dict.fromkeys(min(top, n) for n in lengths)]

    def sample_inputs(self, rng, scalars):
        """Random q, K and V; cache rows at and past L hold NaN, so a kernel that lets any of
        them into the result fails (they are also never generated: long caches stay cheap)."""
        c = self.config
        length = self.clamped_length(scalars)
        kv_shape = (c.num_kv_heads, c.max_seq_len, c.head_dim)
        live = (c.num_kv_heads, length, c.head_dim)
        nan = from_float(np.array([np.nan], np.float32), c.kv_dtype)[0]
        k_cache = np.full(kv_shape, nan, dtype=nan.dtype)
        v_cache = k_cache.copy()
        k_cache[:, :length] = from_float(rng.standard_normal(live), c.kv_dtype)
        v_cache[:, :length] = from_float(rng.standard_normal(live) + 0.25, c.kv_dtype)
        inputs = {
            "q": (1.5 * rng.standard_normal((c.num_heads, c.head_dim))).astype(np.float32),
            "k_cache": k_cache,
            "v_cache": v_cache,
        }
        if c.indirect_seq_len:
            inputs["seq_len_ptr"] = np.array([scalars["seq_len"]], dtype=np.uint32)
        return inputs

    def device_length(self, arrays, scalars) -> int:
        raw = int(arrays["seq_len_ptr"][0]) if self.config.indirect_seq_len else int(scalars["seq_len"])
        return min(raw, self.config.max_seq_len)

    def reference(self, arrays, scalars):
        c = self.config
        length = self.device_length(arrays, scalars)
        return {"out": attention_reference(
            to_float64(arrays["q"], "f32"), to_float64(arrays["k_cache"], c.kv_dtype),
            to_float64(arrays["v_cache"], c.kv_dtype), length, c.softmax_scale)}

    def tolerance(self, param: Param) -> float:
        """Relative L2 (decode_attention_error_bound is the per-element bound): the f32 default.
        Correct kernels measure at most 6e-7 over the tests' shapes in the pessimistic interpreter;
        the bound itself sums every rounding at its worst (relative L2 of the bound 5e-6..7e-5 for
        sample inputs), which independent roundings do not reach, so the tolerance is the tighter
        aggregate check (a probability exponent off by 2^-16 measures 0.8-1.0x of it)."""
        return F32_TOLERANCE

    def error_bound(self, param, arrays, reference, scalars):
        c = self.config
        return decode_attention_error_bound(
            self.plan, to_float64(arrays["q"], "f32"), to_float64(arrays["k_cache"], c.kv_dtype),
            to_float64(arrays["v_cache"], c.kv_dtype), self.device_length(arrays, scalars))

    def traffic(self, scalars) -> Traffic:
        c = self.config
        length = self.clamped_length(scalars)
        kv_bytes = c.num_kv_heads * length * c.head_dim * 2 * DTYPES[c.kv_dtype].size
        return Traffic(bytes=kv_bytes + 2 * c.num_heads * c.head_dim * 4, flops=4 * c.num_heads * length * c.head_dim)

    def torch_peer(self, torch, tensors, scalars):
        """bench's peers: torch SDPA per backend and FlashInfer decode over the first L rows (ptxgen.peers)."""
        from ..peers import decode_attention_peers

        return decode_attention_peers(torch, tensors["q"], tensors["k_cache"], tensors["v_cache"],
                                      self.clamped_length(scalars), self.config.softmax_scale)


def max_scale(head_dim: int) -> float:
    """The largest softmax scale whose exp2-domain scores of f16-range q and K stay within MAX_SCORE."""
    return MAX_SCORE / (LOG2E * head_dim * F16_MAX**2)


def attention_plan(config) -> AttentionPlan:
    """The attention family's layout of a config, its tuning fields applied (ValueError if none fits)."""
    return AttentionPlan.of(config, warps=config.warps, tile_keys=config.tile_keys, stages=config.stages,
                            dims_per_warp=config.dims_per_warp, ctas_per_sm=config.ctas_per_sm)


def attention_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, length: int, scale: float) -> np.ndarray:
    """Float64 decode attention: out[h] = softmax(scale * k[g, :L] @ q[h]) @ v[g, :L]."""
    num_heads, head_dim = q.shape
    group = num_heads // k.shape[0]
    out = np.zeros((num_heads, head_dim))
    if length == 0:
        return out
    for h in range(num_heads):
        keys, values = k[h // group, :length], v[h // group, :length]
        scores = scale * (keys @ q[h])
        weights = np.exp(scores - scores.max())
        out[h] = (weights / weights.sum()) @ values
    return out


U = UNIT_ROUNDOFF["f32"]
# Relative error of an f32 operand as the sum of its mma-type parts (split_pair): 2 f16 parts
# keep 22 bits; 3 bf16 parts keep all 24 (each residual has at most 8 bits fewer); an f32 cache
# drops the products of parts below 2^-24 of the whole (q2 k3 and q3 k2: 2^-8 * 2^-16 each).
PART_ERROR = {"f16": 2.0**-22, "bf16": 0.0, "f32": 2.0**-23}
# Absolute error of a part below the normal range of its type (half its subnormal spacing).
F16_PART_FLOOR, BF16_PART_FLOOR, F32_FLUSH = 2.0**-25, 2.0**-134, 2.0**-126


def decode_attention_error_bound(plan: AttentionPlan, q, k, v, length: int) -> np.ndarray:
    """Per-element bound on |kernel out - exact out| of the attention family's arithmetic
    (templates/families/attention.ptx.j2) for float64 q [H, D], k/v [G, >= L, D] (the stored values).

    Notation (one head): t_j = c q.k_j the exact scores in the exp2 domain (c = scale log2 e),
    M = max t, p_j = 2^(t_j - M), l = sum p, w = p / l, o = w V, A_j = c sum_d |q_d k_jd|, S = sum_j p_j |v_j|.
    1. Each weight reaches O and l as p_j (1 + d_j) with |d_j| <= D_j = 2^E_j e^(n_ex2 EX2_REL) - 1,
       E_j = g A_j + floor_j + 3u (M - t_j + 2 max E). g: q c rounded (u), q as parts (PART_ERROR),
       the score mmas (MMA_SUM of sum |ab|, one per k-step; chained over the slice for f32 caches)
       and the f32 adds of the rows, k-steps and dim slices (u sum |ab| each at most). 3u (M - t_j):
       c rounded to f32, s_j - m, and every later max difference of the rescales and merges,
       which telescope (each is at most the step of a running max from m_j up to M). n_ex2: the
       key's ex2 and each rescale or merge weight applied after it.
    2. O and l sum these weights in f32 with errors E_O <= e_O S (mma chains: MMA_SUM of the
       running sum each; rescale and merge roundings: u each; P as parts: PART_ERROR) and
       E_l <= e_l l (every f32 add, rescale and merge rounding: u each).
    3. With sum_j p_j (v_j - o) = 0:  O/l' - o = (sum_j p_j d_j (v_j - o) + E_O - o E_l) / (l' + E_l), so
       |out - o| <= (sum w_j D_j |v_j - o| + e_O sum w_j (1 + D_j) |v_j| + e_l |o'|) / ((1 - sum w D)(1 - e_l)),
       plus the rcp.rn and the final multiply: 2u of the result. Weights the kernel flushes to 0
       (below 2^-126 of a running max) and parts below their type's normal range add floors."""
    num_heads, head_dim = q.shape
    out = np.zeros((num_heads, head_dim))
    if length == 0:
        return out  # the kernel writes 0 exactly
    parts = plan.mma_type if plan.kv_dtype != "f32" else "f32"
    chunk, splits = plan.split(length)
    tiles = ceil_div(min(chunk, length), plan.tile)
    key_groups, terms = plan.key_groups, len(plan.terms)
    natural = plan.kv_dtype != "f32"
    # The score: q c and its parts, the mmas, the adds (rows, k-steps, dim slices).
    mma_steps = 1 if natural else terms * plan.k_steps
    adds = (2 * plan.k_steps - 1 if natural else 1) + plan.dim_warps - 1
    score_error = U + PART_ERROR[parts] + MMA_SUM * (1 + 2.0**-7) * mma_steps + U * adds
    # The final combine (several splits): merge calls a lane chains, and the partials it adds.
    lanes = plan.split_lanes
    calls = (ceil_div(splits, plan.splits_per_round * lanes) * ceil_div(plan.splits_per_round, 4)
             + lanes.bit_length() - 1) if splits > 1 else 0
    merge_roundings = key_groups + (2 * calls + splits if splits > 1 else 0)
    ex2_per_key = tiles + (key_groups > 1) + (1 + calls if splits > 1 else 0)
    o_error = (MMA_SUM * (1 + 2.0**-7) * tiles * (plan.group_keys // 16) * terms + PART_ERROR[parts]
               + U * (tiles + merge_roundings))
    l_error = U * (tiles * (plan.scores + 1) + 2 + merge_roundings)
    c = plan.q_scale
    group = num_heads // k.shape[0]
    for h in range(num_heads):
        keys, values = k[h // group, :length], v[h // group, :length]
        qx = c * q[h]
        t = keys @ qx
        top = t.max()
        p = np.exp2(t - top)
        weights = p / p.sum()
        o = weights @ values
        floor = F32_FLUSH * np.abs(keys).sum(axis=1)
        if parts == "f16":
            floor += 2.0**-39 * np.abs(qx).max() * np.abs(keys).sum(axis=1)
        exponent = score_error * (np.abs(keys) @ np.abs(qx)) + floor
        exponent += 3 * U * (top - t + 2 * exponent.max())
        # Capped, not inf: a key of weight 0 (a score error of 2^1000 on it) must add 0, not NaN.
        with np.errstate(over="ignore"):
            relative = np.minimum(np.expm1(math.log(2) * exponent + ex2_per_key * EX2_REL), 1e300)
        spread = (weights * relative) @ np.abs(values - o)
        # Weights flushed below 2^-126, and P parts below their type's normal range (f16: P is
        # scaled by 2^15 first), as absolute errors of each weight (l >= 1 in units of M).
        flushed = F32_FLUSH * np.abs(values - o).sum(axis=0) / p.sum()
        part_floor = (F16_PART_FLOOR / plan.p_scale if parts == "f16" else BF16_PART_FLOOR)
        absolute = ((weights * (1 + relative)) @ np.abs(values)) * o_error + part_floor * np.abs(values).sum(axis=0) / p.sum()
        shrink = (1 - (weights * relative).sum() - length * F32_FLUSH) * (1 - l_error)
        if not shrink > 0:  # scores so large that their errors can reorder the softmax: no bound
            out[h] = np.inf
            continue
        softmax = (spread + flushed + absolute + l_error * np.abs(o)) / shrink
        softmax += l_error * softmax / shrink  # |o'| <= |o| + its own error
        out[h] = softmax + 2 * U * (1 + 2 * U) * (np.abs(o) + softmax)
    return out
