"""The only module that talks to CUDA (cuda.core, cuda.bindings): assembly and devices.

Offline assembly uses nvJitLink from the `nvidia-nvjitlink` wheel, so it needs no GPU, no
driver and no system CUDA. The driver's JIT is used when asked for and a driver is present.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from .errors import AssemblerError, DeviceUnavailable

NO_DEVICE = "no CUDA driver/GPU found; use --backend emulator"


@dataclass(frozen=True)
class Assembled:
    cubin: bytes
    info_log: str


@cache
def nvjitlink_version() -> str:
    from cuda.bindings import nvjitlink

    major, minor = nvjitlink.version()
    return f"{major}.{minor}"


def clean_log(log: str) -> str:
    """The assembler's info log without the parts that change from run to run."""
    lines = [line.rstrip() for line in log.replace("\x00", "").splitlines()]
    return "\n".join(line for line in lines if line and "Compile time" not in line)


def assemble_nvjitlink(ptx: str, arch: str) -> Assembled:
    from cuda.bindings.nvjitlink import nvJitLinkError
    from cuda.core import Linker, LinkerOptions, ObjectCode

    # ObjectCode.from_ptx treats a str as a file name: pass bytes.
    try:
        linker = Linker(ObjectCode.from_ptx(ptx.encode()), options=LinkerOptions(arch=arch, verbose=True))
        cubin = linker.link("cubin").code
    except nvJitLinkError as error:
        raise AssemblerError(f"nvJitLink failed to assemble PTX for {arch}", log=str(error)) from None
    return Assembled(cubin=bytes(cubin), info_log=clean_log(linker.get_info_log()))


def driver():
    """cuda.bindings.driver after cuInit, or DeviceUnavailable."""
    try:
        from cuda.bindings import driver as cuda_driver

        (status,) = cuda_driver.cuInit(0)
    except Exception:  # no libcuda: cuda.pathfinder raises its own DynamicLibNotFoundError
        raise DeviceUnavailable(NO_DEVICE) from None
    if status != cuda_driver.CUresult.CUDA_SUCCESS:
        raise DeviceUnavailable(f"{NO_DEVICE} (cuInit: {status.name})")
    (status, count) = cuda_driver.cuDeviceGetCount()
    if status != cuda_driver.CUresult.CUDA_SUCCESS or count == 0:
        raise DeviceUnavailable(NO_DEVICE)
    return cuda_driver


def driver_version() -> str:
    cuda_driver = driver()
    _, version = cuda_driver.cuDriverGetVersion()
    return f"{version // 1000}.{version % 1000 // 10}"


def device_arch(ordinal: int = 0) -> str:
    cuda_driver = driver()
    attribute = cuda_driver.CUdevice_attribute
    _, major = cuda_driver.cuDeviceGetAttribute(attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, ordinal)
    _, minor = cuda_driver.cuDeviceGetAttribute(attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, ordinal)
    return f"sm_{major}{minor}"


def assemble_driver(ptx: str, arch: str) -> Assembled:
    """JIT through the driver's own PTX compiler: only for the GPU's own arch."""
    cuda_driver = driver()
    own = device_arch()
    if arch != own:
        raise AssemblerError(f"the driver assembler builds only for this GPU's arch {own}, not {arch}")
    from cuda.core import Device, ObjectCode

    Device().set_current()
    option = cuda_driver.CUjit_option
    log_size = 1 << 16
    info, error = bytearray(log_size), bytearray(log_size)
    options = [option.CU_JIT_INFO_LOG_BUFFER, option.CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
               option.CU_JIT_ERROR_LOG_BUFFER, option.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, option.CU_JIT_LOG_VERBOSE]
    values = [info, log_size, error, log_size, 1]
    status, state = cuda_driver.cuLinkCreate(len(options), options, values)
    try:
        data = ptx.encode() + b"\0"
        (status,) = cuda_driver.cuLinkAddData(state, cuda_driver.CUjitInputType.CU_JIT_INPUT_PTX, data, len(data),
                                              b"kernel.ptx", 0, [], [])
        if status != cuda_driver.CUresult.CUDA_SUCCESS:
            raise AssemblerError(f"the driver failed to assemble PTX for {arch}", log=error.split(b"\0")[0].decode())
        status, pointer, size = cuda_driver.cuLinkComplete(state)
        if status != cuda_driver.CUresult.CUDA_SUCCESS:
            raise AssemblerError(f"the driver failed to link PTX for {arch}", log=error.split(b"\0")[0].decode())
        cubin = ObjectCode.from_cubin(_copy_bytes(pointer, size)).code
    finally:
        cuda_driver.cuLinkDestroy(state)
    return Assembled(cubin=bytes(cubin), info_log=clean_log(info.split(b"\0")[0].decode()))


def _copy_bytes(pointer: int, size: int) -> bytes:
    import ctypes

    return ctypes.string_at(int(pointer), size)


ASSEMBLERS = {"nvjitlink": assemble_nvjitlink, "driver": assemble_driver}


def assembler_version(name: str) -> str:
    return nvjitlink_version() if name == "nvjitlink" else driver_version()


def resolve_assembler(name: str) -> str:
    """`auto` is nvJitLink (always present: it comes from a wheel); `driver` needs a driver."""
    if name == "driver":
        driver()
        return "driver"
    return "nvjitlink"


_RESOURCES = {
    "registers": r"used (\d+) registers",
    "shared_bytes": r"(\d+) bytes smem",
    "local_bytes": r"(\d+) bytes lmem",
    "stack_bytes": r"(\d+) bytes stack frame",
    "spill_stores": r"(\d+) bytes spill stores",
    "spill_loads": r"(\d+) bytes spill loads",
}


def parse_resources(info_log: str) -> dict[str, int]:
    """Registers, shared/local memory, stack and spills from a ptxas-style info log."""
    found = {}
    for key, pattern in _RESOURCES.items():
        values = [int(v) for v in re.findall(pattern, info_log, flags=re.IGNORECASE)]
        found[key] = max(values) if values else 0
    return found
