"""The GPU runtime: the only module that talks to the CUDA driver (cuda.bindings.driver).

It loads what the build made (a CompiledKernel's cubin for the GPU's arch; the driver JITs the
PTX only when no cubin fits), launches it, moves memory, captures graphs and times. It assembles
nothing itself: offline assembly is ptxgen.assemble.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import time
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .abi import TENSOR_MAP_BYTES, Geometry, Param, TensorMap
from .compiled import CompiledKernel, Variant
from .errors import DeviceUnavailable, LaunchError, PtxgenError

NO_DEVICE = "no CUDA driver/GPU found"


def driver(instead: str = "use --backend emulator"):
    """cuda.bindings.driver after cuInit, or DeviceUnavailable (its message ends with `instead`:
    what the command can do without a GPU)."""
    try:
        from cuda.bindings import driver as cuda_driver

        (status,) = cuda_driver.cuInit(0)
    except Exception:  # no libcuda: cuda.pathfinder raises its own DynamicLibNotFoundError
        raise DeviceUnavailable(f"{NO_DEVICE}; {instead}") from None
    if status != cuda_driver.CUresult.CUDA_SUCCESS:
        raise DeviceUnavailable(f"{NO_DEVICE} (cuInit: {status.name}); {instead}")
    (status, count) = cuda_driver.cuDeviceGetCount()
    if status != cuda_driver.CUresult.CUDA_SUCCESS or count == 0:
        raise DeviceUnavailable(f"{NO_DEVICE}; {instead}")
    return cuda_driver


def driver_version() -> str:
    cuda_driver = driver()
    _, version = cuda_driver.cuDriverGetVersion()
    return f"{version // 1000}.{version % 1000 // 10}"


# --- running kernels on the GPU ---------------------------------------------------------------
#
# Everything below talks to the driver API through cuda.bindings.driver, one checked call at a
# time: it is a 1:1 map of the C driver API, the same in cuda-bindings 12 and 13, whatever
# cuda.core version a GPU machine has installed. The primary context of the device is used, so
# torch (or any runtime-API library) in the same process shares pointers and streams with us.

ALIGNMENT = 256  # bytes; what cuMemAlloc guarantees, kept for sub-buffers too
POOL_LIMIT = 1 << 32  # bytes of freed allocations kept for reuse
# Pending launches an H100 (driver 580) accepted on a stream; the next one blocked the host until the
# GPU drained one (measured, NOTES.md). Timing more back-to-back launches than this measures the host.
QUEUE_DEPTH = 1021
# Stream operations a timed chunk may queue: a quarter of the depth is left for what cannot be
# counted here (a peer library's own launches through torch).
CHUNK_OPERATIONS = QUEUE_DEPTH * 3 // 4
MAX_HOLD = 2.0  # seconds the spin kernel may hold the GPU while the host queues a chunk
HOLD_ATTEMPTS = 4  # tries at a chunk before its figures are called host-bound
# Errors after which the CUDA context is unusable until it is reset.
STICKY_ERRORS = {"CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_ILLEGAL_INSTRUCTION",
                 "CUDA_ERROR_MISALIGNED_ADDRESS", "CUDA_ERROR_INVALID_ADDRESS_SPACE", "CUDA_ERROR_INVALID_PC",
                 "CUDA_ERROR_HARDWARE_STACK_ERROR", "CUDA_ERROR_LAUNCH_TIMEOUT", "CUDA_ERROR_ASSERT",
                 "CUDA_ERROR_ECC_UNCORRECTABLE", "CUDA_ERROR_CONTEXT_IS_DESTROYED"}

# A spin of the given nanoseconds on one thread: holds the GPU while the host queues timed work.
DELAY_ENTRY = "ptxgen_delay"
DELAY_PTX = f"""\
.version 7.0
.target sm_50
.address_size 64
.visible .entry {DELAY_ENTRY}(
\t.param .u64 nanoseconds
)
{{
\t.reg .pred %wait;
\t.reg .u64 %limit, %start, %now;
\tld.param.u64 %limit, [nanoseconds];
\tmov.u64 %start, %globaltimer;
SPIN:
\tmov.u64 %now, %globaltimer;
\tsub.u64 %now, %now, %start;
\tsetp.lt.u64 %wait, %now, %limit;
\t@%wait bra SPIN;
\tret;
}}
"""
# JIT-compiled by the driver (it has no cubin): the device runtime's own helper, not a spec kernel.
DELAY = CompiledKernel(DELAY_ENTRY, "delay", {}, (Param("nanoseconds", "u64", role="scalar"),),
                       {"nanoseconds": (0, (1 << 63) - 1)},
                       {"sm_50": Variant("sm_50", DELAY_PTX, "7.0", Geometry((1, 1, 1), (1, 1, 1)))}, {})


@dataclass(frozen=True)
class DeviceBuffer:
    """`nbytes` of device memory at `address` (a whole allocation or a view into one)."""

    address: int
    nbytes: int
    capacity: int = 0  # bytes really allocated (whole allocations only)

    def view(self, offset: int, nbytes: int) -> DeviceBuffer:
        if offset < 0 or offset + nbytes > self.nbytes:
            raise PtxgenError(f"device buffer view [{offset}, {offset + nbytes}) outside its {self.nbytes} bytes")
        return DeviceBuffer(self.address + offset, nbytes)


@dataclass
class DeviceKernel:
    entry: str
    function: object  # CUfunction
    params: tuple[Param, ...]  # in PTX order
    static_shared: int
    max_threads: int
    dynamic_limit: int  # dynamic shared bytes the function is currently allowed
    registers: int  # per thread, as the driver loaded it
    pdl: bool = False  # its PTX waits for the previous kernel itself: launched for PDL (compiled.Variant.pdl)
    tensor_maps: tuple[TensorMap, ...] = ()  # taken after params, encoded by pack_params (compiled.Variant.tensor_maps)


@dataclass
class DeviceGraph:
    """An instantiated CUDA graph (CUgraphExec)."""

    executable: object


@dataclass(frozen=True)
class Timing:
    """Microseconds a call, each figure the mean of a group of `calls_per_event` calls between two
    CUDA events (1: each call timed alone), the calls queued per chunk behind one spin kernel, and
    whether the host could not queue some chunk before the GPU caught up with it (then the figures
    include host time: host-bound)."""

    times: list[float]
    calls_per_chunk: int
    host_bound: bool
    calls_per_event: int = 1


host_clock = time.perf_counter  # the host's clock for queuing times (the tests' simulated GPU replaces it)
# Set by the first sticky error: this process's CUDA context is gone for good (CUDA documents that
# the process must exit; measured on an H100: cuDevicePrimaryCtxRetain fails with the same error).
lost_context: str | None = None


_INTEGER_PARAMS = {"u64": (64, False), "b64": (64, False), "s64": (64, True), "u32": (32, False),
                   "b32": (32, False), "s32": (32, True)}


def pack_params(kernel: DeviceKernel, args: list, encode=None):
    """cuLaunchKernel's kernelParams: ((values...), (ctypes types...)) checked against the kernel's
    parameters. An array parameter takes a DeviceBuffer or a device address (int); a scalar an int
    that its PTX type can hold. The kernel's tensor maps follow, encoded from these arguments by
    `encode` (cuTensorMapEncodeTiled's C signature; default the driver's: tensor_map_encoder)."""
    if len(args) != len(kernel.params):
        names = ", ".join(param.name for param in kernel.params)
        raise LaunchError(f"{kernel.entry}: expected {len(kernel.params)} arguments ({names}), got {len(args)}")
    values, types = [], []
    for param, arg in zip(kernel.params, args):
        name, ptx_type = param.name, param.ptx_type
        integer = isinstance(arg, (int, np.integer)) and not isinstance(arg, (bool, np.bool_))
        if param.is_array and (isinstance(arg, DeviceBuffer) or integer):
            values.append(arg.address if isinstance(arg, DeviceBuffer) else int(arg))
            types.append(ctypes.c_void_p)
        elif not param.is_array and integer and ptx_type in _INTEGER_PARAMS:
            bits, signed = _INTEGER_PARAMS[ptx_type]
            low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
            if not low <= int(arg) <= high:
                raise LaunchError(f"{kernel.entry}: parameter {name!r} (.{ptx_type}) cannot hold {int(arg)}")
            values.append(int(arg))
            types.append({(64, False): ctypes.c_uint64, (64, True): ctypes.c_int64,
                          (32, False): ctypes.c_uint32, (32, True): ctypes.c_int32}[bits, signed])
        else:
            what = "an array" if param.is_array else f"a .{ptx_type} scalar"
            raise LaunchError(f"{kernel.entry}: parameter {name!r} is {what}; got {type(arg).__name__}")
    if kernel.tensor_maps:
        encode = encode or tensor_map_encoder()
        named = {param.name: value for param, value in zip(kernel.params, values)}
        for tensor_map in kernel.tensor_maps:
            values.append(encode_tensor_map(encode, kernel, tensor_map, named))
            types.append(None)  # TensorMapBytes: passed by value
    return (tuple(values), tuple(types)) if values else 0


class TensorMapBytes(ctypes.Structure):
    """A CUtensorMap by value: cuda.bindings points kernelParams[i] at the bytes of a None-typed
    ctypes.Structure (_HelperKernelParams, cuda/bindings/_lib/utils.pxi), and the driver copies the
    parameter's 128 bytes from there."""

    _fields_ = [("opaque", ctypes.c_uint64 * (TENSOR_MAP_BYTES // 8))]


def tensor_map_encoder():
    """The driver library's cuTensorMapEncodeTiled through ctypes, with its C signature (cuda.h).
    Not cuda.bindings' wrapper: it writes the map into an object of its own at an address 48 mod
    64 (cuda.bindings 13.4.4), where the driver documents 64-byte alignment; encode_tensor_map
    hands this one an aligned buffer."""
    driver()  # a machine without a driver says so here
    try:
        function = ctypes.CDLL("libcuda.so.1").cuTensorMapEncodeTiled
    except (OSError, AttributeError) as error:
        raise DeviceUnavailable(f"the CUDA driver has no cuTensorMapEncodeTiled ({error}): tensor maps need "
                                "CUDA 12.0 or later") from None
    u32s, u64s = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64s, u64s, u32s, u32s,
                         ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return function


def encode_tensor_map(encode, kernel: DeviceKernel, tensor_map: TensorMap, named: dict[str, int]):
    """The CUtensorMap of `tensor_map` over its array at this launch (a TensorMapBytes); `named`
    holds the launch's packed arguments (device addresses and scalars) by parameter name."""
    from cuda.bindings import driver as cu  # its enums are cuda.h's values

    param = next(param for param in kernel.params if param.name == tensor_map.array)
    address, dims, strides = named[param.name], tensor_map.dims(param, named), tensor_map.strides(param, named)
    what = f"{kernel.entry}: tensor map {tensor_map.name!r} of array {param.name!r}"
    # cuTensorMapEncodeTiled's rules, checked here to say which argument breaks them.
    if address % 16:
        raise LaunchError(f"{what}: its address {address:#x} is not a multiple of 16 bytes")
    if not all(1 <= dim <= 1 << 32 for dim in dims):
        raise LaunchError(f"{what}: dimensions {list(dims)} (innermost first) must be 1..2^32 elements")
    if any(stride % 16 or stride >= 1 << 40 for stride in strides):
        raise LaunchError(f"{what}: byte strides {list(strides)} must be multiples of 16 below 2^40")
    rank = len(tensor_map.box)
    buffer = ctypes.create_string_buffer(TENSOR_MAP_BYTES + 63)
    at = ctypes.addressof(buffer) + -ctypes.addressof(buffer) % 64
    kind, interleave, swizzle, l2, fill = (
        int(getattr(enum, name)) for enum, name in zip(
            (cu.CUtensorMapDataType, cu.CUtensorMapInterleave, cu.CUtensorMapSwizzle, cu.CUtensorMapL2promotion,
             cu.CUtensorMapFloatOOBfill), tensor_map.encoding(param)))
    status = encode(at, kind, rank, address, (ctypes.c_uint64 * rank)(*dims), (ctypes.c_uint64 * rank)(*strides),
                    (ctypes.c_uint32 * rank)(*tensor_map.box), (ctypes.c_uint32 * rank)(*[1] * rank),
                    interleave, swizzle, l2, fill)
    if status:
        try:
            name = cu.CUresult(status).name
        except ValueError:
            name = f"CUresult {status}"
        raise LaunchError(f"{what}: cuTensorMapEncodeTiled (dimensions {list(dims)}, byte strides {list(strides)}, "
                          f"box {list(tensor_map.box)}) failed: {name}")
    return TensorMapBytes.from_buffer_copy(ctypes.string_at(at, TENSOR_MAP_BYTES))


class DeviceSession:
    """Device 0's primary context, one stream, loaded modules and reusable allocations.

    Every CUDA call is checked; failures raise DeviceUnavailable, LaunchError
    (a bad launch, or a kernel that faulted) or PtxgenError, with the CUDA error's name.
    """

    def __init__(self, ordinal: int = 0):
        self.cu = cu = driver()
        self.ordinal = ordinal
        self.broken = False
        self.device = self.check(cu.cuDeviceGet(ordinal), f"cuDeviceGet({ordinal})", DeviceUnavailable)
        self.context = self.check(cu.cuDevicePrimaryCtxRetain(self.device), "retaining the device's primary context",
                                  DeviceUnavailable)
        self.activate()
        self.stream = self.check(cu.cuStreamCreate(int(cu.CUstream_flags.CU_STREAM_NON_BLOCKING)), "cuStreamCreate")
        name = self.check(cu.cuDeviceGetName(256, self.device), "cuDeviceGetName")
        self.name = bytes(name).split(b"\0")[0].decode(errors="replace").strip()
        attribute = cu.CUdevice_attribute
        major = self.attribute(attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        minor = self.attribute(attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
        self.arch = f"sm_{major}{minor}"
        self.sm_count = self.attribute(attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        self.l2_bytes = self.attribute(attribute.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
        self.shared_optin = self.attribute(attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        self.cooperative = bool(self.attribute(attribute.CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH))
        self.driver_version = driver_version()
        self.modules: list = []  # loaded CUmodules
        self.kernels: dict[tuple[str, str], DeviceKernel] = {}  # (image sha256, entry) -> its kernel
        self.pool: dict[int, list[DeviceBuffer]] = {}  # capacity -> freed allocations
        self.allocations: dict[int, DeviceBuffer] = {}  # address -> live or pooled allocation
        self.queued = 0  # stream operations queued so far (launches, graph launches, copies, events)

    # --- checked calls ----------------------------------------------------------------------------
    def describe(self, status) -> str:
        name = getattr(status, "name", str(status))
        try:
            code, text = self.cu.cuGetErrorString(status)
            text = bytes(text).decode(errors="replace") if code == self.cu.CUresult.CUDA_SUCCESS else ""
        except Exception:  # a description is a nicety; the name says it all
            text = ""
        return f"{name} ({text})" if text else name

    def check(self, result, what: str, error: type[PtxgenError] = PtxgenError):
        """The value(s) a cuda.bindings call returned after its CUresult, or `error`."""
        global lost_context
        status, *values = result
        if status != self.cu.CUresult.CUDA_SUCCESS:
            message = f"{what} failed on {getattr(self, 'name', 'the GPU')}: {self.describe(status)}"
            if getattr(status, "name", "") in STICKY_ERRORS:  # a kernel faulted
                self.broken = True
                lost_context = lost_context or status.name
                error = LaunchError
                message += ("; this process's CUDA context is lost (CUDA works again only in a new process); "
                            "--backend emulator runs the kernel under the sanitizer, which names the faulting access")
            raise error(message)
        if not values:
            return None
        return values[0] if len(values) == 1 else tuple(values)

    def attribute(self, attribute) -> int:
        value = self.check(self.cu.cuDeviceGetAttribute(attribute, self.device),
                           f"cuDeviceGetAttribute({attribute.name})")
        return int(value)

    def activate(self) -> None:
        """Make the context current on this thread (cheap; contexts are per thread)."""
        self.check(self.cu.cuCtxSetCurrent(self.context), "cuCtxSetCurrent", DeviceUnavailable)

    def synchronize(self, what: str = "the stream") -> None:
        self.check(self.cu.cuStreamSynchronize(self.stream), what, LaunchError)

    def free_memory(self) -> int:
        free, _total = self.check(self.cu.cuMemGetInfo(), "cuMemGetInfo")
        return int(free)

    # --- kernels --------------------------------------------------------------------------------
    def kernel(self, compiled: CompiledKernel) -> DeviceKernel:
        """`compiled` loaded for this GPU: its cubin for this arch, else the driver's JIT of its PTX
        (loaded once per session)."""
        binary = compiled.binary_for(self.arch)
        variant = compiled.variants[binary.target] if binary is not None else compiled.jit_variant(self.arch)
        if variant is None:
            built = ", ".join(compiled.binaries) or "none"
            raise LaunchError(f"{compiled.name}: nothing runs on {self.name} ({self.arch}): cubins for {built}, "
                              f"PTX for {', '.join(compiled.variants)}; rebuild with --arch {self.arch}")
        key = (binary.sha256 if binary is not None else variant.sha256, compiled.name)
        cached = self.kernels.get(key)
        if cached is not None:
            return cached
        image = binary.cubin if binary is not None else variant.ptx.encode() + b"\0"
        cu = self.cu
        what = "loading its cubin" if binary is not None else "JIT-compiling its PTX in the driver"
        module = self.check(cu.cuModuleLoadData(image), f"{compiled.name}: {what} for {self.arch}", LaunchError)
        self.modules.append(module)
        entry = compiled.name
        function = self.check(cu.cuModuleGetFunction(module, entry.encode()), f"finding kernel {entry!r} in its module",
                              LaunchError)
        attribute = cu.CUfunction_attribute
        static = self.check(cu.cuFuncGetAttribute(attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, function),
                            f"{entry}: cuFuncGetAttribute(SHARED_SIZE_BYTES)")
        threads = self.check(cu.cuFuncGetAttribute(attribute.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, function),
                             f"{entry}: cuFuncGetAttribute(MAX_THREADS_PER_BLOCK)")
        dynamic = self.check(cu.cuFuncGetAttribute(attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, function),
                             f"{entry}: cuFuncGetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)")
        registers = self.check(cu.cuFuncGetAttribute(attribute.CU_FUNC_ATTRIBUTE_NUM_REGS, function),
                               f"{entry}: cuFuncGetAttribute(NUM_REGS)")
        kernel = DeviceKernel(entry, function, compiled.params, int(static), int(threads), int(dynamic),
                              int(registers), variant.pdl, variant.tensor_maps)
        self.kernels[key] = kernel
        return kernel

    def prepare(self, kernel: DeviceKernel, launch):
        """Check a launch against the compiled kernel and the GPU; opt in to large dynamic shared
        memory. Returns the launch to make: a cooperative `any_grid` launch larger than what is
        co-resident on this GPU shrinks to that."""
        threads = math.prod(launch.block)
        if threads > kernel.max_threads:
            raise LaunchError(f"{kernel.entry}: {threads} threads per CTA, but the compiled kernel allows at most "
                              f"{kernel.max_threads} on {self.arch} (registers per thread)")
        dynamic = launch.dynamic_shared
        if kernel.static_shared + dynamic > self.shared_optin:
            raise LaunchError(f"{kernel.entry}: {kernel.static_shared} static + {dynamic} dynamic shared bytes exceed "
                              f"{self.name}'s {self.shared_optin} bytes per CTA")
        if dynamic > kernel.dynamic_limit:
            attribute = self.cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            self.check(self.cu.cuFuncSetAttribute(kernel.function, attribute, dynamic),
                       f"{kernel.entry}: allowing {dynamic} bytes of dynamic shared memory", LaunchError)
            kernel.dynamic_limit = dynamic
        if launch.cooperative:
            if not self.cooperative:
                raise LaunchError(f"{kernel.entry}: needs a cooperative launch, which {self.name} does not support")
            per_sm = self.resident_ctas(kernel, launch)
            ctas, fit = math.prod(launch.grid), per_sm * self.sm_count
            if ctas > fit:
                if not (launch.any_grid and fit > 0 and launch.grid[1:] == (1, 1)):
                    raise LaunchError(f"{kernel.entry}: a cooperative grid of {ctas} CTAs does not fit {self.name} at "
                                      f"once ({per_sm} per SM x {self.sm_count} SMs)")
                launch = dataclasses.replace(launch, grid=(fit, 1, 1))
        return launch

    def resident_ctas(self, kernel: DeviceKernel, launch) -> int:
        """CTAs of this launch the driver fits on one SM at once (its occupancy calculator; the
        launch's dynamic shared memory must already be allowed: prepare)."""
        threads = math.prod(launch.block)
        per_sm = self.check(self.cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(kernel.function, threads,
                                                                                 launch.dynamic_shared),
                            f"{kernel.entry}: occupancy query", LaunchError)
        return int(per_sm)

    @cached_property
    def tensor_map_encoder(self):
        """The driver's cuTensorMapEncodeTiled (tensor_map_encoder), looked up for the first launch
        with tensor maps."""
        return tensor_map_encoder()

    def launch(self, kernel: DeviceKernel, launch, args: list) -> None:
        """Queue one launch on the stream; args are DeviceBuffers (pointers) and ints, in PTX order
        (the kernel's tensor maps aside: pack_params encodes them from these)."""
        self.launcher(kernel, launch, args)()

    def launcher(self, kernel: DeviceKernel, launch, args: list, stream=None):
        """A call that queues this launch on `stream` (default: the session's), checked and its
        arguments packed once (for launches repeated many times, e.g. a multi-kernel step timed
        launch by launch, or an engine's calls through ptxgen.load)."""
        launch = self.prepare(kernel, launch)
        params = pack_params(kernel, args, self.tensor_map_encoder if kernel.tensor_maps else None)
        stream = self.stream if stream is None else stream
        cu, (gx, gy, gz), (bx, by, bz), shared = self.cu, launch.grid, launch.block, launch.dynamic_shared
        what = f"launching {kernel.entry} (grid {launch.grid}, block {launch.block}, {shared} B dynamic shared)"
        if launch.cooperative:
            def queue() -> None:
                self.queued += 1
                self.check(cu.cuLaunchCooperativeKernel(kernel.function, gx, gy, gz, bx, by, bz, shared, stream,
                                                        params), what, LaunchError)
        elif kernel.pdl:
            # Programmatic dependent launch: the kernel may start before the previous one of the
            # stream ends (it waits for it in griddepcontrol.wait).
            config = cu.CUlaunchConfig()
            config.gridDimX, config.gridDimY, config.gridDimZ = gx, gy, gz
            config.blockDimX, config.blockDimY, config.blockDimZ = bx, by, bz
            config.sharedMemBytes, config.hStream = shared, stream
            attribute = cu.CUlaunchAttribute()
            attribute.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attribute.value.programmaticStreamSerializationAllowed = 1
            config.attrs, config.numAttrs = [attribute], 1

            def queue() -> None:
                self.queued += 1
                self.check(cu.cuLaunchKernelEx(config, kernel.function, params, 0), what + " (programmatic dependent "
                           "launch)", LaunchError)
        else:
            def queue() -> None:
                self.queued += 1
                self.check(cu.cuLaunchKernel(kernel.function, gx, gy, gz, bx, by, bz, shared, stream, params, 0),
                           what, LaunchError)
        return queue

    # --- memory ---------------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> DeviceBuffer:
        """At least `nbytes` of device memory (a freed allocation of the same size is reused)."""
        capacity = max(ALIGNMENT, -(-nbytes // ALIGNMENT) * ALIGNMENT)
        if self.pool.get(capacity):
            buffer = self.pool[capacity].pop()
            return DeviceBuffer(buffer.address, nbytes, capacity)
        status, pointer = self.cu.cuMemAlloc(capacity)
        if status == self.cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY and self.pool:
            self.trim()
            status, pointer = self.cu.cuMemAlloc(capacity)
        pointer = self.check((status, pointer), f"allocating {capacity:,} bytes of device memory")
        buffer = DeviceBuffer(int(pointer), nbytes, capacity)
        self.allocations[buffer.address] = buffer
        return buffer

    def free(self, buffer: DeviceBuffer, keep: bool = True) -> None:
        """Give an allocation back: kept for reuse unless the pool is full or keep is False."""
        record = self.allocations.get(buffer.address)
        if record is None or buffer.capacity == 0:
            raise PtxgenError(f"device buffer at {buffer.address:#x} is not an allocation of this session")
        pooled = sum(b.capacity for buffers in self.pool.values() for b in buffers)
        if keep and not self.broken and pooled + record.capacity <= POOL_LIMIT:
            self.pool.setdefault(record.capacity, []).append(record)
        else:
            del self.allocations[record.address]
            self.check(self.cu.cuMemFree(record.address), "cuMemFree")

    def trim(self) -> None:
        """Really free every pooled allocation."""
        pool, self.pool = self.pool, {}
        for buffers in pool.values():
            for buffer in buffers:
                self.free(buffer, keep=False)

    def upload(self, buffer: DeviceBuffer, array: np.ndarray) -> None:
        host = np.ascontiguousarray(array)
        if host.nbytes > buffer.nbytes:
            raise PtxgenError(f"{host.nbytes} bytes do not fit a device buffer of {buffer.nbytes}")
        if host.nbytes:
            self.check(self.cu.cuMemcpyHtoDAsync(buffer.address, host.ctypes.data, host.nbytes, self.stream),
                       f"copying {host.nbytes:,} bytes to the device")

    def download(self, array: np.ndarray, buffer: DeviceBuffer) -> None:
        """Copy the device buffer into `array` in place (then synchronize)."""
        host = array if array.flags.c_contiguous and array.flags.writeable else np.empty_like(array, order="C")
        if host.nbytes > buffer.nbytes:
            raise PtxgenError(f"a device buffer of {buffer.nbytes} bytes cannot fill {host.nbytes}")
        if host.nbytes:
            self.check(self.cu.cuMemcpyDtoHAsync(host.ctypes.data, buffer.address, host.nbytes, self.stream),
                       f"copying {host.nbytes:,} bytes from the device", LaunchError)
        self.synchronize("copying results from the device")
        if host is not array:
            array[...] = host

    def zero(self, buffer: DeviceBuffer) -> None:
        if buffer.nbytes:
            self.check(self.cu.cuMemsetD8Async(buffer.address, 0, buffer.nbytes, self.stream), "cuMemsetD8Async")

    def copy(self, destination: DeviceBuffer, source: DeviceBuffer) -> None:
        """Device-to-device copy of the source's bytes, queued on the stream."""
        if source.nbytes > destination.nbytes:
            raise PtxgenError(f"copy of {source.nbytes} bytes into a buffer of {destination.nbytes}")
        self.queued += 1
        self.check(self.cu.cuMemcpyDtoDAsync(destination.address, source.address, source.nbytes, self.stream),
                   "cuMemcpyDtoDAsync")

    # --- graphs ---------------------------------------------------------------------------------
    def capture(self, enqueue) -> DeviceGraph:
        """Record what enqueue() queues on the stream into an instantiated CUDA graph (not run)."""
        cu = self.cu
        mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
        self.check(cu.cuStreamBeginCapture(self.stream, mode), "cuStreamBeginCapture", LaunchError)
        try:
            enqueue()
        except BaseException:
            status, graph = cu.cuStreamEndCapture(self.stream)  # leave the stream usable
            if status == cu.CUresult.CUDA_SUCCESS and graph is not None:
                cu.cuGraphDestroy(graph)
            raise
        graph = self.check(cu.cuStreamEndCapture(self.stream), "ending the CUDA graph capture", LaunchError)
        try:
            executable = self.check(cu.cuGraphInstantiate(graph, 0), "instantiating the CUDA graph", LaunchError)
        finally:
            self.check(cu.cuGraphDestroy(graph), "cuGraphDestroy")
        return DeviceGraph(executable)

    def replay(self, graph: DeviceGraph) -> None:
        self.queued += 1
        self.check(self.cu.cuGraphLaunch(graph.executable, self.stream), "launching the CUDA graph", LaunchError)

    def destroy(self, graph: DeviceGraph) -> None:
        self.check(self.cu.cuGraphExecDestroy(graph.executable), "cuGraphExecDestroy")

    # --- timing ---------------------------------------------------------------------------------
    def delay(self, seconds: float) -> None:
        """Queue a kernel that keeps the GPU busy for `seconds`."""
        from .kernels.base import Launch

        kernel = self.kernel(DELAY)
        self.launch(kernel, Launch(grid=(1, 1, 1), block=(1, 1, 1)), [int(seconds * 1e9)])

    def time(self, enqueue, iters: int, warmup: int = 10, calls_per_event: int = 1) -> Timing:
        """Microseconds a call of `iters` back-to-back calls enqueue(i), from CUDA events: one event
        after every `calls_per_event` calls, each figure a group's mean. An event records once all
        the stream's work before it is done and the next call is queued behind it, so with one
        after every call each figure includes what an event costs, and by stream order a
        programmatic dependent launch has no call before it to overlap; a group of calls between
        two events is timed as an engine runs them, back to back.

        The calls go in chunks that queue fewer stream operations than the launch queue holds
        (counted during the warm-up), each chunk behind a spin kernel that holds the GPU while the
        host queues it, so neither host launch costs nor a full queue show in the figures. A chunk
        the host could not queue within the hold is tried again with a longer hold and half the
        calls; if it never fits, the figures are marked host-bound.
        """
        host_times, operations = [], []
        for i in range(warmup):
            queued, start = self.queued, host_clock()
            enqueue(i)
            host_times.append(host_clock() - start)
            operations.append(self.queued - queued)
        per_call = float(np.median(host_times)) if host_times else 1e-4
        per_call_operations = max(operations, default=0) + 1 / calls_per_event  # and its share of an event
        fits = int((CHUNK_OPERATIONS - 2) // per_call_operations)  # - the spin and the first event
        chunk = max(1, min(iters, fits // calls_per_event * calls_per_event or fits))  # whole groups where they fit
        self.synchronize("warm-up runs")
        events = [self.check(self.cu.cuEventCreate(0), "cuEventCreate")
                  for _ in range(-(-chunk // calls_per_event) + 1)]
        times: list[float] = []
        done = 0
        host_bound = False
        try:
            while done < iters:
                calls = min(chunk, iters - done)
                for _attempt in range(HOLD_ATTEMPTS):
                    hold = min(MAX_HOLD, 2 * per_call * calls + 1e-3)
                    chunk_times, queued = self.timed_chunk(enqueue, warmup + done, calls, hold, events,
                                                           calls_per_event)
                    if queued < hold:
                        break
                    # The host took longer than the hold: a slow host, or a full queue that blocked it.
                    per_call = max(per_call, queued / calls)
                    chunk = calls = max(1, calls // 2)
                else:
                    host_bound = True
                times += chunk_times
                done += calls
            return Timing(times, chunk, host_bound, calls_per_event)
        finally:
            for event in events:
                self.cu.cuEventDestroy(event)

    def timed_chunk(self, enqueue, first: int, calls: int, hold: float, events: list,
                    calls_per_event: int = 1) -> tuple[list[float], float]:
        """(microseconds a call of each group, seconds the host took to queue them) of calls
        enqueue(first...) queued behind a spin of `hold` seconds, an event after every
        `calls_per_event` calls and after the last."""
        cu = self.cu
        start = host_clock()  # before the spin is queued: it cannot have started earlier
        self.delay(hold)
        self.queued += 1
        self.check(cu.cuEventRecord(events[0], self.stream), "cuEventRecord")
        groups = [min(calls_per_event, calls - begin) for begin in range(0, calls, calls_per_event)]
        order = iter(range(first, first + calls))
        for g, size in enumerate(groups):
            for _ in range(size):
                enqueue(next(order))
            self.queued += 1
            self.check(cu.cuEventRecord(events[g + 1], self.stream), "cuEventRecord")
        queued = host_clock() - start
        self.synchronize("timed runs")
        return [1e3 * float(self.check(cu.cuEventElapsedTime(events[g], events[g + 1]), "cuEventElapsedTime")) / size
                for g, size in enumerate(groups)], queued

    def copy_bandwidth(self, nbytes: int | None = None, iters: int = 20) -> tuple[int, float]:
        """(bytes copied, median seconds) of a device-to-device copy far larger than L2."""
        if nbytes is None:
            nbytes = max(256 << 20, 8 * self.l2_bytes)
            nbytes = min(nbytes, self.free_memory() // 4) // ALIGNMENT * ALIGNMENT
        source, destination = self.alloc(nbytes), self.alloc(nbytes)
        try:
            self.zero(source)
            timing = self.time(lambda i: self.copy(destination, source), iters, warmup=3)
        finally:
            self.free(source, keep=False)
            self.free(destination, keep=False)
        return nbytes, float(np.median(timing.times)) * 1e-6

    def close(self) -> None:
        """Free everything this session holds and release the primary context."""
        cu = self.cu
        self.pool = {}
        for buffer in list(self.allocations.values()):
            cu.cuMemFree(buffer.address)
        self.allocations = {}
        for module in self.modules:
            cu.cuModuleUnload(module)
        self.modules, self.kernels = [], {}
        cu.cuStreamDestroy(self.stream)
        cu.cuDevicePrimaryCtxRelease(self.device)


_SESSIONS: dict[int, DeviceSession] = {}


def session(ordinal: int = 0) -> DeviceSession:
    """The process's DeviceSession on a device; after a kernel fault a LaunchError (CUDA works
    again only in a new process: `verify` and `bench` run device work in a ptxgen.worker)."""
    if lost_context is not None:
        raise LaunchError(f"an earlier kernel fault ({lost_context}) lost this process's CUDA context; CUDA works "
                          "again only in a new process")
    current = _SESSIONS.get(ordinal)
    if current is None:
        current = _SESSIONS[ordinal] = DeviceSession(ordinal)
    current.activate()
    return current


def pointer_device(address: int) -> int | None:
    """The ordinal of the GPU that holds device memory at `address`, or None if the driver does not
    know the address as device memory."""
    cu = driver()
    attribute = cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
    status, ordinal = cu.cuPointerGetAttribute(attribute, address)
    return int(ordinal) if status == cu.CUresult.CUDA_SUCCESS else None


# Launches that run_on_device queues back to back wait behind a spin of this long, so the host
# has queued them all before the first starts (each takes ~10-50 us of host time).
QUEUE_HOLD_SECONDS = 5e-3


def run_on_device(compiled: CompiledKernel, launch, args: list, launches: int = 1) -> None:
    """Launch `compiled` once (or `launches` times back to back in one stream, queued behind a spin
    so that they run as an engine's would, not as fast as the host can queue them) on device 0:
    numpy arrays are copied in, and back in place afterwards.

    args are in PTX order: numpy arrays for pointer parameters, Python ints for scalars.
    """
    gpu = session()
    kernel = gpu.kernel(compiled)
    entry = compiled.name
    buffers: list[DeviceBuffer] = []
    try:
        device_args = []
        for arg in args:
            if isinstance(arg, np.ndarray):
                buffer = gpu.alloc(arg.nbytes)
                buffers.append(buffer)
                gpu.upload(buffer, arg)
                device_args.append(buffer)
            else:
                device_args.append(arg)
        queue = gpu.launcher(kernel, launch, device_args)
        if launches > 1:
            gpu.delay(QUEUE_HOLD_SECONDS)
        for _ in range(launches):
            queue()
        gpu.synchronize(f"running {entry}")
        for arg, device_arg in zip(args, device_args):
            if isinstance(arg, np.ndarray):
                gpu.download(arg, device_arg)
    finally:
        if not gpu.broken:
            for buffer in buffers:
                gpu.free(buffer)
