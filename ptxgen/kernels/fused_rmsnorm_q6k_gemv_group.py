"""fused_rmsnorm_q6k_gemv_group: fused_rmsnorm_q4k_gemv_group for GGML Q6_K matrices (q6k_gemv's
contract and lane work): one launch for a layer's norm and its projections that share the normed
input, where they are Q6_K (a Q6_K file's q, k and v, or its gate and up). Params as the Q4_K
group's. Speed: not measured.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from .fused_rmsnorm_q4k_gemv_group import FusedRmsnormQ4kGemvGroup, FusedRmsnormQ4kGemvGroupConfig


class FusedRmsnormQ6kGemvGroupConfig(FusedRmsnormQ4kGemvGroupConfig):
    quant: ClassVar[str] = "q6_k"
    kind: Literal["fused_rmsnorm_q6k_gemv_group"]


class FusedRmsnormQ6kGemvGroup(FusedRmsnormQ4kGemvGroup):
    name = "fused_rmsnorm_q6k_gemv_group"
    Config = FusedRmsnormQ6kGemvGroupConfig
