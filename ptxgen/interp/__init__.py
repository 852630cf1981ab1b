"""CPU interpreter for PTX kernels with a sanitizer: runs the real PTX text over a whole
grid with numpy, checking memory bounds, shared-memory races (read/write, write/read and
write/write across barrier intervals, named barriers included) and unwritten shared and local
memory, barriers, warp collectives and shuffle sources, uninitialised registers, the ordering of
global memory across CTAs and between the warps of one CTA (ordering.py; CTAs and warps
interleave in seeded orders), and the sm_90a asynchronous instructions (hopper.py). Approximate
instructions err as much as the H100 was measured to (approx.py)."""
from . import hopper  # noqa: F401  (registers the sm_90a opcodes in the ops table)
from .launch import LaunchStats, launch

__all__ = ["LaunchStats", "launch"]
