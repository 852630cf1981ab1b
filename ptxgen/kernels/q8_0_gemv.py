"""q8_0_gemv: y = dequant(w) @ xq for GGML Q8_0 rows, xq the int8 quantisation of x as in
q4k_gemv; the reference is that product in float64 (gguf-py's dequantisation), the error analysis
q4k_gemv's (ptxgen/kernels/q4k_gemv.py).

Contract: `w` u8[n, (k/32)*34] holds GGML `block_q8_0` rows exactly as in a GGUF file: per 32
weights `{f16 d, i8 qs[32]}`, weight j = d * qs[j]. k is a multiple of 64 (a lane takes two
blocks), at least 64.

The kernel is the quantised GEMV family's skeleton (QuantGemvPlan with quant "q8_0") with its own
lane work (templates/families/quant_gemv.ptx.j2, q8_0_weights / q8_0_dot): lane L takes blocks 2L and 2L+1 of a
2048-weight step (68 bytes), whose x groups are exactly the staged ones, so each block is one
exact dp4a chain of 8 words times d * dx. The pair is 4-byte aligned (34-byte blocks), so it is
loaded as the 16-byte-aligned 64 bytes before its end plus 1-4 words (5 to 8 loads, 68-80
bytes) and shifted into place by whole words (35 selp), the first block's codes by one prmt a
word. One slot (unroll 1, 21 registers) a lane: 32 warps an SM hold 80 KB of loads in flight.
Expected instructions
a lane-item: about 80 (loads and addresses 15, alignment 39, codes and dp4a 24, x loads 5, scales
and sums 10) for 68 bytes, 1.2 per weight byte (Q4_K: 1.75); with the staging and the reductions,
`ptxgen show`'s model counts 2.1 thread instructions a byte at 4096 x 4096 and 2.0 at 12288 x 4096
(Q4_K: 3.3, 2.5). Speed: not measured.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from .q4k_gemv import Q4kGemv, Q4kGemvConfig


class Q80GemvConfig(Q4kGemvConfig):
    quant: ClassVar[str] = "q8_0"
    kind: Literal["q8_0_gemv"]


class Q80Gemv(Q4kGemv):
    name = "q8_0_gemv"
    Config = Q80GemvConfig
