"""CPU interpreter for PTX kernels with a sanitizer: runs the real PTX text over a whole
grid with numpy, checking memory bounds, shared-memory races and unwritten shared memory,
barriers, warp collectives and shuffle sources, uninitialised registers, and the ordering of
global memory across CTAs (ordering.py; CTAs and warps interleave in seeded orders). Approximate
instructions err as much as the H100 was measured to (approx.py)."""
from . import hopper  # noqa: F401  (registers the sm_90a opcodes in the ops table)
from .launch import LaunchStats, launch

__all__ = ["LaunchStats", "launch"]
