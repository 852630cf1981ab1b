"""A simulated GPU behind ptxgen.device, for the tests that run on a machine without one.

Every call first goes to the real cuda.bindings function, which converts and type-checks the
arguments exactly as on a GPU machine and then fails to find libcuda; the simulation then plays
the driver: device memory is host memory, and a "kernel" computes its kind's float64 reference
(the kind of the variant whose launch geometry it was given: an sm_90a prefill's is its own). A
tensor map is encoded by `encode_tensor_map` (what ptxgen.device.tensor_map_encoder gives) as
plain words, which a launch checks against the arrays its variant maps.
Time is simulated too: the host spends HOST_SECONDS on each driver call, the GPU KERNEL_SECONDS on
each kernel (or its entry's `kernel_seconds`) and EVENT_SECONDS on each event, and a stream holds
at most `queue_depth` pending operations (the host blocks until the oldest completes, as an H100
does past ~1021), so event timing sees what it would on a GPU. A kernel named in `faulty` faults
stickily: from then on every call fails with CUDA_ERROR_ILLEGAL_ADDRESS, as on an H100, where only
a new process gets CUDA back.

`install` puts one behind ptxgen.device in a device worker (ptxgen.worker.CHILD_SETUP).
"""

from __future__ import annotations

import collections
import ctypes
from pathlib import Path

import numpy as np
from cuda.bindings import driver as real
from cuda.pathfinder import DynamicLibNotFoundError

from ptxgen import device
from ptxgen.dtypes import DTYPES, from_float
from ptxgen.kernels import kind_of, own_targets
from ptxgen.spec import load_spec

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "qwen3.toml"
SUCCESS = real.CUresult.CUDA_SUCCESS
FAULT = real.CUresult.CUDA_ERROR_ILLEGAL_ADDRESS


class SimulatedDriver:
    """cuda.bindings.driver as seen by ptxgen.device, with a host-memory GPU behind it."""

    L2_BYTES = 1 << 20
    sm_count = 132
    captures_cooperative = True  # whether a cooperative launch may be captured into a graph
    KERNEL_SECONDS = 4e-6  # simulated duration of one kernel
    HOST_SECONDS = 1e-6  # simulated host time of one driver call
    EVENT_SECONDS = 0.0  # simulated GPU time of recording an event
    DEFAULT_DYNAMIC = 48 * 1024
    REGISTERS = 32  # what cuFuncGetAttribute(NUM_REGS) says of every function
    resident_ctas = 2  # what the occupancy query says of every launch

    def __init__(self, kernels: dict, queue_depth: int = device.QUEUE_DEPTH, faulty=(), wrong=(),
                 launch_log: str | None = None, kernel_seconds: dict | None = None):
        self.kernels = kernels  # entry -> kernel config whose reference plays the kernel
        self.kernel_seconds = kernel_seconds or {}  # entry -> its duration, where not KERNEL_SECONDS
        self.queue_depth = queue_depth
        self.memory: dict[int, np.ndarray] = {}  # address -> allocation
        self.handles: dict[int, object] = {}  # module/function/graph/event ids -> what they hold
        self.next_handle = 0x1000
        self.calls: list[tuple[str, tuple]] = []
        self.fail: dict[str, object] = {}  # call name -> CUresult it returns once
        self.capturing: list | None = None
        self.host_now = 0.0  # seconds on the host's clock
        self.gpu_free = 0.0  # when the GPU finishes what is queued
        self.pending = collections.deque()  # completion times of the queued operations
        self.wrong = set(wrong)  # entries whose results the simulation spoils
        self.faulty = set(faulty)  # entries that fault (stickily)
        self.lost = False
        self.launch_log = launch_log  # a file each launched entry's name is appended to
        self.loaded = []  # what each cuModuleLoadData was given: "cubin" or "ptx"
        self.pdl_launches = collections.Counter()  # entry -> launches with programmatic stream serialization

    @classmethod
    def for_spec(cls, path=SPEC, extra_kernels=(), **options) -> SimulatedDriver:
        """Every kernel of a spec (and the configs `extra_kernels`), and the separate kernels of
        its fused ones, can run on it."""
        kernels = {}
        for kernel in [*load_spec(path).spec.kernels, *extra_kernels]:
            kernels[kernel.name] = kernel
            kind = kind_of(kernel)
            step = kind.separate_step(kind.example_scalars())
            kernels.update({call.kernel.name: call.kernel for call in (step[1] if step else [])})
        return cls(kernels, **options)

    def occupy(self, seconds: float) -> None:
        """Queue an operation of `seconds` on the GPU (the host blocks while the queue is full)."""
        while self.pending and self.pending[0] <= self.host_now:
            self.pending.popleft()
        if len(self.pending) >= self.queue_depth:
            self.host_now = self.pending.popleft()
        self.gpu_free = max(self.gpu_free, self.host_now) + seconds
        self.pending.append(self.gpu_free)

    # Enums and handle types come from the real module; each call is checked by it first.
    def __getattr__(self, name):
        simulated = getattr(type(self), "sim_" + name, None)
        if simulated is None:
            if name.startswith("cu"):
                raise AttributeError(f"the simulated driver has no {name}")
            return getattr(real, name)

        def call(*args):
            self.calls.append((name, args))
            self.host_now += self.HOST_SECONDS
            try:
                getattr(real, name)(*args)
            except DynamicLibNotFoundError:
                pass  # the arguments converted; only libcuda is missing
            status = self.fail.pop(name, None) or (FAULT if self.lost and name != "cuGetErrorString" else None)
            if status is not None:
                return (status,) + (None,) * (_RESULTS.get(name, 1) - 1)
            return simulated(self, *args)

        return call

    def handle(self, kind, value):
        self.next_handle += 16
        self.handles[self.next_handle] = value
        return kind(self.next_handle)

    def owner(self, address: int, nbytes: int) -> tuple[np.ndarray, int]:
        for base, allocation in self.memory.items():
            if base <= address and address + nbytes <= base + allocation.size:
                return allocation, address - base
        raise AssertionError(f"[{address:#x}, +{nbytes}) is not inside one device allocation")

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    # --- device, context, stream -------------------------------------------------------------
    def sim_cuDeviceGet(self, ordinal):
        return SUCCESS, real.CUdevice(ordinal)

    def sim_cuDevicePrimaryCtxRetain(self, dev):
        return SUCCESS, real.CUcontext(0x100)

    def sim_cuDevicePrimaryCtxRelease(self, dev):
        return (SUCCESS,)

    def sim_cuCtxSetCurrent(self, ctx):
        return (SUCCESS,)

    def sim_cuStreamCreate(self, flags):
        return SUCCESS, real.CUstream(0x200)

    def sim_cuStreamDestroy(self, stream):
        return (SUCCESS,)

    def sim_cuStreamSynchronize(self, stream):
        self.host_now = max(self.host_now, self.gpu_free)
        self.pending.clear()
        return (SUCCESS,)

    def sim_cuDeviceGetName(self, length, dev):
        return SUCCESS, b"Simulated GPU".ljust(length, b"\0")

    def sim_cuDeviceGetAttribute(self, attribute, dev):
        values = {"COMPUTE_CAPABILITY_MAJOR": 9, "COMPUTE_CAPABILITY_MINOR": 0, "MULTIPROCESSOR_COUNT": self.sm_count,
                  "L2_CACHE_SIZE": self.L2_BYTES, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": 232448,
                  "COOPERATIVE_LAUNCH": 1}
        return SUCCESS, values[attribute.name.removeprefix("CU_DEVICE_ATTRIBUTE_")]

    def sim_cuDriverGetVersion(self):
        return SUCCESS, 13000

    def sim_cuGetErrorString(self, status):
        return SUCCESS, b"simulated description"

    # --- modules and kernels -------------------------------------------------------------------
    def sim_cuModuleLoadData(self, image):
        image = bytes(image)
        if not (image.startswith(b"\x7fELF") or b".entry" in image):  # a cubin, or PTX for the JIT
            return real.CUresult.CUDA_ERROR_INVALID_IMAGE, None
        self.loaded.append("cubin" if image.startswith(b"\x7fELF") else "ptx")
        return SUCCESS, self.handle(real.CUmodule, image)

    def sim_cuModuleUnload(self, module):
        return (SUCCESS,)

    def sim_cuModuleGetFunction(self, module, name):
        image = self.handles[int(module)]
        if name not in image:  # the entry's name is a string in the cubin's ELF (or the PTX)
            return real.CUresult.CUDA_ERROR_NOT_FOUND, None
        return SUCCESS, self.handle(real.CUfunction, {"entry": name.decode(), "dynamic": self.DEFAULT_DYNAMIC})

    def sim_cuFuncGetAttribute(self, attribute, function):
        values = {"SHARED_SIZE_BYTES": 0, "MAX_THREADS_PER_BLOCK": 1024, "NUM_REGS": self.REGISTERS,
                  "MAX_DYNAMIC_SHARED_SIZE_BYTES": self.handles[int(function)]["dynamic"]}
        return SUCCESS, values[attribute.name.removeprefix("CU_FUNC_ATTRIBUTE_")]

    def sim_cuFuncSetAttribute(self, function, attribute, value):
        assert attribute.name == "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES"
        self.handles[int(function)]["dynamic"] = value
        return (SUCCESS,)

    def sim_cuOccupancyMaxActiveBlocksPerMultiprocessor(self, function, threads, dynamic):
        return SUCCESS, self.resident_ctas

    def sim_cuLaunchKernel(self, function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        return self.launch(function, (gx, gy, gz), (bx, by, bz), shared, params, cooperative=False)

    def sim_cuLaunchCooperativeKernel(self, function, gx, gy, gz, bx, by, bz, shared, stream, params):
        return self.launch(function, (gx, gy, gz), (bx, by, bz), shared, params, cooperative=True)

    def sim_cuLaunchKernelEx(self, config, function, params, extra):
        """A launch with attributes: the programmatic dependent launches are counted by entry."""
        ids = [attribute.id for attribute in config.attrs[:config.numAttrs]]
        if real.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION in ids:
            entry = self.handles[int(function)]["entry"]
            self.pdl_launches[entry] += 1
        return self.launch(function, (config.gridDimX, config.gridDimY, config.gridDimZ),
                           (config.blockDimX, config.blockDimY, config.blockDimZ), config.sharedMemBytes, params,
                           cooperative=False)

    def launch(self, function, grid, block, shared, params, cooperative):
        if shared > self.handles[int(function)]["dynamic"]:
            return (real.CUresult.CUDA_ERROR_INVALID_VALUE,)
        if cooperative and self.capturing is not None and not self.captures_cooperative:
            return (real.CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,)
        values, types = params if params else ((), ())
        record = (self.handles[int(function)]["entry"], grid, block, shared, tuple(values), tuple(types), cooperative)
        if self.capturing is not None:
            self.capturing.append(record)
        elif record[0] == device.DELAY_ENTRY:
            assert record[5] == (ctypes.c_uint64,) and record[4][0] > 0
            self.occupy(record[4][0] * 1e-9)
        else:
            self.execute(record)
            self.occupy(self.duration(record))
        return (SUCCESS,)

    def duration(self, record) -> float:
        """Seconds the GPU spends on a launch record's kernel."""
        return self.kernel_seconds.get(record[0], self.KERNEL_SECONDS)

    def execute(self, record):
        """Compute what the kernel of a launch record writes (its kind's float64 reference)."""
        entry, grid, block, shared, values, types, cooperative = record
        if self.launch_log:
            with open(self.launch_log, "a") as log:
                log.write(entry + "\n")
        if entry in self.faulty:
            self.lost = True
            return
        config = self.kernels[entry]
        params = kind_of(config).params()
        scalars = {}
        for param, value, ctype in zip(params, values, types):
            assert ctype is (ctypes.c_void_p if param.is_array else ctypes.c_uint32), (param.name, ctype)
            if not param.is_array:
                scalars[param.name] = value
        if "seq_len" in kind_of(config).scalar_limits() and "seq_len" not in scalars:
            scalars["seq_len"] = 0  # indirect length: only the device copy counts
        variants = [kind_of(config)] + [kind_of(config, target) for target in own_targets(config)]
        kind = next((k for k in variants if k.launch(scalars).block == block), None)
        assert kind is not None, f"{entry}: no variant of it launches {block}-thread CTAs"
        maps = kind.tensor_maps()
        assert len(values) == len(params) + len(maps), f"{entry}: {len(values)} arguments for {len(params)} parameters"
        expected = kind.launch(scalars)
        assert expected.grid == grid or (expected.any_grid and cooperative and grid[0] < expected.grid[0]), entry
        named = dict(zip((param.name for param in params), values))
        for tensor_map, value, ctype in zip(maps, values[len(params):], types[len(params):]):
            param = next(param for param in params if param.name == tensor_map.array)
            assert ctype is None and list(value.opaque) == self.map_words(
                named[param.name], tensor_map.dims(param, scalars), tensor_map.strides(param, scalars),
                tensor_map.box, int(real.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B) if tensor_map.swizzle else 0), \
                f"{entry}: tensor map {tensor_map.name} does not describe {param.name} at this launch"
        arrays = {}
        for param, address in zip(params, values):
            if param.is_array:
                shape, dtype = param.concrete_shape(scalars), DTYPES[param.dtype].numpy
                allocation, offset = self.owner(address, param.nbytes(scalars))
                arrays[param.name] = np.ndarray(shape, dtype, buffer=allocation, offset=offset)
        reference = kind.reference({p.name: arrays[p.name] for p in params if p.role in ("in", "inout")}, scalars)
        for param in params:
            if param.written:
                result = reference[param.name] * (1.5 if entry in self.wrong else 1.0)
                arrays[param.name][...] = from_float(result, param.dtype)

    # --- tensor maps -----------------------------------------------------------------------------
    @staticmethod
    def map_words(address, dims, strides, box, swizzle) -> list[int]:
        """The 16 words the simulation's CUtensorMap holds: what it was encoded from."""
        words = [address, len(dims), *dims, *strides, *box, swizzle]
        return words + [0] * (16 - len(words))

    def encode_tensor_map(self, at, kind, rank, address, dims, strides, box, steps, interleave, swizzle, l2, fill):
        """cuTensorMapEncodeTiled with its C signature (ptxgen.device.tensor_map_encoder's): the
        tensor must lie inside one allocation; writes map_words at `at` (64-byte aligned)."""
        self.calls.append(("cuTensorMapEncodeTiled", (kind, rank, address)))
        assert at % 64 == 0
        dims, strides = list(dims[:rank]), list(strides[:rank - 1])
        self.owner(address, strides[-1] * dims[-1] if strides else dims[0])
        words = self.map_words(address, dims, strides, list(box[:rank]), swizzle)
        ctypes.memmove(at, (ctypes.c_uint64 * 16)(*words), 128)
        return 0

    # --- memory ----------------------------------------------------------------------------------
    def sim_cuMemAlloc(self, size):
        allocation = np.zeros(size, np.uint8)
        self.memory[allocation.ctypes.data] = allocation
        return SUCCESS, real.CUdeviceptr(allocation.ctypes.data)

    def sim_cuMemFree(self, address):
        if self.memory.pop(int(address), None) is None:
            return (real.CUresult.CUDA_ERROR_INVALID_VALUE,)
        return (SUCCESS,)

    def sim_cuMemGetInfo(self):
        return SUCCESS, 64 << 20, 1 << 31

    def sim_cuMemcpyHtoDAsync(self, destination, source, nbytes, stream):
        self.owner(int(destination), nbytes)
        ctypes.memmove(int(destination), source, nbytes)
        return (SUCCESS,)

    def sim_cuMemcpyDtoHAsync(self, destination, source, nbytes, stream):
        self.owner(int(source), nbytes)
        ctypes.memmove(destination, int(source), nbytes)
        return (SUCCESS,)

    def sim_cuMemcpyDtoDAsync(self, destination, source, nbytes, stream):
        self.owner(int(source), nbytes)
        self.owner(int(destination), nbytes)
        ctypes.memmove(int(destination), int(source), nbytes)
        self.occupy(2 * nbytes / 3e12)  # 3 TB/s, read + write
        return (SUCCESS,)

    def sim_cuMemsetD8Async(self, destination, value, nbytes, stream):
        self.owner(int(destination), nbytes)
        ctypes.memset(int(destination), value, nbytes)
        return (SUCCESS,)

    # --- events and graphs ---------------------------------------------------------------------
    def sim_cuEventCreate(self, flags):
        return SUCCESS, self.handle(real.CUevent, None)

    def sim_cuEventRecord(self, event, stream):
        assert self.capturing is None
        self.occupy(self.EVENT_SECONDS)
        self.handles[int(event)] = self.gpu_free
        return (SUCCESS,)

    def sim_cuEventElapsedTime(self, start, end):
        return SUCCESS, 1e3 * (self.handles[int(end)] - self.handles[int(start)])

    def sim_cuEventDestroy(self, event):
        return (SUCCESS,)

    def sim_cuStreamBeginCapture(self, stream, mode):
        assert self.capturing is None
        self.capturing = []
        return (SUCCESS,)

    def sim_cuStreamEndCapture(self, stream):
        captured, self.capturing = self.capturing, None
        return SUCCESS, self.handle(real.CUgraph, captured)

    def sim_cuGraphInstantiate(self, graph, flags):
        return SUCCESS, self.handle(real.CUgraphExec, list(self.handles[int(graph)]))

    def sim_cuGraphDestroy(self, graph):
        return (SUCCESS,)

    def sim_cuGraphExecDestroy(self, executable):
        return (SUCCESS,)

    def sim_cuGraphLaunch(self, executable, stream):
        records = self.handles[int(executable)]
        for record in records:
            self.execute(record)
        self.occupy(sum(map(self.duration, records)))
        return (SUCCESS,)


_RESULTS = {"cuMemAlloc": 2, "cuModuleLoadData": 2, "cuModuleGetFunction": 2, "cuStreamEndCapture": 2,
            "cuGraphInstantiate": 2, "cuEventCreate": 2, "cuEventElapsedTime": 2, "cuDevicePrimaryCtxRetain": 2,
            "cuDeviceGet": 2, "cuStreamCreate": 2, "cuDeviceGetName": 2, "cuDeviceGetAttribute": 2,
            "cuDriverGetVersion": 2, "cuFuncGetAttribute": 2, "cuOccupancyMaxActiveBlocksPerMultiprocessor": 2,
            "cuMemGetInfo": 3}


def install(**options) -> SimulatedDriver:
    """Put a simulated GPU (SimulatedDriver.for_spec(**options)) behind ptxgen.device in this process."""
    simulated = SimulatedDriver.for_spec(**options)
    device.driver = lambda instead="": simulated
    device.tensor_map_encoder = lambda: simulated.encode_tensor_map
    device.host_clock = lambda: simulated.host_now
    return simulated
