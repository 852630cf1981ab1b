"""The device runtime and `ptxgen bench` on a machine without a GPU (skipped where there is one).

1. Without a driver, every way onto the device ends in exit 2 and the one clear message.
2. The device runtime's own logic (copies in and back in place, argument packing checked
   against the PTX, shared-memory opt-in, cooperative launches, graph capture and replay,
   event timing, error mapping, bench's rotation and JSON) against a simulated driver. Every
   call first goes to the real cuda.bindings function, which converts and type-checks the
   arguments exactly as on a GPU machine and then fails to find libcuda; the simulation
   then plays the driver: device memory is host memory, and a "kernel" computes its kind's
   float64 reference. This proves the plumbing, not the GPU: tests/test_gpu.py does that.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import sys

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

from ptxgen import device
from ptxgen.device import NO_DEVICE
from ptxgen.dtypes import DTYPES, from_float, to_float64
from ptxgen.errors import AssemblerError, DeviceUnavailable, LaunchError, PtxgenError
from ptxgen.abi import Launch
from ptxgen.kernels import kind_of
from ptxgen.pipeline import compile_kernel
from ptxgen.runner import prepare_arrays, run
from ptxgen.spec import load_spec
from ptxgen.verify import relative_l2

from helpers import ROOT, make_config, run_cli

try:
    device.driver()
    pytest.skip("a CUDA driver and GPU are present: tests/test_gpu.py covers the device", allow_module_level=True)
except DeviceUnavailable:
    pass

from cuda.bindings import driver as real  # noqa: E402  (after the skip: importing needs no driver)
from cuda.pathfinder import DynamicLibNotFoundError  # noqa: E402

SPEC = ROOT / "specs" / "qwen3.toml"
SUCCESS = real.CUresult.CUDA_SUCCESS


def one_line(text: str) -> str:
    return " ".join(text.split())


# --- 1. no driver: exit 2, one clear message ------------------------------------------------------
def test_run_on_device_without_a_driver_raises_the_clear_message():
    kernel = spec_kernel("qwen3_8b_rmsnorm")
    with pytest.raises(DeviceUnavailable, match="no CUDA driver/GPU found"):
        device.run_on_device(kernel, Launch((1, 1, 1), (32, 1, 1)), [])


@pytest.mark.parametrize("args", [
    ["bench", "incremental_attention"],
    ["bench"],
    ["bench", "qwen3_8b_rmsnorm", "--set", "rows=1,8", "--json", "unused.json"],
])
def test_bench_without_a_gpu_exits_2_with_the_message(args):
    result = run_cli(*args)
    assert result.returncode == 2, f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    assert NO_DEVICE in one_line(result.stderr), result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_run_with_the_device_backend_without_a_gpu_exits_2(tmp_path):
    inputs = tmp_path / "in.npz"
    np.savez(inputs, x=np.ones((1, 4096), np.float32), gamma=np.ones(4096, np.float32))
    result = run_cli("run", "qwen3_8b_rmsnorm", "--spec", str(SPEC), "--inputs", str(inputs),
                     "--outputs", str(tmp_path / "out.npz"), "--set", "rows=1", "--backend", "device")
    assert result.returncode == 2, f"exit {result.returncode}\nstderr: {result.stderr}"
    assert NO_DEVICE in one_line(result.stderr), result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out.npz").exists()


def test_make_bench_script_without_a_gpu_exits_2():
    import subprocess

    result = subprocess.run([sys.executable, str(ROOT / "bench" / "run_all.py")], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    assert NO_DEVICE in one_line(result.stderr)
    assert "Traceback" not in result.stderr


# --- 2. the runtime against a simulated driver -------------------------------------------------------
class SimulatedDriver:
    """cuda.bindings.driver as seen by ptxgen.device, with a host-memory GPU behind it."""

    L2_BYTES = 1 << 20
    sm_count = 132
    captures_cooperative = True  # whether a cooperative launch may be captured into a graph
    KERNEL_MS = 0.004  # simulated duration of one kernel
    DEFAULT_DYNAMIC = 48 * 1024

    def __init__(self, kernels: dict):
        self.kernels = kernels  # entry -> kernel config whose reference plays the kernel
        self.memory: dict[int, np.ndarray] = {}  # address -> allocation
        self.handles: dict[int, object] = {}  # module/function/graph/event ids -> what they hold
        self.next_handle = 0x1000
        self.calls: list[tuple[str, tuple]] = []
        self.fail: dict[str, object] = {}  # call name -> CUresult it returns once
        self.capturing: list | None = None
        self.clock_ms = 0.0
        self.wrong = set()  # entries whose results the simulation spoils
        self.loaded = []  # what each cuModuleLoadData was given: "cubin" or "ptx"

    # Enums and handle types come from the real module; each call is checked by it first.
    def __getattr__(self, name):
        simulated = getattr(type(self), "sim_" + name, None)
        if simulated is None:
            if name.startswith("cu"):
                raise AttributeError(f"the simulated driver has no {name}")
            return getattr(real, name)

        def call(*args):
            self.calls.append((name, args))
            try:
                getattr(real, name)(*args)
            except DynamicLibNotFoundError:
                pass  # the arguments converted; only libcuda is missing
            status = self.fail.pop(name, None)
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

    def sim_cuDevicePrimaryCtxReset(self, dev):
        return (SUCCESS,)

    def sim_cuCtxSetCurrent(self, ctx):
        return (SUCCESS,)

    def sim_cuStreamCreate(self, flags):
        return SUCCESS, real.CUstream(0x200)

    def sim_cuStreamDestroy(self, stream):
        return (SUCCESS,)

    def sim_cuStreamSynchronize(self, stream):
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
        values = {"SHARED_SIZE_BYTES": 0, "MAX_THREADS_PER_BLOCK": 1024,
                  "MAX_DYNAMIC_SHARED_SIZE_BYTES": self.handles[int(function)]["dynamic"]}
        return SUCCESS, values[attribute.name.removeprefix("CU_FUNC_ATTRIBUTE_")]

    def sim_cuFuncSetAttribute(self, function, attribute, value):
        assert attribute.name == "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES"
        self.handles[int(function)]["dynamic"] = value
        return (SUCCESS,)

    def sim_cuOccupancyMaxActiveBlocksPerMultiprocessor(self, function, threads, dynamic):
        return SUCCESS, 2

    def sim_cuLaunchKernel(self, function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        return self.launch(function, (gx, gy, gz), (bx, by, bz), shared, params, cooperative=False)

    def sim_cuLaunchCooperativeKernel(self, function, gx, gy, gz, bx, by, bz, shared, stream, params):
        return self.launch(function, (gx, gy, gz), (bx, by, bz), shared, params, cooperative=True)

    def launch(self, function, grid, block, shared, params, cooperative):
        if shared > self.handles[int(function)]["dynamic"]:
            return (real.CUresult.CUDA_ERROR_INVALID_VALUE,)
        if cooperative and self.capturing is not None and not self.captures_cooperative:
            return (real.CUresult.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,)
        values, types = params if params else ((), ())
        record = (self.handles[int(function)]["entry"], grid, block, shared, tuple(values), tuple(types), cooperative)
        if self.capturing is not None:
            self.capturing.append(record)
        else:
            self.execute(record)
        return (SUCCESS,)

    def execute(self, record):
        entry, grid, block, shared, values, types, cooperative = record
        if entry == device.DELAY_ENTRY:
            assert types == (ctypes.c_uint64,) and values[0] > 0
            return
        kind = kind_of(self.kernels[entry])
        params = kind.params()
        assert len(values) == len(params), f"{entry}: {len(values)} arguments for {len(params)} parameters"
        scalars = {}
        for param, value, ctype in zip(params, values, types):
            assert ctype is (ctypes.c_void_p if param.is_array else ctypes.c_uint32), (param.name, ctype)
            if not param.is_array:
                scalars[param.name] = value
        if "seq_len" in kind.scalar_limits() and "seq_len" not in scalars:
            scalars["seq_len"] = 0  # indirect length: only the device copy counts
        expected = kind.launch(scalars)
        assert expected.block == block, entry
        assert expected.grid == grid or (expected.any_grid and cooperative and grid[0] < expected.grid[0]), entry
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
        self.clock_ms += self.KERNEL_MS

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
        self.clock_ms += 2 * nbytes / 3e12 * 1e3  # 3 TB/s, read + write
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
        self.handles[int(event)] = self.clock_ms
        return (SUCCESS,)

    def sim_cuEventElapsedTime(self, start, end):
        return SUCCESS, self.handles[int(end)] - self.handles[int(start)]

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
        for record in self.handles[int(executable)]:
            self.execute(record)
        return (SUCCESS,)


_RESULTS = {"cuMemAlloc": 2, "cuModuleLoadData": 2, "cuModuleGetFunction": 2, "cuStreamEndCapture": 2,
            "cuGraphInstantiate": 2, "cuEventCreate": 2, "cuEventElapsedTime": 2}


@pytest.fixture
def sim(monkeypatch):
    """A simulated GPU behind ptxgen.device; every spec kernel (and test kernels) can run on it."""
    kernels = {kernel.name: kernel for kernel in load_spec(SPEC).spec.kernels}
    simulated = SimulatedDriver(kernels)
    monkeypatch.setattr(device, "driver", lambda: simulated)
    monkeypatch.setattr(device, "_SESSIONS", {})
    return simulated


def spec_kernel(name, archs=("sm_90",)):
    """A kernel of specs/qwen3.toml with a cubin for the simulated GPU (an sm_90)."""
    return compile_kernel(load_spec(SPEC).spec.kernel(name), archs)


def session():
    return device._SESSIONS[0]


@pytest.mark.parametrize("name, scalars", [("qwen3_8b_rmsnorm", {"rows": 3}), ("qwen3_8b_rope_q", {"pos": 77})])
def test_run_copies_in_launches_once_and_copies_back_in_place(sim, name, scalars):
    kernel = spec_kernel(name)
    kind = kernel.definition
    inputs = kind.sample_inputs(np.random.default_rng(1), scalars)
    arrays = run(kernel, inputs, scalars, backend="device")
    reference = kind.reference(inputs, scalars)
    for param in kind.params():
        if param.written:
            error = relative_l2(to_float64(arrays[param.name], param.dtype), reference[param.name])
            assert error < 1e-6, f"{param.name} came back wrong from the device: relative L2 {error:.2e}"
    launches = [args for call, args in sim.calls if call == "cuLaunchKernel"]
    assert len(launches) == 1
    launch = kind.launch(scalars)
    assert tuple(launches[0][1:7]) == (*launch.grid, *launch.block)
    assert "cuFuncSetAttribute" not in sim.names(), "no shared-memory opt-in below 48 KB"
    assert not sim.memory or all(b.capacity for b in session().allocations.values())


def test_arguments_are_checked_against_the_kernel_parameters(sim):
    kernel = spec_kernel("qwen3_8b_rmsnorm")
    kind = kernel.definition
    arrays = prepare_arrays(kernel, kind.sample_inputs(np.random.default_rng(0), {"rows": 1}), {"rows": 1})
    args = kernel.args(arrays, {"rows": 1})
    launch = kernel.launch({"rows": 1})
    with pytest.raises(LaunchError, match="expected 4 arguments"):
        device.run_on_device(kernel, launch, args[:3])
    with pytest.raises(LaunchError, match="'rows' .* cannot hold"):
        device.run_on_device(kernel, launch, args[:3] + [1 << 32])
    with pytest.raises(LaunchError, match="'x' is an array; got str"):
        device.run_on_device(kernel, launch, ["x"] + args[1:])
    with pytest.raises(LaunchError, match="finding kernel 'missing' in its module"):
        device.run_on_device(dataclasses.replace(kernel, name="missing"), launch, args)
    assert "cuLaunchKernel" not in sim.names()


def test_large_dynamic_shared_memory_is_opted_in_and_cooperative_launches_are_used(sim):
    kernel = spec_kernel("qwen3_8b_rmsnorm")
    kind = kernel.definition
    arrays = prepare_arrays(kernel, kind.sample_inputs(np.random.default_rng(0), {"rows": 1}), {"rows": 1})
    args = kernel.args(arrays, {"rows": 1})
    base = kernel.launch({"rows": 1})
    big = Launch(base.grid, base.block, dynamic_shared=100_000, cooperative=True)
    device.run_on_device(kernel, big, args)
    assert ("cuFuncSetAttribute" in sim.names()
            and [a for n, a in sim.calls if n == "cuFuncSetAttribute"][0][2] == 100_000)
    assert "cuLaunchCooperativeKernel" in sim.names() and "cuLaunchKernel" not in sim.names()
    assert np.isfinite(arrays["y"]).all()
    with pytest.raises(LaunchError, match="exceed Simulated GPU's 232448 bytes"):
        device.run_on_device(kernel, Launch(base.grid, base.block, dynamic_shared=300_000), args)
    with pytest.raises(LaunchError, match="cooperative grid of 1000 CTAs does not fit"):
        device.run_on_device(kernel, Launch((1000, 1, 1), base.block, cooperative=True), args)


def test_a_cooperative_any_grid_launch_shrinks_to_what_is_co_resident(sim):
    sim.sm_count = 16  # 2 CTAs an SM (the simulated occupancy): 32 fit, the tiny decoder asks for 128
    kernel = spec_kernel("qwen3_tiny_decoder")
    kind = kernel.definition
    assert kind.launch({"pos": 5}).grid == (128, 1, 1) and kind.launch({"pos": 5}).any_grid
    inputs = kind.sample_inputs(np.random.default_rng(4), {"pos": 5})
    arrays = run(kernel, inputs, {"pos": 5}, backend="device")
    (launch,) = [args for name, args in sim.calls if name == "cuLaunchCooperativeKernel"]
    assert tuple(launch[1:4]) == (32, 1, 1)
    error = relative_l2(arrays["x"].astype(np.float64), kind.reference(inputs, {"pos": 5})["x"])
    assert error < 1e-6


def test_a_kernel_fault_is_a_launch_error_and_the_next_run_starts_a_fresh_context(sim):
    kernel = spec_kernel("qwen3_8b_rmsnorm")
    kind = kernel.definition
    inputs = kind.sample_inputs(np.random.default_rng(0), {"rows": 2})
    sim.fail["cuStreamSynchronize"] = real.CUresult.CUDA_ERROR_ILLEGAL_ADDRESS
    with pytest.raises(LaunchError) as caught:
        run(kernel, inputs, {"rows": 2}, backend="device")
    message = str(caught.value)
    assert f"running {kernel.name}" in message and "CUDA_ERROR_ILLEGAL_ADDRESS" in message
    assert "--backend emulator" in message
    arrays = run(kernel, inputs, {"rows": 2}, backend="device")
    assert "cuDevicePrimaryCtxReset" in sim.names()
    assert np.isfinite(arrays["y"]).all()


def test_failed_cuda_calls_name_the_error(sim):
    kernel = spec_kernel("qwen3_8b_rmsnorm")
    kind = kernel.definition
    inputs = kind.sample_inputs(np.random.default_rng(0), {"rows": 1})
    sim.fail["cuMemAlloc"] = real.CUresult.CUDA_ERROR_OUT_OF_MEMORY
    with pytest.raises(PtxgenError, match="allocating 16,384 bytes of device memory failed on Simulated GPU: "
                                          "CUDA_ERROR_OUT_OF_MEMORY"):
        run(kernel, inputs, {"rows": 1}, backend="device")
    sim.fail["cuLaunchKernel"] = real.CUresult.CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
    with pytest.raises(LaunchError, match="launching qwen3_8b_rmsnorm .*CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"):
        run(kernel, inputs, {"rows": 1}, backend="device")


def test_the_gpus_own_cubin_is_loaded_and_ptx_is_jit_compiled_only_without_one(sim):
    inputs = spec_kernel("qwen3_8b_rmsnorm").definition.sample_inputs(np.random.default_rng(0), {"rows": 1})
    for archs, loaded in ((("sm_90",), "cubin"), (("sm_80", "sm_86"), "ptx")):
        kernel = spec_kernel("qwen3_8b_rmsnorm", archs)
        sim.loaded.clear()
        arrays = run(kernel, inputs, {"rows": 1}, backend="device")
        assert sim.loaded == [loaded], f"cubins for {archs} on an sm_90: expected the {loaded} to be loaded"
        assert np.isfinite(arrays["y"]).all()
    too_new = dataclasses.replace(kernel, binaries={}, variants={
        "sm_100": dataclasses.replace(kernel.portable, target="sm_100")})
    with pytest.raises(LaunchError, match=r"nothing runs on Simulated GPU \(sm_90\).*--arch sm_90"):
        run(too_new, inputs, {"rows": 1}, backend="device")


def test_graph_replays_read_the_length_from_the_device(sim):
    config = make_config("incremental_attention", name="decode", num_heads=4, num_kv_heads=2, head_dim=64,
                         max_seq_len=256, indirect_seq_len=True)
    sim.kernels[config.name] = config
    kernel = compile_kernel(config, ("sm_90",))
    kind = kernel.definition
    inputs = kind.sample_inputs(np.random.default_rng(3), {"seq_len": 256})  # the whole cache holds keys
    arrays = prepare_arrays(kernel, inputs, {"seq_len": 256})
    gpu = device.session()
    buffers = {name: gpu.alloc(array.nbytes) for name, array in arrays.items()}
    for name, array in arrays.items():
        gpu.upload(buffers[name], array)
    loaded = gpu.kernel(kernel)
    args = kernel.args(buffers, {})
    graph = gpu.capture(lambda: gpu.launch(loaded, kernel.launch({"seq_len": 1}), args))
    assert "cuLaunchKernel" in sim.names() and sim.capturing is None
    for length in (1, 17, 100, 256):
        arrays["seq_len_ptr"][0] = length
        gpu.upload(buffers["seq_len_ptr"], arrays["seq_len_ptr"])
        gpu.replay(graph)
        gpu.download(arrays["out"], buffers["out"])
        expected = kind.reference(arrays, {"seq_len": length})["out"]
        assert relative_l2(arrays["out"].astype(np.float64), expected) < 1e-6, f"replay at seq_len {length}"
    gpu.destroy(graph)


def test_event_timing_holds_the_gpu_while_the_host_queues(sim):
    gpu = device.session()
    source, destination = gpu.alloc(1 << 16), gpu.alloc(1 << 16)
    times = gpu.time(lambda i: gpu.copy(destination, source), iters=100, warmup=5)
    assert len(times) == 100 and all(t > 0 for t in times)
    names = sim.names()
    first_record = names.index("cuEventRecord")
    assert "cuLaunchKernel" in names[:first_record], "the spin kernel is queued before the first event"
    nbytes, seconds = gpu.copy_bandwidth(nbytes=1 << 20)
    assert 2 * nbytes / seconds == pytest.approx(3e12, rel=1e-6)


@pytest.fixture
def bench_app():
    from ptxgen.cli import app

    return app


def test_bench_checks_then_times_with_rotated_buffers_and_writes_json(sim, bench_app, tmp_path):
    path = tmp_path / "bench.json"
    result = CliRunner().invoke(bench_app, ["bench", "rmsnorm", "--spec", str(SPEC), "--set", "rows=1,4",
                                            "--graph", "--json", str(path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(path.read_text())
    assert report["device"]["name"] == "Simulated GPU" and report["device"]["driver"] == "13.0"
    assert report["copy_bandwidth"]["gbs"] == pytest.approx(3000, rel=1e-6)
    assert [row["scalars"] for row in report["rows"]] == [{"rows": 1}, {"rows": 4}]
    for row in report["rows"]:
        assert row["kernel"] == "qwen3_8b_rmsnorm" and row["passed"] and row["checks"]
        assert row["median_us"] == pytest.approx(4.0, rel=1e-6) and row["p10_us"] <= row["p90_us"]
        assert row["gbs"] == pytest.approx(row["bytes"] / 4e-6 / 1e9)
        assert row["pct_copy_bw"] == pytest.approx(100 * row["gbs"] / 3000)
        assert row["graph"]["median_us"] == pytest.approx(4.0, rel=1e-6)
        assert row["sets"] * row["set_bytes"] >= 3 * SimulatedDriver.L2_BYTES, "buffers rotate past L2"
    assert "cuGraphLaunch" in sim.names()


def test_bench_does_not_time_a_kernel_that_fails_its_check(sim, bench_app, tmp_path):
    sim.wrong.add("qwen3_8b_swiglu")
    path = tmp_path / "bench.json"
    result = CliRunner().invoke(bench_app, ["bench", "swiglu", "--spec", str(SPEC), "--json", str(path)])
    assert result.exit_code == 1, result.output
    row = json.loads(path.read_text())["rows"][0]
    assert not row["passed"] and row["median_us"] is None
    names = sim.names()
    last_download = max(i for i, name in enumerate(names) if name == "cuMemcpyDtoHAsync")
    assert "cuEventRecord" in names[:last_download] and "cuEventRecord" not in names[last_download:]


def quick_bench(sim, monkeypatch, rows, graph=False) -> dict:
    """run_bench on (spec kernel name, scalars) rows with few timed runs (the simulation computes
    every launch in float64); the simulation also plays the separate kernels of fused kinds."""
    from ptxgen import bench

    plan = []
    for name, scalars in rows:
        kernel = spec_kernel(name)
        step = kernel.definition.separate_step(scalars)
        if step is not None:
            sim.kernels.update({call.kernel.name: call.kernel for call in step[1]})
        plan.append((kernel, scalars))
    monkeypatch.setattr(bench, "MIN_ITERS", 3)
    monkeypatch.setattr(bench, "WARMUP", 1)
    return bench.run_bench({"file": str(SPEC), "sha256": "0"}, plan, iters=3, graph=graph)


def bench_step_kernel(sim, monkeypatch, name, scalars, graph=False):
    """quick_bench of one fused spec kernel; its results and its separate kernels' Calls."""
    _, calls = spec_kernel(name).definition.separate_step(scalars)
    return quick_bench(sim, monkeypatch, [(name, scalars)], graph), calls


def test_make_bench_report_has_the_targets_and_the_decode_step_in_tokens_per_second(sim, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("run_all", ROOT / "bench" / "run_all.py")
    run_all = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "run_all", run_all)  # its dataclasses look their module up
    spec.loader.exec_module(run_all)
    results = quick_bench(sim, monkeypatch, [("qwen3_8b_rmsnorm", {"rows": 1}), ("qwen3_tiny_decoder", {"pos": 63})],
                          graph=True)
    report = run_all.markdown(results, ["a note"])
    lines = report.splitlines()
    # The simulation spends 4 us a kernel: 250000 calls/s in one launch, 26 launches one by one.
    assert "| one launch (persistent kernel) | 4.0 | 250000.0 |" in report, report
    assert "| one launch, CUDA-graph replay | 4.0 | 250000.0 |" in report
    assert any(line.startswith("| separate kernels, 26 launches one by one | 104.0 | 9615.4 |") for line in lines)
    assert any(line.startswith("| separate kernels, one CUDA graph | 104.0 | 9615.4 |") for line in lines)
    assert "| rmsnorm <= 5 us (decode, one row) | 4.0 µs (rows=1) | yes |" in report
    assert "| q4k_gemv n=12288 k=4096 >= 75% of copy bandwidth | no matching row | n/a |" in report
    assert "- a note" in report


def test_bench_checks_a_fused_kernel_against_its_separate_kernels_then_times_both(sim, monkeypatch, capsys):
    from ptxgen.bench import print_results

    results, calls = bench_step_kernel(sim, monkeypatch, "qwen3_tiny_decoder", {"pos": 63}, graph=True)
    row = results["rows"][0]
    step_check = [c for c in row["checks"] if c["param"] == "x vs the separate kernels"]
    assert len(step_check) == 1 and step_check[0]["passed"] and step_check[0]["error"] < 1e-6, row["checks"]
    step = row["step"]
    assert step["launches"] == len(calls) == 2 * 13
    assert step["kernels"] == 12, "the two residual adds share a kernel; 12 distinct kernels"
    # The simulation spends KERNEL_MS (4 us) a kernel: one launch against 26.
    assert row["median_us"] == pytest.approx(4.0) and row["graph"]["median_us"] == pytest.approx(4.0)
    assert step["one_by_one"]["median_us"] == pytest.approx(26 * 4.0)
    assert step["graph"]["median_us"] == pytest.approx(26 * 4.0)
    assert all(step["wall_us"][way] > 0 for way in ("kernel", "one_by_one", "graph"))
    launched = {int(args[0]) for name, args in sim.calls if name in ("cuLaunchKernel", "cuLaunchCooperativeKernel")}
    assert len(launched) >= 13, "the decoder, its 12 separate kernels (and the timing spin kernel) ran"
    assert "cuLaunchCooperativeKernel" in sim.names()
    print_results(results, Console(), Console(stderr=True))
    assert "26 (12 kernels)" in one_line(capsys.readouterr().out)


def test_a_launch_the_driver_cannot_capture_is_timed_without_a_graph_and_noted(sim, monkeypatch):
    sim.captures_cooperative = False
    results, _ = bench_step_kernel(sim, monkeypatch, "qwen3_tiny_decoder", {"pos": 9}, graph=True)
    row = results["rows"][0]
    assert row["passed"] and row["median_us"] == pytest.approx(4.0) and row["graph"] is None
    assert any("not timed as a CUDA graph" in note and "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED" in note
               for note in row["notes"]), row["notes"]
    assert sim.capturing is None, "the capture was ended"
    assert row["step"]["graph"]["median_us"] == pytest.approx(26 * 4.0), "the separate kernels still form a graph"


def test_bench_does_not_time_a_fused_kernel_that_disagrees_with_its_separate_kernels(sim, monkeypatch):
    from ptxgen.bench import failures

    sim.wrong.add("step_swiglu")
    results, _ = bench_step_kernel(sim, monkeypatch, "qwen3_tiny_decoder", {"pos": 5})
    row = results["rows"][0]
    assert not row["passed"] and row["median_us"] is None and row["step"] is None
    assert any("x vs the separate kernels" in line for line in failures(results))
    names = sim.names()
    first_check = names.index("cuLaunchCooperativeKernel")
    assert "cuEventRecord" not in names[first_check:], "nothing timed after the checks"
    pooled = {b.address for buffers in session().pool.values() for b in buffers}
    assert set(session().allocations) <= pooled, "the step's buffers were freed"


def test_bench_rejects_a_missing_matplotlib_and_unknown_scalars_before_timing(sim, bench_app, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else find_spec(name, *a))
    result = CliRunner().invoke(bench_app, ["bench", "rmsnorm", "--spec", str(SPEC), "--plot", "x.png"])
    assert isinstance(result.exception, PtxgenError) and "matplotlib" in str(result.exception)
    result = CliRunner().invoke(bench_app, ["bench", "--spec", str(SPEC), "--set", "nonsense=3"])
    assert isinstance(result.exception, LaunchError) and "nonsense" in str(result.exception)
    result = CliRunner().invoke(bench_app, ["bench", "rmsnorm", "--spec", str(SPEC), "--iters", "10"])
    assert result.exit_code == 2 and "cuEventCreate" not in sim.names()


class FakeTensor(np.ndarray):
    """Just enough of a torch tensor for bench's peer plumbing (f32 only)."""

    def to(self, device):
        return self.copy()

    def clone(self):
        return self.copy()

    def detach(self):
        return self

    def float(self):
        return self.astype(np.float32)

    def cpu(self):
        return self

    def numpy(self):
        return np.asarray(self)


class FakeTorch:
    __version__ = "0.0-fake"

    class cuda:
        streams = []

        @staticmethod
        def synchronize():
            pass

        @staticmethod
        def empty_cache():
            pass

        @classmethod
        def ExternalStream(cls, handle):
            cls.streams.append(handle)
            return handle

        @staticmethod
        def stream(handle):
            import contextlib

            return contextlib.nullcontext()

    @staticmethod
    def from_numpy(array):
        return array.view(FakeTensor)


def test_bench_times_a_kind_peer_on_the_same_stream(sim, bench_app, tmp_path, monkeypatch):
    import ptxgen.bench
    from ptxgen.kernels import KINDS

    made = []

    def torch_peer(self, torch, tensors, scalars):
        made.append(tensors)
        gate, up = tensors["gate"], tensors["up"]

        def peer():
            sim.clock_ms += 0.002
            return gate / (1 + np.exp(-gate)) * up

        return {"fake torch": peer}

    monkeypatch.setattr(KINDS["swiglu"], "torch_peer", torch_peer, raising=False)
    monkeypatch.setattr(ptxgen.bench, "load_torch", lambda: (FakeTorch, None))
    path = tmp_path / "bench.json"
    result = CliRunner().invoke(bench_app, ["bench", "swiglu", "--spec", str(SPEC), "--json", str(path)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(path.read_text())
    (row,) = report["rows"]
    (peer,) = row["peers"]
    assert peer["name"] == "fake torch" and peer["median_us"] == pytest.approx(2.0)
    assert peer["error"] < 1e-6, "the peer's result is compared with the float64 reference"
    assert peer["pct_copy_bw"] == pytest.approx(100 * row["bytes"] / 2e-6 / 1e9 / 3000)
    assert len(made) == row["sets"] > 1 and made[0]["gate"] is not made[1]["gate"], "each set has its own inputs"
    assert FakeTorch.cuda.streams[-1] == int(session().stream), "peers run on the session's stream"
    assert report["torch"] == "0.0-fake"
