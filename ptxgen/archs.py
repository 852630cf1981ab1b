"""Target architectures ptxgen assembles for, and the hardware limits specs are checked against."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class Arch:
    name: str
    ptx_version: tuple[int, int]  # oldest PTX ISA that knows this target
    max_shared_per_cta: int  # opt-in dynamic shared memory limit, bytes
    # Residency limits per SM, from the CUDA C++ Programming Guide, "Technical Specifications
    # per Compute Capability" (Table 27 of the 12.x guide) and its per-architecture "Shared
    # Memory" sections (shared_per_sm is the largest carve-out).
    max_warps_per_sm: int = 64
    max_ctas_per_sm: int = 32
    shared_per_sm: int = 228 * 1024
    max_threads_per_cta: int = 1024
    registers_per_sm: int = 65536
    max_registers_per_thread: int = 255
    # Allocation rules of CUDA's occupancy calculator (cuda_occupancy.h, which spells them out
    # for 8.x; taken to hold for 9.x-12.x, as Nsight Compute's block limits on sm_90 agree):
    # registers go to a warp in units of 256 from one of the 4 schedulers' quarter of the
    # register file; shared memory goes to a CTA in units of 128 bytes, plus the 1 KB per CTA
    # the driver reserves on sm_80+.
    register_granularity: int = 256
    sub_partitions: int = 4
    shared_granularity: int = 128
    reserved_shared_per_cta: int = 1024
    # From sm_90 on, a cubin's .nv.shared.<entry> section starts with that reserve (a 16-byte array:
    # a 1040-byte section; dynamic shared alone: 1024), while the driver reports the arrays alone
    # (CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, 16) and its occupancy calculator adds the reserve.
    reserve_in_section: bool = False

    def warp_registers(self, registers_per_thread: int) -> int:
        """Registers one warp is allocated (in units of register_granularity)."""
        return -(-max(registers_per_thread, 1) * 32 // self.register_granularity) * self.register_granularity

    def fits_registers(self, threads_per_cta: int, registers_per_thread: int) -> bool:
        """Whether one CTA's registers fit an SM: the hardware checks them as if its warps
        filled every scheduler's quarter of the register file."""
        warps = -(-threads_per_cta // 32)
        quarters = -(-warps // self.sub_partitions) * self.sub_partitions
        return (registers_per_thread <= self.max_registers_per_thread
                and self.warp_registers(registers_per_thread) * quarters <= self.registers_per_sm)


ARCHS = {
    a.name: a
    for a in (
        Arch("sm_80", (7, 0), 166912, shared_per_sm=164 * 1024),
        Arch("sm_86", (7, 1), 101376, 48, 16, 100 * 1024),
        Arch("sm_87", (7, 4), 166912, 48, 16, 164 * 1024),
        Arch("sm_89", (7, 8), 101376, 48, 24, 100 * 1024),
        Arch("sm_90", (7, 8), 232448, reserve_in_section=True),
        # Arch-specific Hopper target (wgmma, setmaxnreg: PTX ISA 8.0): PTX written for it
        # assembles for sm_90 hardware only, never for later archs.
        Arch("sm_90a", (8, 0), 232448, reserve_in_section=True),
        Arch("sm_100", (8, 6), 232448, reserve_in_section=True),
        Arch("sm_120", (8, 7), 101376, 48, 24, 100 * 1024, reserve_in_section=True),
    )
}
DEFAULT_ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90")
# Statically declared shared memory may not exceed 48 KB; beyond it a kind must use dynamic.
STATIC_SHARED_LIMIT = 48 * 1024


def arch_number(name: str) -> int:
    return int(name.removeprefix("sm_").removesuffix("a"))


def format_version(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def arch_version(arch: str) -> tuple[int, int, bool]:
    """sm_86 -> (8, 6, False); sm_90a -> (9, 0, True); sm_120 -> (12, 0, False)."""
    digits = arch.removeprefix("sm_").removesuffix("a")
    number = int(digits)
    return number // 10, number % 10, arch.endswith("a")


def serving_target(targets: Mapping[str, bool], arch: str) -> str | None:
    """Which of a kernel's PTX targets (target -> whether that PTX uses PDL) serves `arch` (e.g.
    sm_100), among those it can run (its own, and any made for an older arch that is not
    arch-specific: an sm_90a one serves sm_90 alone): a PDL one first (the spec asked for it: its
    sm_90 PTX serves sm_100 and sm_120 too), then its own, then the newest; None when it can run none."""
    wanted = arch_version(arch)
    usable = [t for t in targets if t == arch or (not arch_version(t)[2] and arch_version(t)[:2] <= wanted[:2])]
    return max(usable, key=lambda t: (targets[t], t == arch, arch_version(t)[:2]), default=None)
