"""The elementwise family: memory-bound kinds over f32[n] (swiglu, residual_add).

The launch plan and the Kind methods that follow from it; the PTX skeleton that goes with the
plan is the `elementwise_f32` macro of templates/families/elementwise.ptx.j2.

Plan: the n elements are n // 4 16-byte units and an n % 4 scalar tail. Up to SMALL_UNITS units
every thread of 128-thread CTAs moves one unit (many CTAs, spread over every SM); past that,
256-thread CTAs with 4 independent units in flight per thread (all loads issued before any use).
Thread t of CTA c takes units c*threads*per_thread + j*threads + t, j < per_thread, so each of
its loads is one coalesced CTA-wide stripe; the tail goes to the first threads of CTA 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field

from ..base import Geometry, PdlConfig, ceil_div, round_up

MAX_N = 2**30  # the largest n of an elementwise kind
VEC = 4  # f32 elements per 16-byte vector
SMALL_UNITS = 2**18  # up to here: 128-thread CTAs, one vector per thread (spread over many SMs)


class ElementwiseConfig(PdlConfig):
    """The size of an elementwise kind (a kind's Config adds only its `kind` literal)."""

    n: int = Field(ge=1, le=MAX_N)


@dataclass(frozen=True)
class ElementwisePlan:
    """What the elementwise_f32 macro takes for n elements."""

    n: int
    threads: int
    per_thread: int  # 16-byte units in flight per thread

    @classmethod
    def of(cls, n: int) -> ElementwisePlan:
        units, tail = divmod(n, VEC)
        if units <= SMALL_UNITS:
            return cls(n, threads=min(128, round_up(max(units, tail), 32)), per_thread=1)
        return cls(n, threads=256, per_thread=4)  # large n: fewer, fuller CTAs, 4 vectors in flight

    @property
    def units(self) -> int:
        """16-byte units of 4 elements."""
        return self.n // VEC

    @property
    def tail(self) -> int:
        """Elements past the last unit, done by scalar accesses in CTA 0."""
        return self.n % VEC

    @property
    def grid(self) -> int:
        return max(1, ceil_div(self.units, self.threads * self.per_thread))


class ElementwiseLaunch:
    """Kind methods of an elementwise kind whose config has `n` and no runtime scalars
    (mixed in before Kind: `class Swiglu(ElementwiseLaunch, Kind)`)."""

    @property
    def plan(self) -> ElementwisePlan:
        return ElementwisePlan.of(self.config.n)

    def geometry(self) -> Geometry:
        plan = self.plan
        return Geometry(grid=(plan.grid, 1, 1), block=(plan.threads, 1, 1))

    def launch_note(self) -> str:
        plan = self.plan
        return f"{plan.per_thread} 16-byte vector(s) per thread, {plan.tail} scalar tail element(s) in CTA 0"

    def template_vars(self) -> dict:
        return {"plan": self.plan}

    def scalar_limits(self) -> dict[str, tuple[int, int]]:
        return {}

    def example_scalars(self) -> dict[str, int]:
        return {}
