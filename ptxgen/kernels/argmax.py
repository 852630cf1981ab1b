"""argmax: index[0] = the index of the largest element of x f32[n] (greedy sampling of logits).

A ptxgen addition beyond ../shared/KERNELS.md, for `ptxgen generate`.

Contract:
- Config: `n` (int, 1..2^30).
- Params, in order: `x` f32[n] (in), `index` u32[1] (out), then the workspace `state` u32[4]
  (the launcher's, zeroed once; every launch leaves it zero again).
- Semantics: the first index of the maximum (ties: the lowest index, as numpy's argmax; -0.0 and
  +0.0 are equal); NaN is never chosen over a number (it ranks below -inf); all NaN gives 0.

Every element becomes one u64 key that orders what the contract asks for: high word the f32's
bits made monotonic (negative: all bits flipped; positive: the sign bit set; ±0 as +0; NaN 0,
below -inf's 0x007fffff), low word the index's complement (the lowest index wins a tie). Then
argmax is the max of the keys: max.u64 per thread, over the warp (two 32-bit shuffles a step),
over the CTA (shared memory), and over the CTAs by one atom.global.max.u64 a CTA into the
workspace; the last CTA to count in (atomic counter, as incremental_attention's split merge)
takes the result with atom.exch (resetting it to 0) and resets the counter, so the next launch
or a CUDA-graph replay needs no zeroing. One CTA writes the index directly.

The loads are the elementwise family's plan (ptxgen/kernels/families/elementwise.py): 16-byte
vectors, up to 4 a thread in flight for large n, a scalar tail in CTA 0; memory-bound (n*4 bytes
read, e.g. 0.6 MB for a 151936-token vocabulary), plus one atomic per CTA on one L2 line.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from .base import Kind, Param, Traffic
from .families.elementwise import ElementwiseConfig, ElementwiseLaunch

STATE_WORDS = 4  # the max key (u64, words 0-1), the CTA counter (word 2), a pad word


def first_argmax(x: np.ndarray) -> int:
    """The contract's argmax: the first index of the largest number; NaN never wins; all NaN: 0."""
    x = np.asarray(x, dtype=np.float64)
    numbers = ~np.isnan(x)
    if not numbers.any():
        return 0
    return int(np.flatnonzero(numbers & (x == x[numbers].max()))[0])


class ArgmaxConfig(ElementwiseConfig):
    kind: Literal["argmax"]


class Argmax(ElementwiseLaunch, Kind):
    name = "argmax"
    Config = ArgmaxConfig

    def params(self) -> list[Param]:
        return [Param("x", "f32", (self.config.n,)), Param("index", "u32", (1,), "out"),
                Param("state", "u32", (STATE_WORDS,), "workspace")]

    def launch_note(self) -> str:
        return super().launch_note() + "; one u64 atomic max a CTA, the last CTA writes the index"

    def template_vars(self) -> dict:
        plan = self.plan
        return {"plan": plan, "warps": plan.threads // 32}

    def static_shared(self) -> int:
        return 8 * (self.plan.threads // 32)  # a key per warp

    def sample_inputs(self, rng, scalars):
        """Gaussian logits with what the contract is about planted: the maximum again at a later
        index (a tie), NaNs (never chosen), -inf, and both zeros."""
        n = self.config.n
        x = rng.standard_normal(n).astype(np.float32)
        if n >= 8:
            spots = rng.choice(n, size=6, replace=False)
            x[spots[:2]] = np.nan
            x[spots[2]] = -np.inf
            x[spots[3]], x[spots[4]] = -0.0, 0.0
            best = int(np.nanargmax(x))
            later = [i for i in range(best + 1, n) if i not in spots[:2]]
            if later:
                x[later[len(later) // 2]] = x[best]
        return {"x": x}

    def reference(self, arrays, scalars):
        return {"index": np.array([first_argmax(arrays["x"])], dtype=np.float64)}

    def tolerance(self, param: Param) -> float:
        return 0.0  # an index is right or wrong

    def traffic(self, scalars) -> Traffic:
        return Traffic(bytes=4 * self.config.n + 4, flops=self.config.n)  # one compare an element
