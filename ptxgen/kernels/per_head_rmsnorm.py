"""per_head_rmsnorm (Qwen3 Q/K norm): RMSNorm of every x[t, h, :] with one shared gamma."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from .base import Param, PdlConfig
from .rmsnorm import FloatDType, Rmsnorm, check_row_length


class PerHeadRmsnormConfig(PdlConfig):
    kind: Literal["per_head_rmsnorm"]
    dtype: FloatDType = "f32"
    num_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    eps: float = Field(default=1e-6, gt=0, lt=1)

    @field_validator("head_dim")
    @classmethod
    def fits_registers(cls, head_dim: int, info) -> int:
        check_row_length(head_dim, info.data.get("dtype", "f32"))
        return head_dim


class PerHeadRmsnorm(Rmsnorm):
    """Row RMSNorm over tokens * num_heads rows of head_dim (same template, same plan)."""

    name = "per_head_rmsnorm"
    Config = PerHeadRmsnormConfig
    count_name = "tokens"

    @property
    def row_length(self) -> int:
        return self.config.head_dim

    @property
    def rows_per_count(self) -> int:
        return self.config.num_heads

    def params(self) -> list[Param]:
        dtype, shape = self.config.dtype, ("tokens", self.config.num_heads, self.config.head_dim)
        return [
            Param("x", dtype, shape),
            Param("gamma", dtype, (self.config.head_dim,)),
            Param("y", dtype, shape, "out"),
            Param("tokens", "u32", role="scalar"),
        ]
