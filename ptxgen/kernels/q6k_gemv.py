"""q6k_gemv: y = dequant(w) @ xq for GGML Q6_K rows (a Q4_K_M file's lm_head and about half of its
attn_v / ffn_down), xq the int8 quantisation of x as in q4k_gemv; the reference is that product
in float64 (gguf-py's dequantisation), the error analysis q4k_gemv's (ptxgen/kernels/q4k_gemv.py).

Contract: `w` u8[n, (k/256)*210] holds GGML `block_q6_K` rows exactly as in a GGUF file: per 256
weights `{u8 ql[128], u8 qh[64], i8 scales[16], f16 d}`; in half n (weights 128n ..), for
l < 32: weight l (+32, +64, +96) is d * scales[8n + l/16 (+2, +4, +6)] * (q - 32) with q the low
nibble of ql[64n + l] (low of ql[64n + 32 + l], high of ql[64n + l], high of ql[64n + 32 + l]) and
bits 0-1 (2-3, 4-5, 6-7) of qh[32n + l] as its top two bits.

The kernel is the quantised GEMV family's skeleton (staging, rows, schedules, reductions:
QuantGemvPlan with quant "q6_k") with its own lane work (templates/families/quant_gemv.ptx.j2,
q6k_weights / q6k_dot): lane (n, h) of a block takes the 64 weights l, l+32, l+64, l+96 for
l = 16h .. 16h+15 of half n, so its
data are three 16-byte pieces (two of ql, one of qh), 4 scales and d. Blocks are 210 bytes: only
2-byte aligned, and the three pieces are the same offset from 16-byte alignment, so each is loaded
as the 16-byte-aligned 32 bytes around it (6 loads of 16 bytes, the two ql windows adjacent: 96
bytes) and shifted into place (per piece 6 + 5 selp and 4 prmt, one selector per lane); the scales
and d are 5 scalar loads (a window would read past the last block). Codes: nibble | 2 bits << 4 by
one lop3 a word, dp4a.u32.s32 with the int8 x, the -32 folded into the chain's start (-32 * sum of
the x codes, staged with x). One slot (unroll 1, 30 registers) of 102 bytes a lane in flight: 32
warps an SM hold 102 KB of loads, for 52.5 bytes of weights a lane-item. Expected instructions a
lane-item: about 160 (loads and addresses 20, alignment 46, codes and dp4a 68, x loads 6, scales
and sums 20) for 52.5 bytes, ~3 per weight byte (Q4_K: ~63 for 36, 1.75); with the staging and the
reductions, `ptxgen show`'s model counts 4.2 thread instructions a byte at 4096 x 4096 and 3.9 at
12288 x 4096 (Q4_K: 3.3, 2.5), an issue time of about a third of the bytes' time on an H100.
Speed: not measured.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from .q4k_gemv import Q4kGemv, Q4kGemvConfig


class Q6kGemvConfig(Q4kGemvConfig):
    quant: ClassVar[str] = "q6_k"
    kind: Literal["q6k_gemv"]


class Q6kGemv(Q4kGemv):
    name = "q6k_gemv"
    Config = Q6kGemvConfig
