"""fused_rmsnorm_q4k_gemv_group: q4k_gemv_group of the RMS-normed input,
y_<name> = dequant(w_<name>) @ (x * rsqrt(mean(x^2) + eps) * gamma) for each matrix, computed as
fused_rmsnorm_q4k_gemv computes one (x*gamma quantised to int8, the RMS factor once per row):
one launch for a decoder layer's norm and its q, k and v projections, or its norm and gate/up.
Params: y_<name> f32[rows] for each matrix in order, then the w_<name>, then x f32[k], gamma f32[k].
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .fused_rmsnorm_q4k_gemv import FusedRmsnormQ4kGemv
from .q4k_gemv_group import Q4kGemvGroup, Q4kGemvGroupConfig


class FusedRmsnormQ4kGemvGroupConfig(Q4kGemvGroupConfig):
    kind: Literal["fused_rmsnorm_q4k_gemv_group"]
    eps: float = Field(default=1e-6, gt=0, lt=1)


class FusedRmsnormQ4kGemvGroup(Q4kGemvGroup, FusedRmsnormQ4kGemv):
    """The group's matrices (Q4kGemvGroup) with the fused kind's activations (FusedRmsnormQ4kGemv)."""

    name = "fused_rmsnorm_q4k_gemv_group"
    Config = FusedRmsnormQ4kGemvGroupConfig
