"""fused_rmsnorm_q8_0_gemv_group: the fused norm + GEMV group (fused_rmsnorm_q4k_gemv_group's
kernel, params and error analysis) over GGML Q8_0 matrices, q8_0_gemv's contract and lane work.
In a Q8_0 file every layer's q/k/v and gate/up are such groups; the decoder's separate step
launches one per layer for each. Speed: not measured.
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
