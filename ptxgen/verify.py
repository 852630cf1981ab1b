"""Check kernels against their float64 references: the ground truth of ptxgen."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .compiled import CompiledKernel
from .dtypes import to_float64
from .runner import run


@dataclass(frozen=True)
class Check:
    kernel: str
    param: str
    scalars: dict
    shape: tuple
    error: float  # relative L2 error against the float64 reference
    tolerance: float
    unwritten: int  # output elements still NaN-poisoned (or NaN for another reason)

    @property
    def passed(self) -> bool:
        return self.unwritten == 0 and self.error <= self.tolerance


def relative_l2(result: np.ndarray, reference: np.ndarray) -> float:
    """||result - reference|| / ||reference||, or the absolute norm when the reference is 0."""
    difference = np.linalg.norm((result - reference).ravel())
    scale = np.linalg.norm(reference.ravel())
    return float(difference / scale) if scale > 0 else float(difference)


def compare(compiled: CompiledKernel, arrays: dict[str, np.ndarray], reference: dict[str, np.ndarray],
            scalars: dict) -> list[Check]:
    """One Check per written parameter, comparing the launch's arrays to the reference."""
    kind = compiled.definition
    checks = []
    for param in compiled.params:
        if not param.written:
            continue
        result = to_float64(arrays[param.name], param.dtype)
        unwritten = int(np.count_nonzero(~np.isfinite(result)))
        finite = np.where(np.isfinite(result), result, 0.0)
        checks.append(Check(compiled.name, param.name, dict(scalars), result.shape,
                            relative_l2(finite, reference[param.name]), kind.tolerance(param), unwritten))
    return checks


def verify_kernel(compiled: CompiledKernel, scalars: dict, seed: int = 0, backend: str = "emulator",
                  sanitize: bool = True, arch: str | None = None) -> list[Check]:
    """Random non-zero inputs, poisoned outputs, one launch, compare to the reference."""
    kind = compiled.definition
    rng = np.random.default_rng(seed)
    inputs = kind.sample_inputs(rng, scalars)
    arrays = run(compiled, inputs, scalars, backend=backend, sanitize=sanitize, arch=arch)
    return compare(compiled, arrays, kind.reference(inputs, scalars), scalars)
