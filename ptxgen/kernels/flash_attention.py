"""flash_attention (prefill, tensor cores): FlashAttention-2 forward on mma.sync m16n8k16.

o[h] = softmax(scale * q[h] @ k[g].T + mask) @ v[g], g = h // (num_heads / num_kv_heads);
with `causal`, query i sees keys j <= i. Any seq_len >= 1.

Geometry: one CTA of block_m/16 warps owns block_m query rows (16 per warp) of one head; grid
is (ceil(seq_len/block_m), num_heads). Q is loaded once into registers (ldmatrix); K/V tiles of 64 keys
stream through a double-buffered, XOR-swizzled shared memory ring filled by cp.async.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..dtypes import DTYPES, from_float, to_float64
from ..abi import scalar
from .base import Geometry, Kind, KernelConfig, Param, Traffic, ceil_div

BLOCK_N = 64  # keys per K/V tile
MAX_SEQ_LEN = 1 << 24  # keeps every in-kernel u32 row index far from overflow
SHARED_ALIGN = 1024  # the XOR swizzle is applied to absolute shared addresses (bits 4..7)


class Sm90aTuning(BaseModel):
    """Knobs of the Hopper (sm_90a) variant; see ptxgen/kernels/flash_attention_sm90a.py."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    block_n: Literal[32, 64, 128, 256] = 128
    consumers: int = Field(default=2, ge=1, le=3)
    stages: int = Field(default=2, ge=1, le=4)
    producer_warps: Literal[1, 4] = 1
    overlap: bool | None = None  # None: wherever the registers allow it


class FlashAttentionConfig(KernelConfig):
    kind: Literal["flash_attention"]
    num_heads: int = Field(ge=1, le=65535)  # grid.y
    num_kv_heads: int = Field(ge=1)
    head_dim: Literal[64, 128]
    dtype: Literal["f16", "bf16"] = "f16"
    out_dtype: Literal["f32", "f16", "bf16"] = "f32"
    causal: bool = True
    scale: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    # Query rows per CTA, 16 per warp: 64 (4 warps, two CTAs per SM on sm_80/sm_90) or 128 (8
    # warps: half the K/V traffic from L2 per flop, one CTA per SM).
    block_m: Literal[64, 128] = 64
    # Used only when the spec lists sm_90a (the Hopper variant's own PTX).
    sm90a: Sm90aTuning = Sm90aTuning()

    @model_validator(mode="after")
    def kv_heads_divide_heads(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_kv_heads must divide num_heads, got num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}")
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


class FlashAttention(Kind):
    name = "flash_attention"
    Config = FlashAttentionConfig
    ptx_version = (7, 0)  # cp.async, ldmatrix, mma.m16n8k16 bf16, cvt.rn.bf16x2.f32

    @property
    def scale(self) -> float:
        c = self.config
        return c.scale if c.scale is not None else 1.0 / math.sqrt(c.head_dim)

    @property
    def group(self) -> int:
        return self.config.num_heads // self.config.num_kv_heads

    def params(self) -> list[Param]:
        c = self.config
        return [
            Param("q", c.dtype, (c.num_heads, "seq_len", c.head_dim)),
            Param("k", c.dtype, (c.num_kv_heads, "seq_len", c.head_dim)),
            Param("v", c.dtype, (c.num_kv_heads, "seq_len", c.head_dim)),
            Param("o", c.out_dtype, (c.num_heads, "seq_len", c.head_dim), "out"),
            Param("seq_len", "u32", role="scalar"),
        ]

    # --- geometry --------------------------------------------------------------------------
    @property
    def threads(self) -> int:
        return 32 * (self.config.block_m // 16)

    @property
    def tile_bytes(self) -> int:
        return BLOCK_N * self.config.head_dim * 2

    def dynamic_shared(self) -> int:
        # Q tile + 2 stages of K + 2 stages of V (rows of head_dim f16/bf16).
        return self.config.block_m * self.config.head_dim * 2 + 4 * self.tile_bytes

    def geometry(self) -> Geometry:
        return Geometry(grid=(ceil_div(scalar("seq_len"), self.config.block_m), self.config.num_heads, 1),
                        block=(self.threads, 1, 1), dynamic_shared=self.dynamic_shared())

    def launch_note(self) -> str:
        order = ", query blocks in reverse (longest causal rows first)" if self.config.causal else ""
        return f"one CTA per {self.config.block_m} query rows of one head{order}"

    def template_vars(self) -> dict:
        c = self.config
        return {
            "head_dim": c.head_dim,
            "dtype": c.dtype,
            "out_dtype": c.out_dtype,
            "causal": c.causal,
            "group": self.group,
            "scale_log2": self.scale * math.log2(math.e),
            "block_m": c.block_m,
            "block_n": BLOCK_N,
            "threads": self.threads,
            "tile_bytes": self.tile_bytes,
            "shared_align": SHARED_ALIGN,
        }

    # --- runtime -----------------------------------------------------------------------------
    def scalar_limits(self) -> dict[str, tuple[int, int]]:
        return {"seq_len": (1, MAX_SEQ_LEN)}

    def example_scalars(self) -> dict[str, int]:
        return {"seq_len": 4096}

    def verify_scalars(self) -> list[dict[str, int]]:
        return [{"seq_len": 70}]

    def sample_inputs(self, rng, scalars):
        c = self.config
        seq_len = scalars["seq_len"]
        q = rng.standard_normal((c.num_heads, seq_len, c.head_dim))
        k = rng.standard_normal((c.num_kv_heads, seq_len, c.head_dim))
        v = rng.standard_normal((c.num_kv_heads, seq_len, c.head_dim)) + 0.25
        return {"q": from_float(q, c.dtype), "k": from_float(k, c.dtype), "v": from_float(v, c.dtype)}

    def reference(self, arrays, scalars):
        c = self.config
        q, k, v = (to_float64(arrays[name], c.dtype) for name in ("q", "k", "v"))
        return {"o": attention_reference(q, k, v, self.scale, c.causal)}

    def tolerance(self, param: Param) -> float:
        # Relative L2 error allowed. u = unit roundoff: 2^-11 for f16, 2^-8 for bf16 (8 significant
        # bits). (1) P is rounded to the input dtype before the P.V mma (the row sum l is not), an
        # error that averages over the keys: measured about 0.25 u_in; allowed 0.8 u_in. (2) An
        # f16/bf16 output is rounded once on store: measured about u_out/sqrt(3) (uniform rounding
        # error); allowed u_out. f32 accumulation and ex2.approx add ~1e-6.
        unit = {"f32": 0.0, "f16": 2.0**-11, "bf16": 2.0**-8}
        return 0.8 * unit[self.config.dtype] + unit[param.dtype]

    def traffic(self, scalars) -> Traffic:
        c = self.config
        seq_len = scalars["seq_len"]
        size = DTYPES[c.dtype].size
        rows = seq_len * c.head_dim
        nbytes = (c.num_heads + 2 * c.num_kv_heads) * rows * size + c.num_heads * rows * DTYPES[c.out_dtype].size
        pairs = seq_len * (seq_len + 1) // 2 if c.causal else seq_len * seq_len
        return Traffic(bytes=nbytes, flops=4 * c.num_heads * c.head_dim * pairs)

    def torch_peer(self, torch, tensors, scalars):
        """bench's peers: torch SDPA (GQA, causal as configured); flash-attn's flash_attn_func if installed."""
        c = self.config
        q, k, v = tensors["q"], tensors["k"], tensors["v"]  # [H, S, D], [G, S, D]
        out_dtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[c.out_dtype]
        scale = self.scale

        def sdpa():  # needs torch >= 2.5 (enable_gqa)
            out = torch.nn.functional.scaled_dot_product_attention(
                q[None], k[None], v[None], is_causal=c.causal, scale=scale, enable_gqa=True)
            return out[0].to(out_dtype)

        peers = {"torch sdpa": sdpa}
        try:
            from flash_attn import flash_attn_func
        except ImportError:
            flash_attn_func = None
        if flash_attn_func is not None:
            qf, kf, vf = (t.transpose(0, 1)[None].contiguous() for t in (q, k, v))  # [1, S, heads, D]
            peers["flash-attn"] = lambda: flash_attn_func(
                qf, kf, vf, softmax_scale=scale, causal=c.causal)[0].transpose(0, 1).to(out_dtype)
        return peers
