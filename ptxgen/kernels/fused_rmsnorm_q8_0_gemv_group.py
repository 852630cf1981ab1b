"""fused_rmsnorm_q8_0_gemv_group: fused_rmsnorm_q4k_gemv_group for GGML Q8_0 matrices (q8_0_gemv's
contract and lane work): one launch for a layer's norm and its projections that share the normed
input, where they are Q8_0 (a Q8_0 file's q, k and v, or its gate and up). Params as the Q4_K
group's. Speed: not measured.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from .fused_rmsnorm_q4k_gemv_group import FusedRmsnormQ4kGemvGroup, FusedRmsnormQ4kGemvGroupConfig


class FusedRmsnormQ80GemvGroupConfig(FusedRmsnormQ4kGemvGroupConfig):
    quant: ClassVar[str] = "q8_0"
    kind: Literal["fused_rmsnorm_q8_0_gemv_group"]


class FusedRmsnormQ80GemvGroup(FusedRmsnormQ4kGemvGroup):
    name = "fused_rmsnorm_q8_0_gemv_group"
    Config = FusedRmsnormQ80GemvGroupConfig
