"""The Python API for engines: load compiled kernels and call them on your arrays.

    kernels = ptxgen.load("specs/qwen3.toml")     # or an artifact folder from `ptxgen build`
    kernels.qwen3_8b_rmsnorm(x, gamma, y, rows=1, stream=s)

GPU arrays (torch tensors, CuPy arrays, anything with `__cuda_array_interface__` or DLPack) launch
the kernel's cubin on the caller's stream: shapes, dtypes, device and contiguity are checked, and
the launch itself allocates nothing and never synchronises, so a CUDA graph can capture it (call
`kernels.prepare()` or each kernel once before capturing: the first call on a GPU loads the
module and allocates the kernel's zeroed workspaces). numpy arrays (and CPU tensors) run the same
PTX in the interpreter, updating the output arrays in place.

Loading an artifact folder reads manifest.json and the files it lists (digests checked); it
needs neither Jinja nor pydantic.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from .abi import DTYPE_SIZES
from .compiled import CompiledKernel, load_folder
from .dtypes import DTYPES
from .errors import LaunchError, PtxgenError

# Storage dtypes a parameter accepts, by ptxgen dtype (bf16 on the host: its uint16 bit pattern;
# u32 also as int32, the same bits, since torch has no general uint32).
ACCEPTED = {"f32": ("f32",), "f16": ("f16",), "bf16": ("bf16",), "u8": ("u8",), "u32": ("u32", "i32")}
_TORCH = {"torch.float32": "f32", "torch.float16": "f16", "torch.bfloat16": "bf16", "torch.uint8": "u8",
          "torch.uint32": "u32", "torch.int32": "i32"}
# Kernels load and store up to 16 bytes at once (v4.u32, v8.f16): every array starts on a multiple.
ALIGNMENT = 16
API_WITHOUT_GPU = "pass numpy arrays to run the kernel in the PTX interpreter"
_TYPESTR = {"f4": "f32", "f2": "f16", "u1": "u8", "u4": "u32", "i4": "i32", "u2": "bf16?"}
_DLPACK = {(2, 32): "f32", (2, 16): "f16", (4, 16): "bf16", (1, 8): "u8", (1, 32): "u32", (0, 32): "i32"}


def load(path: str | Path, *, archs: tuple[str, ...] | None = None) -> Kernels:
    """Kernels of a spec file (compiled through the cache, for `archs` or the spec's) or of an
    artifact folder made by `ptxgen build`."""
    if not isinstance(path, (str, os.PathLike)):
        raise PtxgenError(f"ptxgen.load: expected a spec file or artifact folder path, got {type(path).__name__}")
    if archs is not None:
        given, archs = archs, _iterable(archs)
        if isinstance(given, str) or not all(isinstance(a, str) for a in archs):
            raise PtxgenError(f"ptxgen.load: archs: expected a sequence of arch names such as ('sm_90',), got {given!r}")
    if not os.fspath(path):
        raise PtxgenError("ptxgen.load: the path is empty; give a spec file or a `ptxgen build` folder")
    path = Path(path)
    if not path.exists():
        raise PtxgenError(f"{path}: no such file or folder (expected a spec file or a `ptxgen build` folder)")
    if path.is_dir():
        if archs is not None:
            raise PtxgenError(f"{path}: an artifact folder holds the archs it was built for; archs= is for specs")
        return Kernels(load_folder(path), str(path))
    from .pipeline import compile_loaded
    from .spec import load_spec, with_archs

    spec = load_spec(path)
    if archs is not None:
        spec = with_archs(spec, archs, option="ptxgen.load")
    return Kernels(compile_loaded(spec).kernels, str(path))


def _iterable(value) -> tuple:
    try:
        return tuple(value)
    except TypeError:
        return (None,)


class UnknownKernel(LaunchError, AttributeError, KeyError):
    """No kernel of that name: a PtxgenError that attribute and item access also raise as theirs."""


class Kernels:
    """The kernels of one spec or artifact folder, by name (attribute or item access; a kernel
    named like a method, e.g. `prepare`, by item only)."""

    def __init__(self, compiled: list[CompiledKernel], source: str):
        self._kernels = {c.name: Kernel(c) for c in compiled}
        self.source = source

    def __getattr__(self, name: str) -> Kernel:
        kernels = self.__dict__.get("_kernels", {})
        if name in kernels:
            return kernels[name]
        raise UnknownKernel(f"{self.__dict__.get('source', 'ptxgen.load')}: no kernel named {name!r} "
                            f"(have: {', '.join(kernels)})")

    def __getitem__(self, name: str) -> Kernel:
        try:
            return self._kernels[name]
        except (KeyError, TypeError):
            raise UnknownKernel(f"{self.source}: no kernel named {name!r} (have: {', '.join(self._kernels)})") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._kernels)

    def __len__(self) -> int:
        return len(self._kernels)

    def __dir__(self):
        return [*super().__dir__(), *self._kernels]

    def prepare(self, device: int = 0) -> None:
        """Load every kernel on GPU `device` and allocate its workspaces (do this before capturing
        the calls into a CUDA graph)."""
        for kernel in self._kernels.values():
            kernel.prepare(device)


@dataclass
class _Array:
    """What a call needs of one argument array."""

    address: int | None  # device address (None: a host array)
    host: np.ndarray | None
    dtype: str  # a ptxgen dtype, or i32
    shape: tuple[int, ...]
    contiguous: bool
    device: int | None
    framework: str  # torch | cupy | cai | dlpack | numpy
    read_only: bool = False  # a device array its producer marks read-only (__cuda_array_interface__)

    @property
    def start(self) -> int:
        """Where its bytes begin, in the host's or the GPU's address space."""
        return self.address if self.address is not None else int(self.host.__array_interface__["data"][0])

    @property
    def nbytes(self) -> int:
        """Its size in bytes (once its dtype is checked: a ptxgen dtype or i32)."""
        if self.host is not None:
            return int(self.host.nbytes)
        return int(np.prod(self.shape, dtype=np.int64)) * (4 if self.dtype == "i32" else DTYPE_SIZES[self.dtype])


@dataclass
class _OnDevice:
    """A kernel loaded on one GPU: its session, loaded function and workspaces."""

    gpu: Any
    function: Any
    workspaces: dict


class Kernel:
    """One compiled kernel, callable as kernel(*arrays, stream=None, **scalars)."""

    def __init__(self, compiled: CompiledKernel):
        self.compiled = compiled
        self._devices: dict[int, _OnDevice] = {}

    @property
    def name(self) -> str:
        return self.compiled.name

    def __repr__(self) -> str:
        arrays = ", ".join(f"{p.name}: {p.describe()}" for p in self.compiled.arrays)
        scalars = ", ".join(p.name for p in self.compiled.scalars)
        return f"<ptxgen kernel {self.name} ({self.compiled.kind}) ({arrays}{'; ' + scalars if scalars else ''})>"

    def __call__(self, /, *arrays, stream=None, **named) -> None:
        compiled = self.compiled
        params = compiled.arrays
        if len(arrays) > len(params):
            raise LaunchError(f"{self.name}: takes {len(params)} arrays ({', '.join(p.name for p in params)}), "
                              f"got {len(arrays)}")
        given = dict(zip((p.name for p in params), arrays))
        scalar_names = set(compiled.scalar_limits)
        scalars = {}
        for key, value in named.items():
            if key in given:
                raise LaunchError(f"{self.name}: array {key!r} given twice")
            if any(p.name == key for p in params):
                given[key] = value
            elif key in scalar_names:
                compiled.check_passed_scalar(key)  # not a size hint of sample inputs
                scalars[key] = value
            else:
                known = ", ".join([p.name for p in params] + sorted(scalar_names))
                raise LaunchError(f"{self.name}: unknown argument {key!r} (takes: {known})")
        launch = compiled.launch(scalars)  # checks the scalars
        views = {}
        for param in params:
            if param.name not in given:
                raise LaunchError(f"{self.name}: array {param.name!r} is missing ({param.describe()})")
            views[param.name] = self._check(param, describe(given[param.name], param.name, self.name), scalars)
        self._check_overlaps(views)
        on_device = {v.address is not None for v in views.values()}
        if on_device == {False}:
            if stream is not None:
                raise LaunchError(f"{self.name}: stream: numpy (host) arrays run in the interpreter, on no CUDA "
                                  f"stream; pass stream only with GPU arrays, got {type(stream).__name__}")
            self._interpret(views, scalars)
        elif on_device == {True}:
            if launch.empty:
                return
            self._launch(views, scalars, stream)
        else:
            raise LaunchError(f"{self.name}: arrays must all be on the GPU or all on the host (numpy), not mixed")

    # --- checks ----------------------------------------------------------------------------------
    def _check(self, param, array: _Array, scalars: dict) -> _Array:
        where = f"{self.name}: {param.name}"
        expected_shape = param.concrete_shape(scalars)
        if array.dtype not in ACCEPTED[param.dtype]:
            given = array.host.dtype if array.framework == "numpy" else array.dtype
            raise LaunchError(f"{where}: expected dtype {param.dtype} ({param.describe()}), got {given} "
                              f"({array.framework})")
        if tuple(array.shape) != expected_shape:
            raise LaunchError(f"{where}: expected shape {list(expected_shape)} ({param.describe()}), got "
                              f"{list(array.shape)}")
        if not array.contiguous:
            raise LaunchError(f"{where}: expected a contiguous (row-major) array; pass .contiguous() / "
                              "ascontiguousarray")
        if param.written and array.host is not None and not array.host.flags.writeable:
            raise LaunchError(f"{where}: the kernel writes it, but the numpy array is read-only")
        if param.written and array.read_only:
            raise LaunchError(f"{where}: the kernel writes it, but the array is read-only ({array.framework})")
        if array.nbytes and array.start % ALIGNMENT:
            raise LaunchError(f"{where}: starts at an address that is not a multiple of {ALIGNMENT} bytes (the kernels "
                              f"move 16-byte vectors); pass an array that starts on one (e.g. a copy, not an offset view)")
        return array

    def _check_overlaps(self, views: dict[str, _Array]) -> None:
        """No array the kernel writes may share memory with another argument (it reads them
        while writing, possibly through the non-coherent load path)."""
        spans = [(name, view.start, view.start + view.nbytes, view.address is None) for name, view in views.items()
                 if view.nbytes]
        for param in self.compiled.arrays:
            mine = next((span for span in spans if span[0] == param.name), None)
            if not param.written or mine is None:
                continue
            for other in spans:
                if other[0] != param.name and other[3] == mine[3] and other[1] < mine[2] and mine[1] < other[2]:
                    raise LaunchError(f"{self.name}: {param.name} shares memory with {other[0]}: the kernel writes "
                                      f"{param.name} while it reads the other arrays; pass separate arrays")

    # --- the interpreter (host arrays) ------------------------------------------------------------
    def _interpret(self, views: dict[str, _Array], scalars: dict) -> None:
        from .runner import launch_arrays

        compiled = self.compiled
        buffers = {name: view.host for name, view in views.items()}
        compiled.check_values(buffers)
        for param in compiled.workspaces:
            buffers[param.name] = np.zeros(param.concrete_shape(scalars), dtype=DTYPES[param.dtype].numpy)
        launch_arrays(compiled, buffers, scalars)  # the portable PTX, sanitizer on, as `ptxgen run`

    # --- the GPU --------------------------------------------------------------------------------
    def prepare(self, device: int = 0) -> _OnDevice:
        """Load this kernel on GPU `device` and allocate its zeroed workspaces (once)."""
        if device in self._devices and not self._devices[device].gpu.broken:
            return self._devices[device]
        from .device import driver, session

        driver(instead=API_WITHOUT_GPU)
        gpu = session(device)
        function = gpu.kernel(self.compiled)
        workspaces = {}
        for param in self.compiled.workspaces:
            workspaces[param.name] = gpu.alloc(param.nbytes({}))
            gpu.zero(workspaces[param.name])
        gpu.synchronize(f"{self.name}: zeroing its workspaces")
        self._devices[device] = _OnDevice(gpu, function, workspaces)
        return self._devices[device]

    def _launch(self, views: dict[str, _Array], scalars: dict, stream) -> None:
        devices = {v.device for v in views.values()}
        if len(devices) != 1 or None in devices:
            raise LaunchError(f"{self.name}: arrays must all be on one GPU, got devices {sorted(map(str, devices))}")
        (device,) = devices
        state = self.prepare(device)
        state.gpu.activate()
        buffers = {name: view.address for name, view in views.items()}
        buffers.update(state.workspaces)
        launch = self.compiled.launch(scalars, state.gpu.arch)
        handle = stream_handle(stream, views, device)
        state.gpu.launcher(state.function, launch, self.compiled.args(buffers, scalars),
                           stream=state.gpu.cu.CUstream(handle))()


def stream_handle(stream, views: dict[str, _Array], device: int) -> int:
    """The CUstream handle to launch on: the one given, else the current stream of the arrays'
    framework (torch, CuPy), else the legacy default stream."""
    if stream is None:
        frameworks = {v.framework for v in views.values()}
        if "torch" in frameworks:
            import torch

            return int(torch.cuda.current_stream(device).cuda_stream)
        if "cupy" in frameworks:
            import cupy

            return int(cupy.cuda.get_current_stream().ptr)
        return 0
    if isinstance(stream, (int, np.integer)) and not isinstance(stream, bool):
        return int(stream)
    if hasattr(stream, "cuda_stream"):  # torch.cuda.Stream
        return int(stream.cuda_stream)
    if hasattr(stream, "__cuda_stream__"):  # the CUDA stream protocol (cuda.core, ...)
        return int(stream.__cuda_stream__()[1])
    if hasattr(stream, "ptr"):  # cupy.cuda.Stream
        return int(stream.ptr)
    raise LaunchError(f"stream: expected a CUDA stream (torch, CuPy, cuda.core, or an int handle), got "
                      f"{type(stream).__name__}")


# --- reading arrays from any framework ------------------------------------------------------------------
def describe(obj, name: str, kernel: str) -> _Array:
    """What a call needs of one argument, without copying it or touching the GPU's memory."""
    if isinstance(obj, np.ma.MaskedArray):
        raise LaunchError(f"{kernel}: {name}: a numpy masked array: the kernel reads and writes every element, masked "
                          "or not; pass its .data (or .filled(value))")
    if isinstance(obj, np.ndarray):  # a subclass (np.memmap, np.matrix, ...) as the plain array of its memory
        return _host(obj if type(obj) is np.ndarray else obj.view(np.ndarray))
    module = type(obj).__module__.split(".")[0]
    if module == "torch" and hasattr(obj, "data_ptr"):
        dtype = _TORCH.get(str(obj.dtype), str(obj.dtype))
        if not obj.is_cuda:
            host = obj.detach()
            host = (host.view(__import__("torch").int16) if dtype == "bf16" else host).numpy()
            return _host(host.view(np.uint16) if dtype == "bf16" else host)
        return _Array(int(obj.data_ptr()), None, dtype, tuple(obj.shape), bool(obj.is_contiguous()),
                      int(obj.device.index), "torch")
    if hasattr(obj, "__cuda_array_interface__"):
        return _cuda_array_interface(obj.__cuda_array_interface__, "cupy" if module == "cupy" else "cai")
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        where = f"{kernel}: {name}: not a usable DLPack array"
        try:
            device_type = int(obj.__dlpack_device__()[0])
            if device_type == 1:  # kDLCPU
                return _host(np.from_dlpack(obj))
        except (TypeError, ValueError, IndexError, BufferError, RuntimeError) as error:
            raise LaunchError(f"{where} ({type(error).__name__}: {error})") from None
        from .device import driver

        driver(instead=API_WITHOUT_GPU)
        return _dlpack(obj, where)
    raise LaunchError(f"{kernel}: {name}: expected an array (numpy, torch, CuPy, DLPack or "
                      f"__cuda_array_interface__), got {type(obj).__name__}")


def _host(array: np.ndarray) -> _Array:
    kinds = {"float32": "f32", "float16": "f16", "uint16": "bf16", "uint8": "u8", "uint32": "u32", "int32": "i32"}
    dtype = kinds.get(str(array.dtype), str(array.dtype))
    return _Array(None, array, dtype, array.shape, bool(array.flags.c_contiguous), None, "numpy")


def _contiguous(shape: tuple[int, ...], strides, itemsize: int) -> bool:
    if strides is None:
        return True
    expected = itemsize
    for size, stride in zip(reversed(shape), reversed(strides)):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _cuda_array_interface(interface: dict, framework: str) -> _Array:
    from .device import driver, pointer_device

    driver(instead=API_WITHOUT_GPU)
    shape = tuple(interface["shape"])
    typestr = interface["typestr"]
    dtype = _TYPESTR.get(typestr[1:], typestr)
    if dtype == "bf16?":  # 2-byte unsigned: the bit pattern of bf16 (no typestr names bf16)
        dtype = "bf16"
    address = int(interface["data"][0])
    itemsize = int(typestr[2:])
    device = pointer_device(address) if address else None
    return _Array(address, None, dtype, shape, _contiguous(shape, interface.get("strides"), itemsize), device,
                  framework, read_only=bool(interface["data"][1]))


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


def _dlpack(obj, where: str) -> _Array:
    """A DLPack CUDA tensor's address, dtype, shape and layout (the capsule is left unconsumed, so
    its destructor releases it; the producer's object keeps the memory alive)."""
    try:
        try:
            capsule = obj.__dlpack__(stream=-1)  # -1: no synchronisation; the arrays are ready on the launch stream
        except TypeError:  # a producer without the stream keyword
            capsule = obj.__dlpack__()
    except (TypeError, ValueError, BufferError, RuntimeError) as error:
        raise LaunchError(f"{where} ({type(error).__name__}: {error})") from None
    is_valid = ctypes.pythonapi.PyCapsule_IsValid
    is_valid.restype, is_valid.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
    if not is_valid(capsule, b"dltensor"):
        raise LaunchError(f"{where} (__dlpack__ gave a {type(capsule).__name__}, not an unconsumed 'dltensor' capsule)")
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    tensor = _DLTensor.from_address(get_pointer(capsule, b"dltensor"))
    shape = tuple(tensor.shape[i] for i in range(tensor.ndim))
    strides = tuple(tensor.strides[i] for i in range(tensor.ndim)) if tensor.strides else None
    code = (tensor.dtype.code, tensor.dtype.bits)
    dtype = _DLPACK.get(code, f"dlpack{code}") if tensor.dtype.lanes == 1 else "vector"
    contiguous = strides is None or _contiguous(shape, tuple(s * (tensor.dtype.bits // 8) for s in strides),
                                                tensor.dtype.bits // 8)
    return _Array(int(tensor.data or 0) + int(tensor.byte_offset), None, dtype, shape, contiguous,
                  int(tensor.device.device_id), "dlpack")
