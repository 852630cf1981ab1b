"""Offline assembly: PTX text -> cubin for one arch, with the assembler's resource report.

nvJitLink comes from the `nvidia-nvjitlink` wheel through cuda.core's Linker, so it needs no GPU,
no driver and no system CUDA. The driver's own JIT (`--assembler driver`) builds only for the
GPU present and needs its driver (ptxgen.device). ptxas from the optional `nvidia-cuda-nvcc`
wheel (extra "ptxas") compiles a PTX file as a whole program: nvJitLink compiles it as one unit
of a link, which drops `setmaxnreg` ("ignored to maintain compatibility across compilation
units", ptxas info C7504), so the Hopper attention's producer warpgroup cannot hand its registers
to the consumers there. `auto` takes ptxas for PTX that executes setmaxnreg where it is
installed, nvJitLink for everything else.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib.metadata
import os
import re
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from .errors import AssemblerError

# Options every assembler is given; part of the cache key (pipeline.py), so a change here
# reassembles everything. `verbose` makes ptxas report registers, shared memory and spills.
OPTIONS = {"verbose": True}


@dataclass(frozen=True)
class Assembled:
    cubin: bytes
    info_log: str


@cache
def nvjitlink_version() -> str:
    from cuda.bindings import nvjitlink

    major, minor = nvjitlink.version()
    return f"{major}.{minor}"


@cache
def nvjitlink_release() -> str:
    """The nvJitLink that assembles, as the cache key and the manifest name it: the version of the
    wheel whose library is loaded (e.g. 13.5.37), else major.minor and a digest of the library file.
    nvJitLink's own version is major.minor only, and patch releases of one minor assemble other
    cubins (13.4.52 and 13.4.92 differ in every cubin of specs/qwen3.toml): keyed by major.minor,
    a cache filled before an upgrade kept serving the old cubins, which a cold build no longer made."""
    from cuda.pathfinder import load_nvidia_dynamic_lib

    version = nvjitlink_version()
    path = load_nvidia_dynamic_lib("nvJitLink").abs_path
    if path is None:  # loaded by something else before us, from where pathfinder cannot tell
        return version
    for distribution in ("nvidia-nvjitlink", f"nvidia-nvjitlink-cu{version.split('.')[0]}"):
        try:
            found = importlib.metadata.distribution(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
        for file in found.files or []:
            if file.name.startswith(("libnvJitLink", "nvJitLink")) and os.path.exists(file.locate()) \
                    and os.path.samefile(file.locate(), path) and found.version.startswith(f"{version}."):
                return found.version
    return f"{version}+sha256.{file_digest(path)}"


def file_digest(path: str) -> str:
    """The first 16 hex digits of a library file's sha256: its build, where no version names it."""
    digest = hashlib.sha256()
    with open(path, "rb") as library:
        for block in iter(lambda: library.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


# The driver's release in the name of the libcuda a Linux install (and the container toolkit's
# mount) puts behind libcuda.so.1; WSL's libcuda.so.1.1 and Windows' nvcuda.dll have none.
LIBCUDA_RELEASE = re.compile(r"libcuda\.so\.([0-9]{3,}\.[0-9]+(?:\.[0-9]+)?)")


def driver_release() -> str:
    """The driver whose JIT assembles (--assembler driver), as the cache key and the manifest name
    it: the release of the libcuda loaded (e.g. 580.95.05; its JIT, libnvidia-ptxjitcompiler,
    comes with it), else the CUDA version it implements and a digest of the library. Only that
    version is what cuDriverGetVersion says (13.0 for every 580 driver), and the JIT's cubins may
    change with a patch release, as nvJitLink's do (nvjitlink_release)."""
    from cuda.pathfinder import DynamicLibNotFoundError, load_nvidia_dynamic_lib

    from .device import driver_version

    version = driver_version()  # initialises the driver (or names its absence), so libcuda is loaded
    try:
        path = load_nvidia_dynamic_lib("cuda").abs_path
    except DynamicLibNotFoundError:  # a driver loaded where the system search does not look
        return version
    if path is None:  # loaded by something else before us, from where pathfinder cannot tell
        return version
    found = LIBCUDA_RELEASE.fullmatch(os.path.basename(os.path.realpath(path)))
    return found[1] if found else f"{version}+sha256.{file_digest(path)}"


def clean_log(log: str) -> str:
    """The assembler's info log without the parts that change from run to run."""
    lines = [line.rstrip() for line in log.replace("\x00", "").splitlines()]
    return "\n".join(line for line in lines if line and "Compile time" not in line)


# Environment variables nvJitLink reads at each link that change its info log (which the manifest
# records and the cache keeps) but not the cubin: NVJITLINK_TRACE_MESSAGES (13.5: "no driver cache"
# before the log). The cache key does not cover the environment, so they are unset for the link.
NVJITLINK_LOG_ENVIRONMENT = ("NVJITLINK_TRACE_MESSAGES",)


@contextlib.contextmanager
def _unset(names: tuple[str, ...]):
    saved = {name: os.environ.pop(name) for name in names if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def assemble_nvjitlink(ptx: str, arch: str, options: dict) -> Assembled:
    from cuda.bindings.nvjitlink import nvJitLinkError
    from cuda.core import Linker, LinkerOptions, ObjectCode

    # ObjectCode.from_ptx treats a str as a file name: pass bytes.
    with _unset(NVJITLINK_LOG_ENVIRONMENT):
        try:
            linker = Linker(ObjectCode.from_ptx(ptx.encode()), options=LinkerOptions(arch=arch, **options))
            cubin = linker.link("cubin").code
        except nvJitLinkError as error:
            raise AssemblerError(f"nvJitLink failed to assemble PTX for {arch}", log=clean_log(str(error))) from None
        log = linker.get_info_log()
    return Assembled(cubin=bytes(cubin), info_log=clean_log(log))


def wheel_binary(distribution: str, name: str) -> Path | None:
    """Program `name` shipped in the installed wheel `distribution` (NVIDIA's tool wheels), or None."""
    try:
        files = importlib.metadata.files(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    return next((Path(f.locate()) for f in files if f.name == name), None)


@cache
def ptxas_binary() -> Path | None:
    """The ptxas of the nvidia-cuda-nvcc wheel, or None where it is not installed."""
    return wheel_binary("nvidia-cuda-nvcc", "ptxas")


def _ptxas() -> Path:
    binary = ptxas_binary()
    if binary is None:
        raise AssemblerError("--assembler ptxas: ptxas comes from the nvidia-cuda-nvcc wheel, which is not "
                             "installed (pip install 'ptxgen[ptxas]')")
    return binary


@cache
def ptxas_version() -> str:
    shown = subprocess.run([str(_ptxas()), "--version"], capture_output=True, text=True, check=False).stdout
    found = re.search(r"release (\d+\.\d+), V([\d.]+)", shown)
    if found is None:
        raise AssemblerError(f"{_ptxas()}: cannot read its version", log=shown)
    return found[2]


def assemble_ptxas(ptx: str, arch: str, options: dict) -> Assembled:
    """The PTX as a whole program (setmaxnreg honoured), through ptxas in a scratch folder. ptxas
    runs in that folder on relative names: its messages name the input file ("ptxas kernel.ptx,
    line 7; warning : ..."), and the folder's random name (under TMPDIR) must not reach the info
    log, which the manifest records."""
    with tempfile.TemporaryDirectory(prefix="ptxgen-ptxas-") as scratch:
        source, target = Path(scratch) / "kernel.ptx", Path(scratch) / "kernel.cubin"
        source.write_text(ptx)
        command = [str(_ptxas().absolute()), f"-arch={arch}", *(["-v"] if options.get("verbose") else []), source.name,
                   "-o", target.name]
        done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=scratch)
        if done.returncode != 0:
            raise AssemblerError(f"ptxas failed to assemble PTX for {arch}", log=done.stderr + done.stdout)
        return Assembled(cubin=target.read_bytes(), info_log=clean_log(done.stdout + done.stderr))


def assemble_driver(ptx: str, arch: str, options: dict) -> Assembled:
    """JIT through the driver's own PTX compiler: only for the GPU's own arch."""
    from .device import session

    gpu = session()  # a current context for the link
    cuda_driver, own = gpu.cu, gpu.arch
    if arch != own:
        raise AssemblerError(f"the driver assembler builds only for this GPU's arch {own}, not {arch}")
    option = cuda_driver.CUjit_option
    log_size = 1 << 16
    info, error = bytearray(log_size), bytearray(log_size)
    keys = [option.CU_JIT_INFO_LOG_BUFFER, option.CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
            option.CU_JIT_ERROR_LOG_BUFFER, option.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, option.CU_JIT_LOG_VERBOSE]
    values = [info, log_size, error, log_size, int(options.get("verbose", False))]
    status, state = cuda_driver.cuLinkCreate(len(keys), keys, values)
    if status != cuda_driver.CUresult.CUDA_SUCCESS:
        raise AssemblerError(f"the driver could not start a link for {arch}: {status.name}")
    try:
        data = ptx.encode() + b"\0"
        (status,) = cuda_driver.cuLinkAddData(state, cuda_driver.CUjitInputType.CU_JIT_INPUT_PTX, data, len(data),
                                              b"kernel.ptx", 0, [], [])
        if status != cuda_driver.CUresult.CUDA_SUCCESS:
            raise AssemblerError(f"the driver failed to assemble PTX for {arch}", log=error.split(b"\0")[0].decode())
        status, pointer, size = cuda_driver.cuLinkComplete(state)
        if status != cuda_driver.CUresult.CUDA_SUCCESS:
            raise AssemblerError(f"the driver failed to link PTX for {arch}", log=error.split(b"\0")[0].decode())
        cubin = ctypes.string_at(int(pointer), size)  # owned by the link state: copy before destroying it
    finally:
        cuda_driver.cuLinkDestroy(state)
    return Assembled(cubin=cubin, info_log=clean_log(info.split(b"\0")[0].decode()))


ASSEMBLERS = {"nvjitlink": assemble_nvjitlink, "ptxas": assemble_ptxas, "driver": assemble_driver}


def assembler_version(name: str) -> str:
    if name == "nvjitlink":
        return nvjitlink_release()
    if name == "ptxas":
        return ptxas_version()
    return driver_release()


def resolve_assembler(name: str) -> str:
    """`auto` (nvJitLink, or ptxas per PTX: assembler_for), or the one asked for, checked present:
    `driver` needs a driver, `ptxas` its wheel."""
    if name == "driver":
        from .device import driver

        driver(instead="--assembler auto (the default) or nvjitlink needs none")
    elif name == "ptxas":
        _ptxas()
    return name


def assembler_for(name: str, ptx: str) -> str:
    """The assembler of one PTX text under the resolved choice `name`: with `auto`, ptxas where
    the PTX executes setmaxnreg and ptxas is installed, else nvJitLink."""
    if name != "auto":
        return name
    return "ptxas" if "setmaxnreg" in ptx and ptxas_binary() is not None else "nvjitlink"


def assemble(assembler: str, ptx: str, arch: str, options: dict) -> Assembled:
    """Module-level, so build worker processes can run it."""
    return ASSEMBLERS[assembler](ptx, arch, options)


# ptxas's advisories where it gives up something the PTX asked for: "(C7504) Potential Performance
# Loss: 'setmaxnreg' ignored ..." (nvJitLink), "(C7509) ...: wgmma.mma_async instructions are
# serialized due to the presence of Extern calls ..." (each wgmma then waits for the one before).
_PERFORMANCE_LOSS = re.compile(r"\((C\d{4})\) Potential Performance Loss: (.+?)\.?$", re.M)


def performance_losses(info_log: str) -> list[str]:
    """ptxas's performance-loss advisories in an info log, each as "(code) what"."""
    return [f"({code}) {what}" for code, what in _PERFORMANCE_LOSS.findall(info_log)]


_RESOURCES = {
    "registers": r"used (\d+) registers",
    "shared_bytes": r"(\d+) bytes smem",
    "local_bytes": r"(\d+) bytes lmem",
    "stack_bytes": r"(\d+) bytes stack frame",
    "spill_stores": r"(\d+) bytes spill stores",
    "spill_loads": r"(\d+) bytes spill loads",
}


def parse_resources(info_log: str, cubin: bytes | None = None) -> dict[str, int]:
    """Registers, shared/local memory, stack and spills from a ptxas-style info log; static shared
    memory from the cubin itself where given (cubin_static_shared)."""
    found = {}
    for key, pattern in _RESOURCES.items():
        values = [int(v) for v in re.findall(pattern, info_log, flags=re.IGNORECASE)]
        found[key] = max(values) if values else 0
    shared = cubin_static_shared(cubin) if cubin is not None else None
    if shared is not None:
        found["shared_bytes"] = shared
    return found


def cubin_static_shared(cubin: bytes) -> int | None:
    """The size of the kernel's `.nv.shared.<entry>` section, the static shared memory the driver
    allocates (0 without one; None for what is not a 64-bit ELF). On sm_90 it holds 1 KB more than
    the declared arrays, which nvJitLink's report counts and ptxas's "bytes smem" line does not
    (48 declared bytes: a 1072-byte section from either assembler)."""
    if cubin[:5] != b"\x7fELF\x02":
        return None
    (table,) = struct.unpack_from("<Q", cubin, 0x28)  # section headers: offset, entry size, count, names
    entry_size, count, names = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<I4xQQQQ", cubin, table + i * entry_size) for i in range(count)]
    strings = headers[names][3]  # (name offset, flags, address, file offset, size)

    def name(offset: int) -> bytes:
        return cubin[strings + offset:cubin.index(b"\0", strings + offset)]

    return max((size for offset, _, _, _, size in headers if name(offset).startswith(b".nv.shared.")
                and not name(offset).startswith(b".nv.shared.reserved.")), default=0)
