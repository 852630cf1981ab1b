"""CPU interpreter for PTX kernels with a sanitizer: runs the real PTX text over a whole
grid with numpy, checking memory bounds, shared-memory races, barriers, warp collectives and
uninitialised registers."""
from . import hopper  # noqa: F401  (registers the sm_90a opcodes in the ops table)
from .launch import LaunchStats, launch

__all__ = ["LaunchStats", "launch"]
