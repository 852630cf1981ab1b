"""How far the GPU's approximate instructions are from exact: the bounds the interpreter's
pessimistic mode moves results within (interp/approx.py) and the kinds' error analyses use.

Max errors measured on an H100 (driver 580.159.04, 2026-11-23; /work/shared/NOTES.md, issue 14).
"""

import math

# sin/cos.approx.f32 absolute error, by |x| below each limit (past 1e6 not measured: any value
# in [-1, 1] is allowed).
SIN_COS_ABS = ((math.pi, 3.4e-7), (100.0, 1e-5), (1e4, 1.2e-3), (1e6, 0.14), (math.inf, 2.0))
TANH_REL = 1.1e-5          # tanh.approx.f32 (the ISA allows 2^-10.99; measured max 1.1e-5)
EX2_REL = 1.5e-7           # ex2.approx(.ftz).f32
RSQRT_REL = 1.2e-7         # rsqrt.approx(.ftz).f32
RCP_REL = 9.5e-8           # rcp.approx(.ftz).f32
LG2_ABS = 5e-7             # lg2.approx(.ftz).f32
# Not measured; the PTX ISA's bounds: sqrt.approx.f32 max relative error 2^-23; div.full.f32 and
# div.approx.f32 (for 2^-126 <= |b| <= 2^126) at most 2 ulp.
SQRT_REL = 2.0**-23
DIV_ULPS = 2.0
# mma.sync f16/bf16 -> f32 on an H100 (measured): |error| <= 3.6 * 2^-24 * (sum |a b| + |c|),
# 30-51% of outputs differ from the exact sum rounded once.
MMA_SUM = 3.6 * 2.0**-24
