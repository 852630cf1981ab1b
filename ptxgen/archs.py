"""Target architectures ptxgen assembles for, and the hardware limits specs are checked against."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Arch:
    name: str
    ptx_version: tuple[int, int]  # oldest PTX ISA that knows this target
    max_shared_per_cta: int  # opt-in dynamic shared memory limit, bytes
    max_threads_per_cta: int = 1024
    registers_per_sm: int = 65536


ARCHS = {
    a.name: a
    for a in (
        Arch("sm_80", (7, 0), 166912),
        Arch("sm_86", (7, 1), 101376),
        Arch("sm_87", (7, 4), 166912),
        Arch("sm_89", (7, 8), 101376),
        Arch("sm_90", (7, 8), 232448),
        # Arch-specific Hopper target (wgmma, setmaxnreg: PTX ISA 8.0): PTX written for it
        # assembles for sm_90 hardware only, never for later archs.
        Arch("sm_90a", (8, 0), 232448),
        Arch("sm_100", (8, 6), 232448),
        Arch("sm_120", (8, 7), 101376),
    )
}
DEFAULT_ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90")
# Statically declared shared memory may not exceed 48 KB; beyond it a kind must use dynamic.
STATIC_SHARED_LIMIT = 48 * 1024


def arch_number(name: str) -> int:
    return int(name.removeprefix("sm_").removesuffix("a"))


def format_version(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"
