"""What every kernel kind declares: config model, parameters, launch, reference, traffic."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..dtypes import DTYPES
from ..errors import LaunchError

# A kernel name becomes the PTX entry and file names, so it must be a plain identifier.
Identifier = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")

# Relative L2 error allowed against the float64 reference, by the dtype the result is
# stored in: f32 results differ from float64 by accumulated f32 rounding; f16/bf16 results
# are additionally rounded once on store (2^-11 and 2^-8 relative).
TOLERANCE = {"f32": 1e-5, "f16": 2e-3, "bf16": 1.6e-2}


class KernelConfig(BaseModel):
    """Fields common to every kernel entry of a spec; each kind adds its own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Identifier


@dataclass(frozen=True)
class Param:
    """One PTX entry parameter. `shape` holds ints and names of runtime scalars."""

    name: str
    dtype: str
    shape: tuple[int | str, ...] = ()
    role: str = "in"  # in | out | inout | scalar | workspace
    layout: str = ""  # "q4_k": rows of GGML block_q4_K (u8), loadable from a GGUF tensor

    @property
    def is_array(self) -> bool:
        return self.role != "scalar"

    @property
    def written(self) -> bool:
        return self.role in ("out", "inout")

    def concrete_shape(self, scalars: dict[str, int]) -> tuple[int, ...]:
        return tuple(scalars[d] if isinstance(d, str) else d for d in self.shape)

    def nbytes(self, scalars: dict[str, int]) -> int:
        return math.prod(self.concrete_shape(scalars)) * DTYPES[self.dtype].size

    def describe(self) -> str:
        dims = ", ".join(str(d) for d in self.shape)
        return f"{self.dtype}[{dims}]" if self.is_array else f"{self.dtype} scalar"


@dataclass(frozen=True)
class Launch:
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_shared: int = 0
    cooperative: bool = False
    # Correct with any 1-D grid of at least one CTA (grid-stride loops, the CTA count read from
    # %nctaid): a device may shrink a cooperative grid to what is co-resident on it.
    any_grid: bool = False

    @property
    def threads_per_cta(self) -> int:
        return math.prod(self.block)

    @property
    def empty(self) -> bool:
        return math.prod(self.grid) == 0


@dataclass(frozen=True)
class Traffic:
    """Minimum bytes a call must move to/from global memory and the flops it must do."""

    bytes: int
    flops: int


@dataclass(frozen=True)
class Call:
    """One launch of a multi-kernel step (a fused kind's work done by the separate kinds).

    `args` binds each array parameter of `kernel` to a buffer of the step: a name, or (name, i)
    for slice i along the buffer's first axis. A bound buffer holds exactly the parameter's
    elements and dtype (its shape may differ: f32[hidden] serves as f32[1, hidden]).
    """

    kernel: KernelConfig
    args: dict[str, str | tuple[str, int]]
    scalars: dict[str, int]


class Kind:
    """Base of all kernel kinds. A subclass in ptxgen/kernels/<kind>.py is the kind."""

    name: ClassVar[str]
    Config: ClassVar[type[KernelConfig]]
    # Oldest PTX ISA whose instructions the template uses.
    ptx_version: ClassVar[tuple[int, int]] = (7, 0)

    def __init__(self, config: KernelConfig):
        self.config = config

    @property
    def template(self) -> str:
        return f"{self.name}.ptx.j2"

    # --- declarations every kind provides -------------------------------------------------
    def params(self) -> list[Param]:
        raise NotImplementedError

    def launch(self, scalars: dict[str, int]) -> Launch:
        raise NotImplementedError

    def launch_rule(self) -> str:
        """The launch geometry as a formula of config and runtime scalars, for people."""
        raise NotImplementedError

    def template_vars(self) -> dict[str, Any]:
        raise NotImplementedError

    def reference(self, arrays: dict[str, np.ndarray], scalars: dict[str, int]) -> dict[str, np.ndarray]:
        """Float64 results of every written parameter, from the stored input arrays."""
        raise NotImplementedError

    def traffic(self, scalars: dict[str, int]) -> Traffic:
        raise NotImplementedError

    def sample_inputs(self, rng: np.random.Generator, scalars: dict[str, int]) -> dict[str, np.ndarray]:
        """Random non-zero inputs in realistic ranges for every read parameter."""
        raise NotImplementedError

    def scalar_limits(self) -> dict[str, tuple[int, int]]:
        """Inclusive range of every runtime scalar the launcher accepts. Names that are not PTX
        parameters are optional size hints (used for sample inputs and traffic)."""
        raise NotImplementedError

    def example_scalars(self) -> dict[str, int]:
        """Runtime scalars of a typical call (show, bench)."""
        raise NotImplementedError

    def verify_scalars(self) -> list[dict[str, int]]:
        """Small runtime sizes of the same compiled PTX, for the interpreter."""
        return [self.example_scalars()]

    def resources(self) -> tuple[int, int]:
        """Threads per CTA and shared bytes (static + dynamic, at most) of this config."""
        launch = self.launch(self.example_scalars())
        return launch.threads_per_cta, launch.dynamic_shared + self.static_shared()

    def static_shared(self) -> int:
        return 0

    def check_arrays(self, arrays: dict[str, np.ndarray], scalars: dict[str, int]) -> None:
        """Checks on array contents the launcher must make (e.g. a device-side length)."""

    def tolerance(self, param: Param) -> float:
        return TOLERANCE[param.dtype]

    # --- derived ---------------------------------------------------------------------------
    def param(self, name: str) -> Param:
        return next(p for p in self.params() if p.name == name)

    def check_scalars(self, scalars: dict[str, int]) -> None:
        """Reject missing or out-of-range runtime scalars before any launch."""
        limits = self.scalar_limits()
        required = {p.name for p in self.params() if p.role == "scalar"}
        for name, (low, high) in limits.items():
            if name not in scalars:
                if name not in required:
                    continue  # a size hint (e.g. the length behind a device-side pointer)
                raise LaunchError(f"{self.config.name}: runtime scalar '{name}' is missing (expected {low}..{high})")
            value = scalars[name]
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
                raise LaunchError(
                    f"{self.config.name}: runtime scalar '{name}': expected an integer in {low}..{high}, got {value!r}"
                )
        unknown = sorted(set(scalars) - set(limits))
        if unknown:
            raise LaunchError(f"{self.config.name}: unknown runtime scalar '{unknown[0]}' (known: {', '.join(limits) or 'none'})")


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b
