"""kv_append: write one token's K and V rows into the KV cache (llama.cpp's SET_ROWS / CPY).

A ptxgen addition beyond ../shared/KERNELS.md, for running a decoder step as separate launches
(the persistent decoder writes its cache rows itself, with the same store_f32 rounding).

Contract:
- Config: `num_kv_heads` (1..256), `head_dim` (1..1024), `max_seq_len` (1..2^24), `kv_dtype`
  (f32 | f16 | bf16, default f16).
- Params, in order: `k` f32[num_kv_heads, head_dim] (in), `v` f32[num_kv_heads, head_dim] (in),
  `k_cache` kv_dtype[num_kv_heads, max_seq_len, head_dim] (inout), `v_cache` (the same, inout),
  `pos` u32 (scalar, 0..max_seq_len-1).
- Semantics: k_cache[g, pos, :] = k[g, :] and v_cache[g, pos, :] = v[g, :], rounded to kv_dtype to
  nearest even (as ptxgen.dtypes.from_float); every other row keeps its bytes. The launcher
  refuses pos >= max_seq_len, and the kernel itself writes nothing then (whatever the scalar, no
  access leaves the arrays).

Geometry: a thread moves one vector of `vec` consecutive elements of one row: vec = 8 for f16/
bf16 (two 16-byte loads of f32, one 16-byte store), 4 for f32 (16 bytes each way), the largest
of those, 4, 2 or 1 that divides head_dim otherwise (odd head_dim: scalars). Units [0, U) are
k's vectors in order, [U, 2U) v's; one linear grid of up to 256-thread CTAs covers both, so the
Qwen3-8B shape (8 x 128, f16) is one CTA of 256 threads. Destination row g * max_seq_len + pos
is below 2^32 (num_kv_heads * max_seq_len <= 2^32) and its byte offset is computed in 64 bits.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from ..dtypes import DTYPES, from_float, to_float64
from .base import Geometry, Kind, Param, PdlConfig, Traffic, ceil_div, round_up
from .incremental_attention import FloatDType

MAX_KV_HEADS = 256
MAX_HEAD_DIM = 1024
MAX_SEQ_LEN = 1 << 24
MAX_THREADS = 256
PATTERN_ROWS = 61  # sample caches repeat this many random rows (a prime): long caches stay cheap


class KvAppendConfig(PdlConfig):
    kind: Literal["kv_append"]
    num_kv_heads: int = Field(ge=1, le=MAX_KV_HEADS)
    head_dim: int = Field(ge=1, le=MAX_HEAD_DIM)
    max_seq_len: int = Field(ge=1, le=MAX_SEQ_LEN)
    kv_dtype: FloatDType = "f16"


def kv_append_plan(config: KvAppendConfig) -> dict:
    size = DTYPES[config.kv_dtype].size
    widest = 16 // size  # one 16-byte store (and f32 loads of 16 bytes each)
    vec = next(v for v in (widest, 4, 2, 1) if config.head_dim % v == 0)
    per_tensor = config.num_kv_heads * config.head_dim // vec
    units = 2 * per_tensor
    threads = min(MAX_THREADS, round_up(units, 32))
    return {"vec": vec, "size": size, "row_units": config.head_dim // vec, "per_tensor": per_tensor,
            "units": units, "threads": threads, "grid": ceil_div(units, threads)}


class KvAppend(Kind):
    name = "kv_append"
    Config = KvAppendConfig

    @property
    def plan(self) -> dict:
        return kv_append_plan(self.config)

    def params(self) -> list[Param]:
        c = self.config
        row, cache = (c.num_kv_heads, c.head_dim), (c.num_kv_heads, c.max_seq_len, c.head_dim)
        return [Param("k", "f32", row), Param("v", "f32", row), Param("k_cache", c.kv_dtype, cache, "inout"),
                Param("v_cache", c.kv_dtype, cache, "inout"), Param("pos", "u32", role="scalar")]

    def geometry(self) -> Geometry:
        plan = self.plan
        return Geometry(grid=(plan["grid"], 1, 1), block=(plan["threads"], 1, 1))

    def launch_note(self) -> str:
        plan = self.plan
        return (f"one {plan['vec']}-element vector of a "
                f"k row (units < {plan['per_tensor']}) or v row per thread; nothing written when pos >= "
                f"{self.config.max_seq_len}")

    def template_vars(self) -> dict:
        c = self.config
        return {**self.plan, "num_kv_heads": c.num_kv_heads, "head_dim": c.head_dim, "max_seq_len": c.max_seq_len,
                "kv_dtype": c.kv_dtype}

    def scalar_limits(self) -> dict[str, tuple[int, int]]:
        return {"pos": (0, self.config.max_seq_len - 1)}

    def example_scalars(self) -> dict[str, int]:
        return {"pos": min(self.config.max_seq_len - 1, 4095)}

    def verify_scalars(self) -> list[dict[str, int]]:
        last = self.config.max_seq_len - 1
        return [{"pos": pos} for pos in dict.fromkeys((0, min(1, last), last // 2, last))]

    def tolerance(self, param: Param) -> float:
        # The new rows are exact roundings (from_float of the f32 rows): relative L2 0.
        return 0.0

    def rewritten(self, param, arrays, scalars):
        """Row pos of each cache (poisoned before the launch); every other row must keep its bits."""
        return np.s_[:, int(scalars["pos"])]

    def sample_inputs(self, rng, scalars):
        """k and v spanning 1e-6..1e2 in magnitude (f16 subnormals and normals); caches of random
        rows repeating every PATTERN_ROWS, so a row written at the wrong place shows."""
        c = self.config
        shape = (c.num_kv_heads, c.head_dim)
        period = min(c.max_seq_len, PATTERN_ROWS)
        rows = np.arange(c.max_seq_len) % period
        inputs = {}
        for name in ("k", "v"):
            magnitude = 10.0 ** rng.uniform(-6, 2, shape)
            inputs[name] = (rng.standard_normal(shape) * magnitude).astype(np.float32)
            pattern = from_float(rng.standard_normal((c.num_kv_heads, period, c.head_dim)), c.kv_dtype)
            inputs[f"{name}_cache"] = pattern[:, rows]
        return inputs

    def reference(self, arrays, scalars):
        dtype, pos = self.config.kv_dtype, int(scalars["pos"])
        result = {}
        for name in ("k", "v"):
            cache = to_float64(arrays[f"{name}_cache"], dtype)
            with np.errstate(over="ignore"):  # beyond f16's range is inf: the rounding, not an error
                cache[:, pos] = to_float64(from_float(arrays[name], dtype), dtype)
            result[f"{name}_cache"] = cache
        return result

    def traffic(self, scalars) -> Traffic:
        c = self.config
        elements = 2 * c.num_kv_heads * c.head_dim
        return Traffic(bytes=elements * (4 + DTYPES[c.kv_dtype].size), flops=0)

    def torch_peer(self, torch, tensors, scalars):
        """bench's peer: the two row copies torch would do (copy_ rounds to nearest even), in
        place; returns the whole k_cache, this kind's first written parameter."""
        k, v, k_cache, v_cache = (tensors[name] for name in ("k", "v", "k_cache", "v_cache"))
        pos = int(scalars["pos"])

        def append():
            k_cache[:, pos].copy_(k)
            v_cache[:, pos].copy_(v)
            return k_cache

        return append
