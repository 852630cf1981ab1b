"""bench's peers: what the kinds' torch_peer hooks return (Kind.torch_peer's contract), built here.

A fair peer does the same work from the same bytes, so that "% of peer" means something:
- Q4_K GEMV: torch's int4 weight-only GEMV (tinygemm, `torch._weight_int4pack_mm`) over the same
  weights regrouped as 4-bit codes in groups of 32 with a bf16 scale and zero each (0.625 bytes a
  weight against Q4_K's 0.5625: a Q4_K sub-block is exactly such a group), and a cuBLAS bf16 GEMV
  of the dequantised weights (2 bytes a weight, 3.6x the bytes: it shows what the memory system
  gives a plain streaming GEMV).
- Attention: torch SDPA with each backend pinned (flash, efficient, cuDNN; bench reports each and
  the best), FlashInfer's single-request decode/prefill and flash-attn where installed.
Setup (regrouping, casts, copies) happens here, outside the timed calls. The peers are the
optional dependency group `peers` (pip install 'ptxgen[peers]'); what is absent is skipped with a
note (Skipped).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .dtypes import f32_to_bf16
from .q4k import unpack

GROUP = 32  # weights a tinygemm group: one Q4_K sub-block
INNER_K_TILES = 8  # tinygemm's packing: 8 k-tiles of 16 (16-byte loads); needs k % 128 == 0 (Q4_K: k % 256)
SDPA_BACKENDS = (("flash", "FLASH_ATTENTION"), ("efficient", "EFFICIENT_ATTENTION"), ("cuDNN", "CUDNN_ATTENTION"))


@dataclass(frozen=True)
class Skipped:
    """A peer that cannot run here, and why (bench notes it instead of timing it)."""

    reason: str


# --- Q4_K GEMV ------------------------------------------------------------------------------------
def q4k_groups(w: np.ndarray, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_K rows as (codes uint8 [n, k] in 0..15, scale f32 [n, k/32], minimum f32 [n, k/32]) with
    weight = code * scale - minimum, as the Q4_K format defines it per 32-weight sub-block."""
    d, dmin, sc, mn, q = unpack(w.reshape(n, -1))
    scale = (d[..., None] * sc.astype(np.float32)).reshape(n, k // GROUP)
    minimum = (dmin[..., None] * mn.astype(np.float32)).reshape(n, k // GROUP)
    return q.reshape(n, k), scale, minimum


def int4_operands(q: np.ndarray, scale: np.ndarray, minimum: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """tinygemm's inputs: codes two a byte (the even k in the high nibble) uint8 [n, k/2], and
    bf16 bits [k/32, n, 2] of (scale, zero) with weight = (code - 8) * scale + zero."""
    packed = ((q[:, 0::2] << 4) | q[:, 1::2]).astype(np.uint8)
    zero = 8 * scale - minimum
    return packed, np.ascontiguousarray(f32_to_bf16(np.stack((scale, zero), axis=-1)).transpose(1, 0, 2))


def bf16_row(torch, activations: Callable):
    """activations() as a bf16 [1, k] tensor: cast once when it is the stored input (the same
    tensor every call), else computed and cast in each (timed) call (e.g. a fused RMSNorm)."""
    first = activations()
    if activations() is first:
        row = first.to(torch.bfloat16)[None]
        return lambda: row
    return lambda: activations().to(torch.bfloat16)[None]


def q4k_dense(q: np.ndarray, scale: np.ndarray, minimum: np.ndarray) -> np.ndarray:
    """The f32 [n, k] weights of q4k_groups' (codes, scale, minimum)."""
    n, k = q.shape
    groups = q.reshape(n, k // GROUP, GROUP) * scale[..., None] - minimum[..., None]
    return groups.reshape(n, k).astype(np.float32)


def q4k_gemv_peers(torch, w, n: int, k: int, activations: Callable) -> dict:
    """y = W @ activations() with W the Q4_K rows `w` (a CUDA uint8 tensor [n, k/256*144])."""
    q, scale, minimum = q4k_groups(w.cpu().numpy(), n, k)
    x = bf16_row(torch, activations)
    dense = torch.from_numpy(f32_to_bf16(q4k_dense(q, scale, minimum)).view(np.int16)).to(w.device).view(torch.bfloat16)
    peers = {"cuBLAS bf16 GEMV (3.6x the bytes)": lambda: torch.mv(dense, x()[0])}
    if not hasattr(torch, "_weight_int4pack_mm") or k % (INNER_K_TILES * 16):
        peers["torch int4 GEMV"] = Skipped(f"this torch has no _weight_int4pack_mm for k={k}")
        return peers
    packed, scales_zeros = int4_operands(q, scale, minimum)
    packed = torch._convert_weight_to_int4pack(torch.from_numpy(packed).to(w.device), INNER_K_TILES)
    pairs = torch.from_numpy(scales_zeros.view(np.int16)).to(w.device).view(torch.bfloat16)
    peers["torch int4 GEMV (tinygemm, groups of 32)"] = lambda: torch._weight_int4pack_mm(x(), packed, GROUP, pairs)[0, :n]
    return peers


# --- attention ------------------------------------------------------------------------------------
def sdpa_peers(torch, q, k, v, **options) -> dict:
    """torch SDPA on [1, heads, rows, D] tensors with each backend pinned; K/V repeated per query
    head (group x their bytes, said in the label) for a backend that refuses GQA."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sdpa = torch.nn.functional.scaled_dot_product_attention
    group = q.shape[1] // k.shape[1]
    repeated = None  # K/V repeated per query head, made once if a backend needs them
    peers = {}
    for label, name in SDPA_BACKENDS:
        def call(backend=getattr(SDPBackend, name), k=k, v=v, gqa=True):
            with sdpa_kernel(backend):
                return sdpa(q, k, v, enable_gqa=gqa, **options)

        try:
            call()  # a backend that cannot take these inputs raises here, at setup
            peers[f"torch sdpa {label}"] = call
            continue
        except RuntimeError as error:
            refused = str(error).splitlines()[0] if str(error) else type(error).__name__
        repeated = repeated or (k.repeat_interleave(group, 1), v.repeat_interleave(group, 1))
        try:
            call(k=repeated[0], v=repeated[1], gqa=False)
        except RuntimeError:
            peers[f"torch sdpa {label}"] = Skipped(f"torch sdpa {label} refused these inputs: {refused}")
        else:
            peers[f"torch sdpa {label} (K/V repeated)"] = lambda call=call, k=repeated[0], v=repeated[1]: call(
                k=k, v=v, gqa=False)
    return peers


def library(name: str):
    """An optional peer library, or Skipped."""
    if importlib.util.find_spec(name) is None:
        return Skipped(f"{name} is not installed (pip install 'ptxgen[peers]' where it has a wheel for this machine)")
    return importlib.import_module(name)


def decode_attention_peers(torch, q, k_cache, v_cache, length: int, scale: float) -> dict:
    """One query token against the first `length` cache rows: q f32 [H, D], caches [G, max, D]."""
    if length == 0:
        return {"torch (empty cache)": lambda: torch.zeros_like(q)}
    q = q.to(k_cache.dtype)  # SDPA and FlashInfer take one dtype; the cast is setup, not timed
    k, v = k_cache[:, :length], v_cache[:, :length]
    peers = sdpa_peers(torch, q[None, :, None], k[None], v[None], scale=scale)
    flashinfer = library("flashinfer")
    if isinstance(flashinfer, Skipped):
        peers["flashinfer decode"] = flashinfer
    else:
        k, v = k.contiguous(), v.contiguous()
        peers["flashinfer decode"] = lambda: flashinfer.single_decode_with_kv_cache(q, k, v, kv_layout="HND",
                                                                                    sm_scale=scale)
    return peers


def prefill_attention_peers(torch, q, k, v, causal: bool, scale: float) -> dict:
    """Self-attention of S tokens: q [H, S, D], k and v [G, S, D] (f16/bf16); outputs [H, S, D]
    (FlashInfer's and flash-attn's as transposed views of their [S, H, D])."""
    peers = sdpa_peers(torch, q[None], k[None], v[None], is_causal=causal, scale=scale)
    rows = q.transpose(0, 1).contiguous()  # [S, H, D]
    flashinfer = library("flashinfer")
    if isinstance(flashinfer, Skipped):
        peers["flashinfer prefill"] = flashinfer
    else:
        peers["flashinfer prefill"] = lambda: flashinfer.single_prefill_with_kv_cache(
            rows, k, v, causal=causal, kv_layout="HND", sm_scale=scale).transpose(0, 1)
    flash_attn = library("flash_attn")
    if isinstance(flash_attn, Skipped):
        peers["flash-attn"] = flash_attn
    else:
        kf, vf = (t.transpose(0, 1)[None].contiguous() for t in (k, v))  # [1, S, G, D]
        peers["flash-attn"] = lambda: flash_attn.flash_attn_func(rows[None], kf, vf, softmax_scale=scale,
                                                                 causal=causal)[0].transpose(0, 1)
    return peers
