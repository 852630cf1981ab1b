"""Kernels on a real GPU (`make test-gpu`; skipped, not failed, without a CUDA driver and GPU).

- every kernel of specs/qwen3.toml on the device against its float64 reference, and against
  the PTX interpreter on the same inputs;
- incremental_attention with `indirect_seq_len` captured once in a CUDA graph and replayed as
  the length on the device grows (KERNELS.md: the reason that variant exists);
- the device runtime itself: faults become LaunchError and the next run works, event timing,
  copy bandwidth, and `ptxgen bench` end to end.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from ptxgen import device
from ptxgen.abi import Geometry, Launch, Param
from ptxgen.bench import REFERENCE_FLOPS, DeviceStep
from ptxgen.compiled import CompiledKernel, Variant
from ptxgen.dtypes import to_float64
from ptxgen.errors import DeviceUnavailable, LaunchError
from ptxgen.pipeline import compile_spec, compiler
from ptxgen.runner import prepare_arrays, run
from ptxgen.spec import load_spec
from ptxgen.verify import relative_l2, verify_kernel

from helpers import ROOT, run_cli

pytestmark = pytest.mark.gpu

try:
    device.driver()
except DeviceUnavailable:
    pytest.skip("no CUDA driver/GPU on this machine", allow_module_level=True)

SPEC = ROOT / "specs" / "qwen3.toml"
LOADED = load_spec(SPEC)
COMPILED = {kernel.name: kernel for kernel in compile_spec(LOADED.spec).kernels}
NAMES = list(COMPILED)


def describe_failures(checks) -> str:
    return "; ".join(f"{c.param} at {c.scalars}: {c.failure}" for c in checks if not c.passed)


@pytest.mark.parametrize("name", NAMES)
def test_kernel_on_the_device_matches_its_reference(name):
    kernel = COMPILED[name]
    kind = kernel.definition
    sizes = list(kind.verify_scalars())
    if kind.traffic(kind.example_scalars()).flops <= REFERENCE_FLOPS and kind.example_scalars() not in sizes:
        sizes.append(kind.example_scalars())  # the size bench times, when the reference is affordable
    checks = [check for scalars in sizes for check in verify_kernel(kernel, scalars, seed=5, backend="device")]
    assert checks, f"{name}: nothing was compared"
    assert all(check.passed for check in checks), f"{name} on {device.session().name}: {describe_failures(checks)}"


@pytest.mark.parametrize("name", NAMES)
def test_the_models_occupancy_is_the_drivers(name):
    """`ptxgen show`'s resident CTAs an SM (perf.occupancy over the assembler's registers and the
    cubin's shared section) are what the driver's occupancy calculator says for the same launch."""
    from ptxgen.bench import occupancy_row

    kernel = COMPILED[name]
    row = occupancy_row(device.session(), kernel, kernel.definition.example_scalars())
    assert row["registers"] == row["model_registers"], row
    assert row["ctas_per_sm"] == row["model_ctas_per_sm"], row


@pytest.mark.parametrize("name", NAMES)
def test_kernel_on_the_device_matches_the_interpreter(name):
    kernel = COMPILED[name]
    kind = kernel.definition
    for scalars in kind.verify_scalars():
        inputs = kind.sample_inputs(np.random.default_rng(11), scalars)
        on_device = run(kernel, inputs, scalars, backend="device")
        emulated = run(kernel, inputs, scalars, backend="emulator", sanitize=False)
        for param in kind.params():
            if not param.written:
                continue
            gpu = to_float64(on_device[param.name], param.dtype)
            cpu = to_float64(emulated[param.name], param.dtype)
            assert np.array_equal(np.isfinite(gpu), np.isfinite(cpu)), \
                f"{name} {param.name} at {scalars}: the device and the interpreter wrote different elements"
            finite = np.isfinite(cpu)
            error = relative_l2(gpu[finite], cpu[finite])
            assert error <= kind.tolerance(param), \
                f"{name} {param.name} at {scalars}: device vs interpreter relative L2 {error:.3e}"


STEP_KERNELS = [name for name, kernel in COMPILED.items()
                if kernel.definition.separate_step(kernel.definition.example_scalars()) is not None]


@pytest.mark.parametrize("name", STEP_KERNELS)
def test_fused_kernel_on_the_device_matches_its_separate_kernels(name):
    """The persistent decoder (cooperative launch, grid barriers on real hardware) against the
    same step as separate kernels on the device, from the same state, at every verify size."""
    kernel = COMPILED[name]
    kind = kernel.definition
    for scalars in kind.verify_scalars():
        inputs = kind.sample_inputs(np.random.default_rng(13), scalars)
        step = DeviceStep(device.session(), kernel, prepare_arrays(kernel, inputs, scalars), scalars,
                          compiler(LOADED.spec.target.archs))
        try:
            check = step.check()
        finally:
            step.free()
        assert check.passed, (f"{name} at {scalars}: relative L2 {check.error:.3e} > {check.tolerance:.0e} from its "
                              f"separate kernels, {check.unwritten} elements not finite")


def test_decode_attention_graph_is_captured_once_and_replayed_as_the_cache_grows():
    kernel = COMPILED["qwen3_8b_decode_attention_graph"]
    kind = kernel.definition
    longest = kind.config.max_seq_len
    inputs = kind.sample_inputs(np.random.default_rng(2), {"seq_len": longest})  # every cache row holds a key
    arrays = prepare_arrays(kernel, inputs, {"seq_len": longest})
    gpu = device.session()
    loaded = gpu.kernel(kernel)
    buffers = {name: gpu.alloc(array.nbytes) for name, array in arrays.items()}
    try:
        for name, array in arrays.items():
            gpu.upload(buffers[name], array)
        args = kernel.args(buffers, {})  # the length is an array: no scalar arguments
        launch = kernel.launch({"seq_len": longest})
        assert kernel.launch({"seq_len": 1}) == launch, "the grid must not depend on the length on the device"
        graph = gpu.capture(lambda: gpu.launch(loaded, launch, args))
        out = kind.param("out")
        try:
            for length in sorted({1, 2, 63, 64, 65, 1000, 4097, min(longest, 16384), longest, longest + 7}):
                arrays["seq_len_ptr"][0] = length  # past max_seq_len the kernel clamps
                gpu.upload(buffers["seq_len_ptr"], arrays["seq_len_ptr"])
                arrays["out"][...] = np.nan
                gpu.upload(buffers["out"], arrays["out"])
                gpu.replay(graph)
                gpu.download(arrays["out"], buffers["out"])
                expected = kind.reference(arrays, {"seq_len": min(length, longest)})["out"]
                result = to_float64(arrays["out"], out.dtype)
                assert np.isfinite(result).all(), f"graph replay at seq_len {length} left outputs unwritten"
                error = relative_l2(result, expected)
                assert error <= kind.tolerance(out), f"graph replay at seq_len {length}: relative L2 {error:.3e}"
        finally:
            gpu.destroy(graph)
    finally:
        for buffer in buffers.values():
            gpu.free(buffer)


CRASH_PTX = """\
.version 7.0
.target sm_80
.address_size 64
.visible .entry crash(
\t.param .u64 where
)
{
\t.reg .u64 %where;
\t.reg .u32 %one;
\tld.param.u64 %where, [where];
\tmov.u32 %one, 1;
\tst.global.u32 [%where], %one;
\tret;
}
"""


CRASH = CompiledKernel("crash", "test", {}, (Param("where", "u32", (1,)),), {},
                       {"sm_80": Variant("sm_80", CRASH_PTX, "7.0", Geometry((1, 1, 1), (1, 1, 1)))}, {})


def test_a_faulting_kernel_is_a_launch_error_and_the_next_run_works():
    """A fault is sticky for the process that made it (measured on an H100): it happens in a device
    worker, which names it and is replaced; the next kernel runs in a fresh one, and this
    process's own CUDA is untouched."""
    from ptxgen.worker import DeviceWorker

    kernel = COMPILED[NAMES[0]]
    scalars = kernel.definition.verify_scalars()[-1]
    with DeviceWorker() as worker:
        with pytest.raises(LaunchError, match="running crash failed .*(CUDA_ERROR_ILLEGAL_ADDRESS|CUDA_ERROR_LAUNCH_FAILED)"):
            worker.call(device.run_on_device, CRASH, Launch((1, 1, 1), (1, 1, 1)), [0])
        checks = worker.call(verify_kernel, kernel, scalars, backend="device")
        assert checks and all(check.passed for check in checks), describe_failures(checks)
    checks = verify_kernel(kernel, scalars, backend="device")
    assert checks and all(check.passed for check in checks), describe_failures(checks)


def test_verify_on_the_device_runs_in_a_worker_and_under_compute_sanitizer():
    result = run_cli("verify", str(SPEC), "--backend", "device", "--kernel", "qwen3_8b_rmsnorm")
    assert result.returncode == 0, result.stdout + result.stderr
    import shutil

    if shutil.which("compute-sanitizer") is None:
        pytest.skip("compute-sanitizer is not on PATH")
    result = run_cli("verify", str(SPEC), "--backend", "device", "--kernel", "qwen3_8b_rmsnorm", "--sanitize",
                     "memcheck,racecheck")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if line.startswith("qwen3_8b_rmsnorm")]
    assert [row[1:] for row in rows if row[1] in ("memcheck", "racecheck")] == [["memcheck", "0", "none"],
                                                                                ["racecheck", "0", "none"]]


def test_the_driver_assembler_is_keyed_by_the_drivers_release():
    """On this GPU's driver: the loaded libcuda's release (580.95.05), or where its file name has
    none a digest of it, not cuDriverGetVersion's major.minor alone (13.0)."""
    import re

    from ptxgen.assemble import assembler_version

    version = assembler_version("driver")
    assert re.fullmatch(r"[0-9]{3,}\.[0-9]+(\.[0-9]+)?|[0-9]+\.[0-9]+\+sha256\.[0-9a-f]{16}", version), version


def test_event_timing_and_copy_bandwidth_are_plausible():
    gpu = device.session()
    timing = gpu.time(lambda i: gpu.delay(20e-6), iters=100, warmup=5)
    median = float(np.median(timing.times))
    assert 18 <= median <= 40 and not timing.host_bound, f"a 20 µs spin measured {median:.2f} µs ({timing})"
    batched = gpu.time(lambda i: gpu.delay(20e-6), iters=100, warmup=5, calls_per_event=10)
    per_call = float(np.median(batched.times))
    assert len(batched.times) == 10 and 18 <= per_call <= median * 1.05, f"batched: {per_call:.2f} µs a spin"
    nbytes, seconds = gpu.copy_bandwidth()
    gbs = 2 * nbytes / seconds / 1e9
    assert 100 < gbs < 20000, f"device-to-device copy at {gbs:.0f} GB/s"


def test_timing_fits_the_launch_queue_and_marks_what_cannot_host_bound():
    """600 launches a call are timed one call a chunk behind a spin (GPU time); a call of twice the
    launch queue's depth blocks the host on the full queue, and is marked host-bound."""
    gpu = device.session()
    spin = gpu.launcher(gpu.kernel(device.DELAY), Launch((1, 1, 1), (1, 1, 1)), [1000])  # 1 µs each

    def launches(count):
        return lambda i: [spin() for _ in range(count)]

    fits = gpu.time(launches(600), iters=5, warmup=2)
    assert fits.calls_per_chunk == 1 and not fits.host_bound, fits
    overflows = gpu.time(launches(2 * device.QUEUE_DEPTH), iters=3, warmup=1)
    assert overflows.host_bound, overflows


def test_bench_end_to_end(tmp_path):
    path = tmp_path / "bench.json"
    result = run_cli("bench", NAMES[0], "--spec", str(SPEC), "--graph", "--json", str(path))
    assert result.returncode == 0, result.stderr
    report = json.loads(path.read_text())
    assert report["copy_bandwidth"]["gbs"] > 100
    (row,) = report["rows"]
    assert row["passed"] and row["checks"]
    assert 0 < row["p10_us"] <= row["median_us"] <= row["p90_us"]
    assert row["gbs"] > 0 and row["pct_copy_bw"] > 0 and row["graph"]["median_us"] > 0
    assert row["sets"] >= 2 and row["calls_per_chunk"] >= 1 and row["failure"] is None


# --- the Python API on torch tensors ---------------------------------------------------------------
def torch_or_skip():
    try:
        import torch as module
    except ImportError:
        pytest.skip("torch is not installed")
    if not module.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    return module


def test_api_launches_on_torch_tensors_on_the_callers_stream():
    import ptxgen

    tt = torch_or_skip()
    kernels = ptxgen.load(SPEC)
    norm = kernels.qwen3_8b_rmsnorm
    kind = norm.compiled.definition
    inputs = kind.sample_inputs(np.random.default_rng(3), {"rows": 5})
    x, gamma = (tt.from_numpy(inputs[name]).cuda() for name in ("x", "gamma"))
    y = tt.full((5, 4096), float("nan"), device="cuda")
    stream = tt.cuda.Stream()
    with tt.cuda.stream(stream):
        norm(x, gamma, y, rows=5)  # the current (torch) stream
    norm(x, gamma, y, rows=5, stream=stream)  # an explicit one
    stream.synchronize()
    error = relative_l2(y.double().cpu().numpy(), kind.reference(inputs, {"rows": 5})["y"])
    assert error <= kind.tolerance(kind.param("y")), f"rmsnorm through the API on torch tensors: {error:.3e}"
    with pytest.raises(LaunchError, match=r"x: expected shape \[4, 4096\]"):
        norm(x, gamma, y, rows=4)
    with pytest.raises(LaunchError, match="x: expected dtype f32 .* got f16"):
        norm(x.half(), gamma, y, rows=5)
    with pytest.raises(LaunchError, match="y: expected a contiguous"):
        norm(x, gamma, tt.empty((4096, 5), device="cuda").t(), rows=5)
    with pytest.raises(LaunchError, match="all be on the GPU or all on the host"):
        norm(x, gamma.cpu(), y, rows=5)
    with pytest.raises(LaunchError, match="y shares memory with x"):
        norm(x, gamma, x, rows=5)
    with pytest.raises(LaunchError, match="y: starts at an address that is not a multiple of 16 bytes"):
        norm(x, gamma, tt.empty(5 * 4096 + 1, device="cuda")[1:].view(5, 4096), rows=5)


def test_api_calls_are_captured_in_a_cuda_graph_and_replayed():
    """A graph of decode attention (indirect length, workspaces) and a GEMV, captured with
    torch.cuda.graph and replayed as the length on the device grows: nothing allocates or
    synchronises inside the capture."""
    import ptxgen

    tt = torch_or_skip()
    kernels = ptxgen.load(SPEC)
    attention, gemv = kernels.qwen3_8b_decode_attention_graph, kernels.qwen3_8b_q_proj
    kind = attention.compiled.definition
    longest = 3000
    inputs = kind.sample_inputs(np.random.default_rng(5), {"seq_len": longest})
    tensors = {name: tt.from_numpy(array.view(np.int32) if array.dtype == np.uint32 else array).cuda()
               for name, array in inputs.items()}
    out = tt.empty((32, 128), device="cuda")
    g_inputs = gemv.compiled.definition.sample_inputs(np.random.default_rng(6), {})
    w, x = (tt.from_numpy(g_inputs[name]).cuda() for name in ("w", "x"))
    y = tt.empty(gemv.compiled.param("y").shape, device="cuda")
    kernels.prepare()  # load every kernel and its workspaces before capturing
    stream = tt.cuda.Stream()
    graph = tt.cuda.CUDAGraph()
    with tt.cuda.graph(graph, stream=stream):
        attention(tensors["q"], tensors["k_cache"], tensors["v_cache"], out, tensors["seq_len_ptr"])
        gemv(y, w, x)
    for length in (1, 77, 1024, longest):
        tensors["seq_len_ptr"].fill_(length)
        out.fill_(float("nan"))
        graph.replay()
        tt.cuda.synchronize()
        expected = kind.reference({**inputs, "seq_len_ptr": np.array([length], np.uint32)}, {"seq_len": length})
        error = relative_l2(out.double().cpu().numpy(), expected["out"])
        assert error <= kind.tolerance(kind.param("out")), f"replay at seq_len {length}: {error:.3e}"
    reference = gemv.compiled.definition.reference(g_inputs, {})["y"]
    assert relative_l2(y.double().cpu().numpy(), reference) <= gemv.compiled.definition.tolerance(
        gemv.compiled.param("y"))


def test_api_loads_an_artifact_folder_and_runs_its_cubins(tmp_path):
    import ptxgen

    tt = torch_or_skip()
    out = tmp_path / "artifacts"
    assert run_cli("build", str(SPEC), "-o", str(out), "-q").returncode == 0
    kernels = ptxgen.load(out)
    swiglu = kernels.qwen3_8b_swiglu
    n = swiglu.compiled.param("out").shape[0]
    gate, up = tt.randn(n, device="cuda"), tt.randn(n, device="cuda")
    result = tt.empty(n, device="cuda")
    swiglu(gate, up, result)
    tt.cuda.synchronize()
    expected = (gate * tt.sigmoid(gate) * up).double()
    assert relative_l2(result.double().cpu().numpy(), expected.cpu().numpy()) < 1e-6


@pytest.mark.parametrize("name, scalars", [("qwen3_8b_q_proj", {}), ("qwen3_8b_attn_norm_q_proj", {}),
                                           ("qwen3_8b_decode_attention", {"seq_len": 1024})])
def test_the_peers_compute_the_kernels_result(name, scalars):
    """Each peer bench times (torch's int4 GEMV, cuBLAS bf16, SDPA backends, FlashInfer where
    installed) computes the kernel's result: within three bf16/f16 roundings (inputs, weights or
    scales, output: each 2^-8 relative at most) of the float64 reference."""
    from ptxgen.bench import to_torch
    from ptxgen.peers import Skipped

    tt = torch_or_skip()
    kind = COMPILED[name].definition
    inputs = kind.sample_inputs(np.random.default_rng(9), scalars)
    tensors = {p.name: to_torch(tt, inputs[p.name], p.dtype) for p in kind.params() if p.read}
    written = next(p for p in kind.params() if p.written)
    expected = kind.reference(inputs, scalars)[written.name]
    peers = kind.torch_peer(tt, tensors, scalars)
    timed = {label: call for label, call in peers.items() if not isinstance(call, Skipped)}
    assert timed, f"{name}: no peer runs here: {peers}"
    for label, call in timed.items():
        result = call().double().cpu().numpy().reshape(expected.shape)
        error = relative_l2(result, expected)
        assert error <= 3 * 2.0**-8, f"{name}: peer {label} is {error:.2e} from the reference"
