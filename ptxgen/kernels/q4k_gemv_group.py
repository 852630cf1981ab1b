"""q4k_gemv_group: several Q4_K GEMVs that share their input, in one launch:
y_<name> = dequant(w_<name>) @ xq for each matrix of `matrices` (name -> rows), xq as in q4k_gemv.

A decoder layer's projections come in such groups: q, k and v read the normed hidden state, and
so do gate and up. One launch instead of two or three saves the launch gaps and the repeated
quantisation of x, and a group's rows fill the GPU where one small matrix would not (k and v:
2 x 1024 rows). Each matrix gets its own run of CTAs (one QuantGemvPlan geometry, its defaults chosen
for the rows of all the matrices together), so a CTA never mixes matrices and each row is
computed exactly as q4k_gemv with the same split_k (and warps, for the fused kinds' RMS factor)
computes it: bit for bit, tests check it.
Params: y_<name> f32[rows] for each matrix in order, then w_<name> u8[rows, (k/256)*144] in the
same order, then x f32[k].
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from .q4k_gemv import MAX_N, Q4kGemv, QuantGemvTuning

MAX_MATRICES = 8
# A matrix name becomes part of two parameter names (y_<name>, w_<name>).
MatrixName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z][A-Za-z0-9]{0,15}$")]


class Q4kGemvGroupConfig(QuantGemvTuning):
    kind: Literal["q4k_gemv_group"]
    matrices: dict[MatrixName, Annotated[int, Field(ge=1, le=MAX_N)]] = Field(min_length=1, max_length=MAX_MATRICES)


class Q4kGemvGroup(Q4kGemv):
    name = "q4k_gemv_group"
    Config = Q4kGemvGroupConfig

    @property
    def matrices(self) -> dict[str, int]:
        return {f"_{name}": rows for name, rows in self.config.matrices.items()}
