"""The device runtime and `ptxgen bench` on a machine without a GPU (skipped where there is one).

1. Without a driver, every way onto the device ends in exit 2 and the one clear message.
2. The device runtime's own logic (copies in and back in place, argument packing checked
   against the PTX, shared-memory opt-in, cooperative launches, graph capture and replay,
   event timing in chunks below the launch queue's depth, error mapping, bench's rotation and
   JSON) against the simulated GPU of tests/simulated_gpu.py, in this process.
3. The device worker (ptxgen.worker) with the same simulated GPU in the child: a sticky fault
   names the kernel and the next kernel runs in a fresh child; `verify --sanitize` against a
   fake compute-sanitizer.
This proves the plumbing, not the GPU: tests/test_gpu.py does that.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import sys

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

from ptxgen import device
from ptxgen.device import NO_DEVICE
from ptxgen.dtypes import to_float64
from ptxgen.errors import DeviceUnavailable, LaunchError, PtxgenError
from ptxgen.abi import Launch
from ptxgen.pipeline import compile_kernel
from ptxgen.runner import prepare_arrays, run
from ptxgen.spec import load_spec
from ptxgen.verify import relative_l2

from helpers import ROOT, TUNE_SPEC, make_config, run_cli, run_cli_in_process

try:
    device.driver()
    pytest.skip("a CUDA driver and GPU are present: tests/test_gpu.py covers the device", allow_module_level=True)
except DeviceUnavailable:
    pass

from cuda.bindings import driver as real  # noqa: E402  (after the skip: importing needs no driver)
from simulated_gpu import SimulatedDriver  # noqa: E402

SPEC = ROOT / "specs" / "qwen3.toml"


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
    assert NO_DEVICE in one_line(result.stderr) and "ptxgen show gives the performance model" in result.stderr
    assert "--backend" not in result.stderr, "bench has no --backend to suggest"
    assert "Traceback" not in result.stderr + result.stdout


def test_bench_names_a_bad_spec_or_set_before_the_missing_gpu(tmp_path):
    missing = run_cli("bench", "--spec", str(tmp_path / "absent.toml"))
    assert missing.returncode == 2 and "absent.toml" in missing.stderr and NO_DEVICE not in missing.stderr
    twice = run_cli("bench", "--set", "seq_len=1", "--set", "seq_len=2")
    assert twice.returncode == 2 and "--set seq_len: given twice" in twice.stderr, twice.stderr
    for option, name, message in (("--json", "figures.txt", "expected a .json file name"),
                                  ("--json", "absent/figures.json", "does not exist"),
                                  ("--plot", "chart.json", "expected a .png file name")):
        result = run_cli("bench", option, str(tmp_path / name))  # before minutes of timing, not after
        assert result.returncode == 2 and f"{option} {tmp_path / name}: " in result.stderr, result.stderr
        assert message in result.stderr and NO_DEVICE not in result.stderr, result.stderr


def test_verify_on_the_device_without_a_gpu_exits_2():
    result = run_cli("verify", str(SPEC), "--backend", "device", "--kernel", "qwen3_8b_rmsnorm")
    assert result.returncode == 2, f"exit {result.returncode}\nstderr: {result.stderr}"
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


def test_make_bench_script_without_a_gpu_exits_2(tmp_path):
    import subprocess

    def run_all(*args):
        return subprocess.run([sys.executable, str(ROOT / "bench" / "run_all.py"), *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)

    result = run_all()
    assert result.returncode == 2, result.stderr
    assert NO_DEVICE in one_line(result.stderr)
    assert "Traceback" not in result.stderr
    # the script has no --backend (the driver's default advice for `run` and `verify`)
    assert "--backend" not in result.stderr and "make bench times kernels on a GPU" in result.stderr, result.stderr
    missing = run_all("--out", str(tmp_path / "missing"))  # named before the missing GPU, nothing made
    assert missing.returncode == 2 and missing.stderr.strip() == f"error: --out: {tmp_path / 'missing'} is not a folder"
    assert not (tmp_path / "missing").exists()


# --- 2. the runtime against a simulated driver -------------------------------------------------------
@pytest.fixture
def sim(monkeypatch):
    """A simulated GPU behind ptxgen.device in this process; every spec kernel (and test kernels)
    can run on it."""
    simulated = SimulatedDriver.for_spec(SPEC)
    monkeypatch.setattr(device, "driver", lambda instead="": simulated)
    monkeypatch.setattr(device, "tensor_map_encoder", lambda: simulated.encode_tensor_map)
    monkeypatch.setattr(device, "host_clock", lambda: simulated.host_now)
    monkeypatch.setattr(device, "_SESSIONS", {})
    monkeypatch.setattr(device, "lost_context", None)
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
    # specs/qwen3.toml's decode kernels take pdl: their sm_90 cubin goes through cuLaunchKernelEx.
    launches = [args for call, args in sim.calls if call == "cuLaunchKernelEx"]
    assert len(launches) == 1 and "cuLaunchKernel" not in sim.names()
    launch, config = kind.launch(scalars), launches[0][0]
    assert (config.gridDimX, config.gridDimY, config.gridDimZ, config.blockDimX, config.blockDimY,
            config.blockDimZ) == (*launch.grid, *launch.block)
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


def test_launches_back_to_back_are_queued_behind_a_spin_and_run_in_order(sim):
    """runner.run(..., launches=3) on a device: the launches (of a PDL kernel: cuLaunchKernelEx)
    queued behind one spin kernel, so they run back to back as an engine's would, then one
    synchronisation; the arrays as after one launch (the kernel recomputes the same y)."""
    kernel = spec_kernel("qwen3_8b_attn_norm_q_proj")
    inputs = kernel.definition.sample_inputs(np.random.default_rng(0), {})
    once = run(kernel, inputs, {}, backend="device")
    sim.calls.clear()
    thrice = run(kernel, inputs, {}, backend="device", launches=3)
    names = [name for name in sim.names() if name.startswith("cuLaunch")]
    assert names == ["cuLaunchKernel"] + ["cuLaunchKernelEx"] * 3, names
    assert sim.pdl_launches[kernel.name] >= 3
    np.testing.assert_array_equal(thrice["y"], once["y"])


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


def test_a_kernel_fault_is_sticky_in_process(sim):
    """As on an H100: after a fault this process gets no CUDA back (the device worker's reason)."""
    kernel = spec_kernel("qwen3_8b_rmsnorm")
    inputs = kernel.definition.sample_inputs(np.random.default_rng(0), {"rows": 2})
    sim.faulty.add(kernel.name)
    with pytest.raises(LaunchError) as caught:
        run(kernel, inputs, {"rows": 2}, backend="device")
    message = str(caught.value)
    assert f"running {kernel.name}" in message and "CUDA_ERROR_ILLEGAL_ADDRESS" in message
    assert "--backend emulator" in message and "new process" in message
    sim.faulty.clear()
    with pytest.raises(LaunchError, match=r"an earlier kernel fault \(CUDA_ERROR_ILLEGAL_ADDRESS\) lost this process"):
        run(kernel, inputs, {"rows": 2}, backend="device")
    device._SESSIONS.clear()
    with pytest.raises(PtxgenError, match="CUDA_ERROR_ILLEGAL_ADDRESS"):
        device.DeviceSession()  # the simulated driver refuses a new context too


def test_failed_cuda_calls_name_the_error(sim):
    kernel = spec_kernel("qwen3_8b_rmsnorm")
    kind = kernel.definition
    inputs = kind.sample_inputs(np.random.default_rng(0), {"rows": 1})
    sim.fail["cuMemAlloc"] = real.CUresult.CUDA_ERROR_OUT_OF_MEMORY
    with pytest.raises(PtxgenError, match="allocating 16,384 bytes of device memory failed on Simulated GPU: "
                                          "CUDA_ERROR_OUT_OF_MEMORY"):
        run(kernel, inputs, {"rows": 1}, backend="device")
    sim.fail["cuLaunchKernelEx"] = real.CUresult.CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
    with pytest.raises(LaunchError, match="launching qwen3_8b_rmsnorm .*programmatic dependent launch.*"
                                          "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"):
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


def test_a_pdl_kernels_own_cubin_is_launched_for_programmatic_dependent_launch(sim):
    """Its sm_90 cubin (made from the PTX that waits for the previous kernel itself) goes through
    cuLaunchKernelEx with programmatic stream serialization; its portable PTX, JIT-compiled where
    no sm_90 cubin was built, and a kernel without pdl go through cuLaunchKernel."""
    config = make_config("q4k_gemv", name="pdl_gemv", n=300, k=2304, pdl=True)
    sim.kernels[config.name] = config
    inputs = compile_kernel(config, ("sm_90",), until="ptx").definition.sample_inputs(np.random.default_rng(2), {})
    for archs, launched in ((("sm_80", "sm_90"), "cuLaunchKernelEx"), (("sm_80",), "cuLaunchKernel")):
        kernel = compile_kernel(config, archs)
        sim.calls.clear()
        sim.pdl_launches.clear()
        arrays = run(kernel, inputs, {}, backend="device")
        assert [name for name in sim.names() if name.startswith("cuLaunch")] == [launched], archs
        assert sim.pdl_launches == ({"pdl_gemv": 1} if launched == "cuLaunchKernelEx" else {})
        reference = kernel.definition.reference(inputs, {})["y"]
        assert relative_l2(arrays["y"].astype(np.float64), reference) < 1e-6


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
    timing = gpu.time(lambda i: gpu.copy(destination, source), iters=100, warmup=5)
    # The host spends 2 us a call (the copy and its event), the GPU 44 ns: only the spin kernel queued
    # ahead of the chunk keeps the host's time out of the figures.
    assert timing.times == pytest.approx([2 * (1 << 16) / 3e12 * 1e6] * 100) and not timing.host_bound
    assert timing.calls_per_chunk == 100
    names = sim.names()
    first_record = names.index("cuEventRecord")
    assert "cuLaunchKernel" in names[:first_record], "the spin kernel is queued before the first event"
    nbytes, seconds = gpu.copy_bandwidth(nbytes=1 << 20)
    assert 2 * nbytes / seconds == pytest.approx(3e12, rel=1e-6)


@pytest.mark.parametrize("launches, host_bound", [(30, False), (60, True)])
def test_timing_keeps_each_chunk_below_the_launch_queue_depth(sim, monkeypatch, launches, host_bound):
    """A call of many launches (a decode step as separate kernels) goes one call a chunk when it
    fills most of the queue, and measures the GPU; one that alone overflows the queue blocks the
    host, and a host slower than the GPU then starves it: those figures are marked host-bound."""
    sim.queue_depth = 40
    sim.HOST_SECONDS = 20e-6  # a launch costs the host more than the GPU's 4 us kernel
    monkeypatch.setattr(device, "CHUNK_OPERATIONS", 30)
    kernel = spec_kernel("qwen3_8b_residual_add")
    gpu = device.session()
    buffers = {p.name: gpu.alloc(p.nbytes({})) for p in kernel.params if p.is_array}
    queue = gpu.launcher(gpu.kernel(kernel), kernel.launch({}), kernel.args(buffers, {}))

    def step(i):
        for _ in range(launches):
            queue()

    timing = gpu.time(step, iters=5, warmup=2)
    gpu_us = launches * SimulatedDriver.KERNEL_SECONDS * 1e6
    assert timing.calls_per_chunk == 1 and timing.host_bound == host_bound
    if host_bound:
        assert min(timing.times) > gpu_us * 1.5, "the GPU waited for the host"
    else:
        assert timing.times == pytest.approx([gpu_us] * 5)


@pytest.mark.parametrize("iters, groups", [(100, [10] * 10), (25, [10, 10, 5])])
def test_batched_timing_keeps_the_events_out_of_the_figures(sim, iters, groups):
    """With an event after every call each figure carries an event's cost; batched, a group of
    calls goes between two events and its figure is the group's mean, the last group shorter where
    iters is not a multiple."""
    sim.EVENT_SECONDS = 1e-6
    kernel = spec_kernel("qwen3_8b_residual_add")
    gpu = device.session()
    buffers = {p.name: gpu.alloc(p.nbytes({})) for p in kernel.params if p.is_array}
    queue = gpu.launcher(gpu.kernel(kernel), kernel.launch({}), kernel.args(buffers, {}))
    alone = gpu.time(lambda i: queue(), iters=iters, warmup=2)
    assert alone.times == pytest.approx([4 + 1] * iters) and alone.calls_per_event == 1
    records = sim.names().count("cuEventRecord")
    batch = gpu.time(lambda i: queue(), iters=iters, warmup=2, calls_per_event=10)
    assert batch.times == pytest.approx([4 + 1 / size for size in groups]) and batch.calls_per_event == 10
    assert sim.names().count("cuEventRecord") - records == len(groups) + 1
    assert batch.calls_per_chunk == iters and not batch.host_bound


@pytest.fixture
def bench_app():
    from ptxgen.cli import app

    return app


def test_bench_checks_then_times_with_rotated_buffers_and_writes_json(sim, worker_gpu, bench_app, tmp_path):
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
        assert not row["host_bound"] and row["calls_per_chunk"] == 100
        assert row["gbs"] == pytest.approx(row["bytes"] / 4e-6 / 1e9)
        assert row["pct_copy_bw"] == pytest.approx(100 * row["gbs"] / 3000)
        assert row["graph"]["median_us"] == pytest.approx(4.0, rel=1e-6)
        assert row["batch"]["median_us"] == pytest.approx(4.0, rel=1e-6) and row["batch"]["calls_per_event"] == 10
        assert row["sets"] * row["set_bytes"] >= 3 * SimulatedDriver.L2_BYTES, "buffers rotate past L2"
    assert report["fits"] == [], "the simulated kernel takes 4 us at every size: no streaming line"
    assert "cuEventCreate" not in sim.names(), "the device work ran in the worker"


def test_a_bench_run_cut_short_keeps_the_rows_it_made(tmp_path):
    """--json is rewritten after every row (bench.run_bench's row_done): a run stopped during its
    second row (a step's time limit on a lent GPU) leaves the first, and `planned_rows` says the
    file is short of the plan; each row says what it cost the run (`wall_s`, to size a lease's steps)."""
    import time

    from ptxgen import bench

    kernel = spec_kernel("qwen3_8b_rmsnorm")
    measured = {"device": {"name": "fake"}, "torch": None, "copy_bandwidth": {"gbs": 3000.0}}

    class Worker:
        rows = 0

        def call(self, function, *args):
            if function is bench.measure_device:
                return measured
            self.rows += 1
            if self.rows == 2:
                raise KeyboardInterrupt
            time.sleep(0.3)
            return {**bench.new_row(args[0], args[1]), "median_us": 4.0}, None

    path = tmp_path / "bench.json"
    with pytest.raises(KeyboardInterrupt):
        bench.run_bench({"file": "spec", "sha256": "0"}, [(kernel, {"rows": 1}), (kernel, {"rows": 4})],
                        worker=Worker(), row_done=lambda results: bench.write_json(path, results))
    written = json.loads(path.read_text())
    assert written["planned_rows"] == 2 and [row["scalars"] for row in written["rows"]] == [{"rows": 1}]
    assert 0.3 <= written["rows"][0]["wall_s"] < 5, written["rows"][0]


def test_bench_checks_and_times_the_tma_prefill_each_buffer_set_with_its_own_maps(sim, worker_gpu, bench_app,
                                                                                  tmp_path):
    """The lease's prefill_sm90a_tma on the simulated H100: it loads the sm_90a cubin, whose entry
    takes q, k and v's tensor maps after its parameters; every launch (checks, and timing over
    rotated buffer sets) passes maps encoded from that launch's own arrays, which the simulated
    driver checks against the addresses and shapes it launches with."""
    lease = ROOT / "bench" / "lease" / "prefill_sm90a.toml"
    log = worker_gpu(path=lease)
    path = tmp_path / "bench.json"
    result = CliRunner().invoke(bench_app, ["bench", "prefill_sm90a_tma", "--spec", str(lease), "--set",
                                            "seq_len=256", "--peers", "none", "--json", str(path)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    row = json.loads(path.read_text())["rows"][0]
    assert row["passed"] and row["checks"] and row["median_us"] == pytest.approx(4.0, rel=1e-6)
    assert row["sets"] > 1, "several buffer sets, each launched with its own maps"
    assert set(log.read_text().split()) == {"prefill_sm90a_tma"}


def test_bench_does_not_time_a_kernel_that_fails_its_check(sim, worker_gpu, bench_app, tmp_path):
    log = worker_gpu(wrong=("qwen3_8b_swiglu",))
    path = tmp_path / "bench.json"
    result = CliRunner().invoke(bench_app, ["bench", "swiglu", "--spec", str(SPEC), "--json", str(path)])
    assert result.exit_code == 1, result.output
    row = json.loads(path.read_text())["rows"][0]
    assert not row["passed"] and row["median_us"] is None
    assert log.read_text().split() == ["qwen3_8b_swiglu"] * len(row["checks"]), "launched for its checks only"


def test_bench_reports_a_faulting_kernel_and_goes_on(sim, worker_gpu, bench_app, tmp_path, small_spec):
    worker_gpu(faulty=("qwen3_8b_swiglu",))
    path = tmp_path / "bench.json"
    result = CliRunner().invoke(bench_app, ["bench", "--spec", str(small_spec), "--json", str(path)],
                                catch_exceptions=False)
    assert result.exit_code == 1, result.output
    rows = {row["kernel"]: row for row in json.loads(path.read_text())["rows"]}
    assert rows["qwen3_8b_swiglu"]["failure"].startswith("running qwen3_8b_swiglu failed on Simulated GPU: "
                                                         "CUDA_ERROR_ILLEGAL_ADDRESS"), rows["qwen3_8b_swiglu"]
    assert rows["qwen3_8b_swiglu"]["median_us"] is None
    assert rows["qwen3_8b_residual_add"]["passed"] and rows["qwen3_8b_residual_add"]["median_us"] > 0
    assert "FAIL qwen3_8b_swiglu (): running qwen3_8b_swiglu failed" in one_line(result.output)


class InProcess:
    """run_bench's worker, in this process (so the tests can look at the simulated driver's calls)."""

    @staticmethod
    def call(function, *args, **kwargs):
        return function(*args, **kwargs)


def quick_bench(sim, monkeypatch, rows, graph=False, peers="all") -> dict:
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
    return bench.run_bench({"file": str(SPEC), "sha256": "0"}, plan, iters=3, graph=graph, worker=InProcess(),
                           peers=peers)


def test_consecutive_rows_of_one_kernels_shapes_share_their_sample_inputs(sim, monkeypatch):
    """bench.row_inputs: a row of the same peer_key as the one before it (a spec's variants of one
    kernel) takes that row's sample inputs instead of making them again; another size makes its
    own. They are read-only, and every row still checks and times its kernel."""
    from ptxgen import bench

    kind = type(spec_kernel("qwen3_8b_rmsnorm").definition)
    made = []
    original = kind.sample_inputs

    def counted(self, rng, scalars):
        made.append(dict(scalars))
        return original(self, rng, scalars)

    monkeypatch.setattr(kind, "sample_inputs", counted)
    monkeypatch.setattr(bench, "_ROW_INPUTS", {})
    results = quick_bench(sim, monkeypatch, [("qwen3_8b_rmsnorm", {"rows": 7}), ("qwen3_8b_rmsnorm", {"rows": 7}),
                                             ("qwen3_8b_rmsnorm", {"rows": 9})])
    timed = [made_for for made_for in made if made_for["rows"] in (7, 9)]  # not the verify sizes' own
    assert timed == [{"rows": 7}, {"rows": 9}], made
    assert all(row["passed"] and row["median_us"] for row in results["rows"])
    (inputs,) = bench._ROW_INPUTS.values()
    assert not any(array.flags.writeable for array in inputs.values())


def bench_step_kernel(sim, monkeypatch, name, scalars, graph=False):
    """quick_bench of one fused spec kernel; its results and its separate kernels' Calls."""
    _, calls = spec_kernel(name).definition.separate_step(scalars)
    return quick_bench(sim, monkeypatch, [(name, scalars)], graph), calls


@pytest.fixture
def run_all(monkeypatch):
    """bench/run_all.py (`make bench`) as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("run_all", ROOT / "bench" / "run_all.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "run_all", module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_make_bench_report_has_the_targets_and_the_decode_step_in_tokens_per_second(sim, monkeypatch, run_all):
    results = quick_bench(sim, monkeypatch, [("qwen3_8b_rmsnorm", {"rows": 1}), ("qwen3_tiny_decoder", {"pos": 63})],
                          graph=True)
    results["whole_model"] = [{"model": "qwen3-8b", "tokens": 32, "layers": "separate kernels",
                               "weights": "Q4_K_M-like layers", "lm_head": "Q6_K", "tokens_per_s": 101.25,
                               "layers_tokens_per_s": 120.5, "pos": 4095, "step_us": 2250.04, "layers_us": 2100.0,
                               "head_us": 150.04, "host_bound": True}]
    report = run_all.markdown(results, ["a note"])
    lines = report.splitlines()
    # The simulation spends 4 us a kernel: 250000 calls/s in one launch, 26 launches one by one.
    assert "| one launch (persistent kernel) | 4.0 | 250000.0 |" in report, report
    assert "| one launch, CUDA-graph replay | 4.0 | 250000.0 |" in report
    assert any(line.startswith("| separate kernels, 26 launches one by one | 104.0 | 9615.4 |") for line in lines)
    assert any(line.startswith("| separate kernels, one CUDA graph | 104.0 | 9615.4 |") for line in lines)
    rmsnorm = next(line.split(" | ") for line in lines if line.startswith("| qwen3_8b_rmsnorm | rows=1 |"))
    batched = results["rows"][0]["batch"]
    assert batched["median_us"] == pytest.approx(4.0) and rmsnorm[6:8] == [f"4.00 ({batched['pct_copy_bw']:.1f}%)",
                                                                         "4.00"], rmsnorm
    assert "| rmsnorm <= 5 us (decode, one row) | 4.0 µs (rows=1) | yes | 4.0 µs (rows=1) | yes |" in report
    assert "| q4k_gemv 12288x4096 >= 80% of copy bandwidth | no matching row | n/a | no matching row | n/a |" in report
    assert ("| Qwen3-8B decode step (36 layers, pos 4095) <= 2000 us, >= 500 tokens/s | no matching row | n/a | "
            "no matching row | n/a |") in report
    assert ("| separate kernels | Q4_K_M-like layers, Q6_K lm_head | 2250.0* | 2100.0* | 150.0 | 101.2 | 120.5 |"
            in report), report
    assert "the step at pos 4095 between CUDA events" in report
    assert "- a note" in report


def test_make_bench_judges_each_fused_norm_gemv_against_the_plain_gemv_of_its_shape(run_all):
    """Issue 12: fused_rmsnorm_q4k_gemv within 5% of q4k_gemv at the same shape, per run and
    batched (the H100 baseline of 2026-11-23: 19.55 against 18.30 us at 12288x4096, 1.068x); the
    pair shares its config but the norm's eps (shapes, pdl, tuning), as a lease's variants differ."""
    def row(kernel, kind, n, us, batched_us=None, passed=True, pdl=True, warps=None):
        config = {"n": n, "k": 4096, "pdl": pdl, "warps": warps, **({"eps": 1e-6} if "fused" in kind else {})}
        return {"kernel": kernel, "kind": kind, "config": config, "scalars": {},
                "passed": passed, "median_us": us if passed else None,
                "batch": {"median_us": batched_us} if batched_us else None}

    rows = [row("ffn_norm_gate_up", "fused_rmsnorm_q4k_gemv", 12288, 19.552, 15.0),
            row("q_proj_warps8", "q4k_gemv", 4096, 7.7, warps=8),   # another tuning: not attn_norm_q's pair
            row("o_proj", "q4k_gemv", 4096, 9.6), row("q_proj", "q4k_gemv", 4096, 9.0),
            row("gate_up", "q4k_gemv", 12288, 18.304, 14.9),
            row("attn_norm_q", "fused_rmsnorm_q4k_gemv", 4096, 9.632),
            row("attn_norm_kv", "fused_rmsnorm_q4k_gemv", 1024, 6.9),   # no plain 1024-row GEMV: no line
            row("norm_no_pdl", "fused_rmsnorm_q4k_gemv", 12288, 19.0, pdl=False),   # nor one without PDL
            row("attn_norm_v", "fused_rmsnorm_q4k_gemv", 4096, 1.0, passed=False)]
    lines = run_all.fusion_lines(rows)
    assert lines == [
        "| fused_rmsnorm_q4k_gemv 12288x4096 within 5% of q4k_gemv (ffn_norm_gate_up against gate_up) | "
        "1.068x (19.55 against 18.30 µs) | no | 1.007x (15.00 against 14.90 µs) | yes |",
        "| fused_rmsnorm_q4k_gemv 4096x4096 within 5% of q4k_gemv (attn_norm_q against o_proj) | "
        "1.003x (9.63 against 9.60 µs) | yes | not timed | n/a |",
        "| fused_rmsnorm_q4k_gemv 4096x4096 within 5% of q4k_gemv (attn_norm_v against o_proj) | "
        "kernel failed its check | no | kernel failed its check | no |"]


def test_bench_records_the_drivers_occupancy_beside_the_models(sim, monkeypatch):
    """Each timed row says how many CTAs an SM the driver fits and what `ptxgen show`'s rule says,
    from the registers and static shared bytes of the assembler's report (the sm_90 cubin's section
    less the 1 KB reserve it holds, which the rule adds: the H200 of 2026-11-28 reported 16 static
    bytes where the section held 1040); a disagreement is a note."""
    from ptxgen import perf

    kernel = spec_kernel("qwen3_8b_rmsnorm")
    resources = kernel.binaries["sm_90"].resources
    launch = kernel.launch({"rows": 3}, "sm_90")
    static = resources["shared_bytes"] - 1024
    assert static >= 0, resources
    expected = perf.occupancy(perf.arch_limits("sm_90"), launch.threads_per_cta, resources["registers"],
                              static + launch.dynamic_shared)
    for driver in (expected.ctas_per_sm, expected.ctas_per_sm - 1):
        sim.resident_ctas = driver
        row = quick_bench(sim, monkeypatch, [("qwen3_8b_rmsnorm", {"rows": 3})])["rows"][0]
        ptx_target = kernel.variant("sm_90").target      # the sm_90 PDL variant where the spec has one
        assert row["occupancy"] == {"cubin_arch": "sm_90", "ptx_target": ptx_target,
                                    "assembler": kernel.assembler["sm_90"], "performance_losses": [],
                                    "ctas_per_sm": driver,
                                    "registers": sim.REGISTERS, "static_shared": 0,
                                    "dynamic_shared": launch.dynamic_shared, "model_ctas_per_sm": expected.ctas_per_sm,
                                    "model_limiter": expected.limiter, "model_registers": resources["registers"],
                                    "model_static_shared": static}, row["occupancy"]
        noted = [note for note in row["notes"] if "CTAs an SM" in note]
        assert noted == ([] if driver == expected.ctas_per_sm else
                         [f"qwen3_8b_rmsnorm: the driver fits {driver} CTAs an SM, the model (ptxgen show) "
                          f"{expected.ctas_per_sm}"]), row["notes"]
    # What the assembler reports it gave up is a note of the row too.
    monkeypatch.setattr("ptxgen.assemble.performance_losses", lambda log: ["(C7512) planted"])
    row = quick_bench(sim, monkeypatch, [("qwen3_8b_rmsnorm", {"rows": 3})])["rows"][0]
    assert f"qwen3_8b_rmsnorm: {kernel.assembler['sm_90']} reports (C7512) planted" in row["notes"], row["notes"]


def h100_loading(resources: dict):
    """A stand-in sm_90 GPU for occupancy_row: it loads a cubin of these resources and fits one CTA an SM."""
    from types import SimpleNamespace

    return SimpleNamespace(arch="sm_90", kernel=lambda compiled: SimpleNamespace(
        registers=resources["registers"], static_shared=resources["shared_bytes"]),
        prepare=lambda kernel, launch: launch, resident_ctas=lambda kernel, launch: 1)


def test_the_occupancy_row_names_the_cubin_an_sm90_gpu_runs():
    """A kernel built for sm_90 and sm_90a: an H100 loads the sm_90a cubin (binary_for), so the row
    says so and the model's CTAs an SM come from that cubin's registers and launch (one 288-thread
    CTA), not the mma.sync cubin's (two of 128 threads)."""
    from ptxgen.bench import occupancy_row

    kernel = compile_kernel(make_config("flash_attention", name="attn", num_heads=2, num_kv_heads=1, head_dim=128,
                                        block_m=128, warp_rows=32), ("sm_90", "sm_90a"))
    loaded = kernel.binaries["sm_90a"].resources
    row = occupancy_row(h100_loading(loaded), kernel, {"seq_len": 300})
    assert (row["cubin_arch"], row["ptx_target"], row["model_ctas_per_sm"]) == ("sm_90a", "sm_90a", 1), row
    assert row["model_registers"] == loaded["registers"] != kernel.binaries["sm_90"].resources["registers"]
    assert row["assembler"] == kernel.assembler["sm_90a"] and row["performance_losses"] == []


def test_the_occupancy_row_names_the_assembler_and_what_it_gave_up():
    """nvJitLink ignores the FA3-style prefill's setmaxnreg and then serialises its wgmmas: the row
    of a GPU that loads that cubin says which assembler built it and what ptxas reported."""
    from ptxgen.bench import occupancy_row
    from ptxgen.pipeline import BuildOptions

    kernel = compile_kernel(make_config("flash_attention", name="attn", num_heads=2, num_kv_heads=1, head_dim=128,
                                        sm90a={"producer_warps": 4}), ("sm_90a",),
                            options=BuildOptions(assembler="nvjitlink"))
    row = occupancy_row(h100_loading(kernel.binaries["sm_90a"].resources), kernel, {"seq_len": 300})
    assert row["assembler"].startswith("nvjitlink "), row
    assert [loss[:7] for loss in row["performance_losses"]] == ["(C7504)", "(C7512)"], row


def test_bench_checks_a_fused_kernel_against_its_separate_kernels_then_times_both(sim, monkeypatch, capsys):
    from ptxgen.bench import print_results

    results, calls = bench_step_kernel(sim, monkeypatch, "qwen3_tiny_decoder", {"pos": 63}, graph=True)
    row = results["rows"][0]
    step_check = [c for c in row["checks"] if c["param"] == "x vs the separate kernels"]
    assert len(step_check) == 1 and step_check[0]["passed"] and step_check[0]["error"] < 1e-6, row["checks"]
    step = row["step"]
    assert step["launches"] == len(calls) == 2 * 13
    assert step["kernels"] == 12, "the two residual adds share a kernel; 12 distinct kernels"
    assert not step["one_by_one"]["host_bound"] and step["one_by_one"]["calls_per_chunk"] >= 1
    # The simulation spends KERNEL_SECONDS (4 us) a kernel: one launch against 26.
    assert row["median_us"] == pytest.approx(4.0) and row["graph"]["median_us"] == pytest.approx(4.0)
    assert step["one_by_one"]["median_us"] == pytest.approx(26 * 4.0)
    assert step["graph"]["median_us"] == pytest.approx(26 * 4.0)
    assert all(step["wall_us"][way] > 0 for way in ("kernel", "one_by_one", "graph"))
    launched = {int(args[1] if name == "cuLaunchKernelEx" else args[0]) for name, args in sim.calls
                if name in ("cuLaunchKernel", "cuLaunchCooperativeKernel", "cuLaunchKernelEx")}
    assert len(launched) >= 13, "the decoder, its 12 separate kernels (and the timing spin kernel) ran"
    assert "cuLaunchCooperativeKernel" in sim.names()
    assert len(sim.pdl_launches) == 12, "every separate kernel is launched for programmatic dependent launch"
    print_results(results, Console(), Console(stderr=True))
    assert "26 (12 kernels)" in one_line(capsys.readouterr().out)


def test_with_peers_once_a_fused_kernels_separate_kernels_are_timed_once_and_every_row_checked(sim, monkeypatch):
    """--peers once: rows of one fused kernel's shapes and scalars (a lease's decoder variants) are
    each checked against the separate kernels, which only the first times; the others take its
    figures, with a note. Other scalars time their own."""
    from ptxgen import bench

    timed = []
    original = bench.DeviceStep.time

    def counted(self, *args):
        timed.append(dict(self.scalars))
        return original(self, *args)

    monkeypatch.setattr(bench.DeviceStep, "time", counted)
    rows = [("qwen3_tiny_decoder", {"pos": 63}), ("qwen3_tiny_decoder", {"pos": 63}), ("qwen3_tiny_decoder", {"pos": 9})]
    _, calls = spec_kernel("qwen3_tiny_decoder").definition.separate_step({"pos": 63})
    results = quick_bench(sim, monkeypatch, rows, peers="once")["rows"]
    assert timed == [{"pos": 63}, {"pos": 9}]
    for row in results:
        assert row["passed"] and [c["passed"] for c in row["checks"] if c["param"] == "x vs the separate kernels"] == [True]
        assert row["step"]["launches"] == len(calls)
    assert results[1]["step"] is results[0]["step"] and results[2]["step"] is not results[0]["step"]
    assert "separate kernels timed with qwen3_tiny_decoder" in results[1]["notes"][-1]


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


def test_bench_tune_checks_and_times_each_variant_and_prints_the_fastests_spec_entry(sim, worker_gpu, bench_app,
                                                                                    tmp_path):
    """Every buildable combination of the listed values is checked on the GPU and timed beside the
    spec's own config; refused ones are named with the kind's reason; the fastest (by the ranked
    figure) is printed as a spec entry that builds exactly its config, under the spec kernel's name."""
    from ptxgen import tune
    from ptxgen.specfile import tomllib

    path, report = tmp_path / "tune.toml", tmp_path / "tune.json"
    path.write_text(TUNE_SPEC)
    loaded = load_spec(path)
    args = ["unroll=1,2", "rows_per_warp=1,2", "split_k=1,2"]
    made, skipped = tune.variants(loaded, loaded.spec.kernel("small_gemv"), tune.parse_tune(args))
    assert len(made) == 5 and len(skipped) == 4
    assert all("split_k" in skip["reason"] for skip in skipped), "split_k=2 does not divide a 512-weight row"
    made = tune.compile_variants(loaded, made, skipped)
    names = [variant.config.name for variant in made]
    assert names == ["small_gemv_v0", "small_gemv_v3", "small_gemv_v7"] and made[0].changes == {}
    assert [skip["reason"] for skip in skipped[4:]] == ["the same kernel as small_gemv_v0 (PTX and launch)"] * 2, \
        "a 512-weight row is one step: unroll 2 renders unroll 1's kernel, and rows_per_warp 1 is the default"
    seconds = dict(zip(names, [5e-6, 3e-6, 4e-6]))  # the spec's own 5 us, v3 3 us
    log = worker_gpu(extra_kernels=[variant.config for variant in made], kernel_seconds=seconds)
    command = ["bench", "small_gemv", "--spec", str(path), "--json", str(report), "--rank", "batch"]
    result = CliRunner().invoke(bench_app, [*command, *(f"--tune={arg}" for arg in args)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    written = json.loads(report.read_text())
    assert [row["kernel"] for row in written["rows"]] == names and all(row["passed"] for row in written["rows"])
    assert set(log.read_text().split()) == set(names), "each variant ran (its checks, then its timing)"
    for row in written["rows"]:
        assert row["batch"]["median_us"] == pytest.approx(seconds[row["kernel"]] * 1e6, rel=1e-6)
    section = written["tune"]
    assert section["variants"] == {variant.config.name: variant.changes for variant in made}
    assert section["rank"] == "batch" and section["skipped"] == skipped
    (best,) = section["fastest"]
    assert best["kernel"] == names[1] and best["us"] == pytest.approx(3.0) and best["spec_us"] == pytest.approx(5.0)
    printed = one_line(result.output)
    assert f"fastest: {names[1]} ({tune.describe(made[1].changes)}), 3.00 µs, 1.67x the spec's config" in printed
    assert "skipped unroll=1 rows_per_warp=1 split_k=2: split_k: expected a divisor" in printed
    assert "skipped unroll=2 rows_per_warp=1 split_k=1: the same kernel as small_gemv_v0" in printed
    lines = result.output[result.output.index("[[kernels]]"):].splitlines()
    toml = "\n".join(lines[:1] + list(itertools.takewhile(lambda line: " = " in line, lines[1:]))) + "\n"
    entry = tomllib.loads(toml)["kernels"][0]
    assert entry == best["entry"] and entry["name"] == "small_gemv"
    rebuilt = load_spec_text(tmp_path, toml)
    assert rebuilt.model_dump() == made[1].config.model_copy(update={"name": "small_gemv"}).model_dump()


def load_spec_text(tmp_path, kernels: str):
    """The one kernel of a spec of TUNE_SPEC's target and `kernels`."""
    path = tmp_path / "rebuilt.toml"
    path.write_text('[target]\narchs = ["sm_90"]\n\n' + kernels)
    return load_spec(path).spec.kernels[0]


@pytest.mark.parametrize("args, message", [
    (["--tune", "bogus=1"], "--tune bogus: kernel 'small_gemv' (q4k_gemv) has no field 'bogus' (its fields: pdl, k,"),
    (["--tune", "eps=1e-5"], "--tune eps: kernel 'small_gemv' (q4k_gemv) has no field 'eps' (its fields: pdl,"),
    (["--tune", "kind=x"], "--tune kind: a kernel's kind is not a tuning field"),
    (["--tune", "unroll=2,2"], "--tune unroll: a value is listed twice"),
    (["--tune", "unroll"], "--tune: expected FIELD=VALUE[,VALUE...], got 'unroll'"),
    (["--tune", "split_k=2"], "--tune: no variant but the spec's own config can be built (split_k=2: split_k: "
                              "expected a divisor"),
    (["--tune", "unroll=none"], "--tune: every value listed is the spec's own: nothing to compare"),
    (["--rank", "batch"], "--rank: ranks the variants of --tune"),
    (["--tune", "unroll=2", "--rank", "graph"], "--rank graph: graph replays are timed only with --graph"),
    (["--tune", "unroll=2", "--tune", "unroll=1"], "--tune unroll: given twice"),
])
def test_bench_tune_refuses_bad_input_before_the_gpu(tmp_path, args, message):
    """Without a GPU too: the tuning's own errors come first, exit 2, one message."""
    path = tmp_path / "tune.toml"
    path.write_text(TUNE_SPEC)
    result = run_cli_in_process("bench", "small_gemv", "--spec", str(path), *args)
    assert result.returncode == 2 and message in one_line(result.stderr) and "Traceback" not in result.stderr


def test_bench_tune_needs_a_kernel_and_names_a_table_s_fields(tmp_path):
    result = run_cli_in_process("bench", "--spec", str(SPEC), "--tune", "eps=1e-5")
    assert result.returncode == 2 and "--tune: name the kernel to tune" in result.stderr
    for field in ("n=32,64", "k=64,128", "dtype=f16,bf16", "eps=1e-5,1e-6"):  # shapes, types, the math
        for command in ("bench", "show"):
            kernel = "qwen3_8b_rmsnorm" if field.startswith(("dtype", "eps")) else "qwen3_8b_q_proj"
            result = run_cli_in_process(command, kernel, "--spec", str(SPEC), "--tune", field)
            assert result.returncode == 2, (command, field, result)
            assert f"--tune {field.split('=')[0]}: changes what kernel {kernel!r} computes" in one_line(result.stderr)
    result = run_cli_in_process("bench", "flash_attention", "--spec", str(ROOT / "bench/lease/prefill_sm90a.toml"),
                                "--tune", "sm90a=1")
    assert result.returncode == 2
    assert "--tune sm90a: a table; name one of its fields (sm90a.block_n, sm90a.consumers," in one_line(result.stderr)


def test_tune_names_the_fastest_variant_at_each_runtime_scalar_set(tmp_path):
    """Per scalar set, among the variants that passed and were timed, the least of the ranked
    figure; the spec's config's figure beside it; a failed variant never wins."""
    from ptxgen import tune

    path = tmp_path / "tune.toml"
    path.write_text(TUNE_SPEC)
    loaded = load_spec(path)
    made, _ = tune.variants(loaded, loaded.spec.kernel("small_gemv"), tune.parse_tune(["rows_per_warp=1,2"]))
    names = [variant.config.name for variant in made]

    def row(name, keys, median, batch, passed=True):
        return {"kernel": name, "scalars": {"keys": keys}, "passed": passed, "median_us": median,
                "batch": {"median_us": batch}}

    results = {"rows": [row(names[0], 1, 5.0, 4.0), row(names[1], 1, 4.0, 4.5), row(names[2], 1, 1.0, 1.0, False),
                        row(names[0], 2, 9.0, 8.0), row(names[1], 2, 9.5, 7.0)]}
    by_median = tune.fastest(results, "small_gemv", made, "median")
    assert [(f["scalars"], f["kernel"], f["us"], f["spec_us"]) for f in by_median] == [
        ({"keys": 1}, names[1], 4.0, 5.0), ({"keys": 2}, names[0], 9.0, 9.0)]
    by_batch = tune.fastest(results, "small_gemv", made, "batch")
    assert [(f["kernel"], f["us"]) for f in by_batch] == [(names[0], 4.0), (names[1], 7.0)]
    assert by_batch[1]["entry"] == {"name": "small_gemv", "kind": "q4k_gemv", "n": 64, "k": 512,
                                    **made[1].changes}


def test_tune_values_read_as_toml_would():
    from ptxgen.tune import parse_tune

    assert parse_tune(["a=1,0x10,true,false,none,static,2.5", "sm90a.block_n=64"]) == {
        "a": [1, 16, True, False, None, "static", 2.5], "sm90a.block_n": [64]}


def test_peers_are_timed_once_per_kind_shapes_and_scalars_when_asked(sim, monkeypatch):
    """--peers once (and --tune): rows of one kind with the same array shapes and scalars share the
    peers timed on the first, a note naming it; other shapes get their own; --peers none times none."""
    import ptxgen.bench

    monkeypatch.setattr(ptxgen.bench, "load_torch", lambda: (FakeTorch, None))
    timed = []

    def time_peers(gpu, torch, kind, inputs, scalars, *rest):
        timed.append(scalars)
        return [{"name": "fake", "median_us": 1.0 + len(timed)}], []

    monkeypatch.setattr(ptxgen.bench, "time_peers", time_peers)
    swiglu, norm = spec_kernel("qwen3_8b_swiglu"), spec_kernel("qwen3_8b_rmsnorm")
    monkeypatch.setattr(ptxgen.bench, "MIN_ITERS", 3)
    monkeypatch.setattr(ptxgen.bench, "WARMUP", 1)
    plan = [(swiglu, {}), (norm, {"rows": 1}), (swiglu, {}), (norm, {"rows": 2})]
    for peers, expected in (("once", 3), ("all", 4), ("none", 0)):
        timed.clear()
        rows = ptxgen.bench.run_bench({"file": "spec", "sha256": "0"}, plan, iters=3, worker=InProcess(),
                                      peers=peers)["rows"]
        assert len(timed) == expected, peers
        if peers == "once":
            assert rows[2]["peers"] == rows[0]["peers"] and rows[2]["best_peer"] == {"name": "fake", "median_us": 2.0}
            assert "qwen3_8b_swiglu: peers shared with qwen3_8b_swiglu (timed there once" in rows[2]["notes"][-1]
            assert rows[3]["peers"] != rows[1]["peers"], "another row count is another shape"
        if peers == "none":
            assert not any(row["peers"] for row in rows)


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


def test_bench_times_a_kind_peer_on_the_same_stream(sim, monkeypatch):
    import ptxgen.bench
    from ptxgen.kernels import KINDS
    from ptxgen.peers import Skipped

    made = []

    def torch_peer(self, torch, tensors, scalars):
        made.append(tensors)
        gate, up = tensors["gate"], tensors["up"]

        def peer():
            sim.occupy(2e-6)
            return gate / (1 + np.exp(-gate)) * up

        def slower():
            sim.occupy(3e-6)
            return gate / (1 + np.exp(-gate)) * up

        return {"fake torch": peer, "slower": slower, "absent": Skipped("absentlib is not installed")}

    monkeypatch.setattr(KINDS["swiglu"], "torch_peer", torch_peer, raising=False)
    monkeypatch.setattr(ptxgen.bench, "load_torch", lambda: (FakeTorch, None))
    report = quick_bench(sim, monkeypatch, [("qwen3_8b_swiglu", {})])
    (row,) = report["rows"]
    peer, slower = row["peers"]
    assert peer["name"] == "fake torch" and peer["median_us"] == pytest.approx(2.0)
    assert slower["median_us"] == pytest.approx(3.0)
    assert peer["batch"]["median_us"] == pytest.approx(2.0) and peer["batch"]["calls_per_event"] == 10
    assert row["best_peer"] == {"name": "fake torch", "median_us": pytest.approx(2.0)}
    assert "peer absent skipped: absentlib is not installed" in row["notes"], "an absent peer is a note"
    assert peer["error"] < 1e-6, "the peer's result is compared with the float64 reference"
    assert peer["pct_copy_bw"] == pytest.approx(100 * row["bytes"] / 2e-6 / 1e9 / 3000)
    assert len(made) == row["sets"] > 1 and made[0]["gate"] is not made[1]["gate"], "each set has its own inputs"
    assert FakeTorch.cuda.streams[-1] == int(session().stream), "peers run on the session's stream"


# --- 3. the device worker ----------------------------------------------------------------------------
SMALL_SPEC = """
[target]
archs = ["sm_90"]

[[kernels]]
name = "qwen3_8b_rmsnorm"
kind = "rmsnorm"
hidden = 4096
eps = 1e-06

[[kernels]]
name = "qwen3_8b_swiglu"
kind = "swiglu"
n = 12288

[[kernels]]
name = "qwen3_8b_residual_add"
kind = "residual_add"
n = 4096
"""


@pytest.fixture
def small_spec(tmp_path):
    path = tmp_path / "small.toml"
    path.write_text(SMALL_SPEC)
    return path


@pytest.fixture
def worker_gpu(monkeypatch, tmp_path):
    """Device workers start with a simulated GPU; call it with SimulatedDriver options (faulty=...,
    wrong=...) to change them. Returns the file each child appends its launched entries to."""
    import functools

    import simulated_gpu
    from ptxgen import worker

    log = tmp_path / "launches.txt"

    def configure(**options):
        monkeypatch.setattr(worker, "CHILD_SETUP", functools.partial(simulated_gpu.install, launch_log=str(log),
                                                                     **options))
        return log

    configure()
    return configure


def test_a_worker_names_a_fault_and_the_next_call_runs_in_a_fresh_process(worker_gpu):
    from ptxgen.verify import verify_kernel
    from ptxgen.worker import DeviceWorker

    log = worker_gpu(faulty=("qwen3_8b_swiglu",))
    swiglu, norm = spec_kernel("qwen3_8b_swiglu"), spec_kernel("qwen3_8b_rmsnorm")
    with DeviceWorker() as worker:
        checks = worker.call(verify_kernel, norm, {"rows": 3}, backend="device")
        assert checks and all(check.passed for check in checks)
        first = worker.process.pid
        with pytest.raises(LaunchError) as caught:
            worker.call(verify_kernel, swiglu, {}, backend="device")
        message = str(caught.value)
        assert "running qwen3_8b_swiglu failed on Simulated GPU: CUDA_ERROR_ILLEGAL_ADDRESS" in message, message
        assert worker.process is None, "the child whose context was lost is gone"
        checks = worker.call(verify_kernel, norm, {"rows": 1}, backend="device")
        assert checks and all(check.passed for check in checks), "a fresh child runs the next kernel"
        assert worker.process.pid != first
        with pytest.raises(LaunchError, match="'rows': expected an integer"):
            worker.call(norm.check_scalars, {"rows": -1})  # a PtxgenError comes back as itself
        assert worker.process is not None, "an error that is not a fault keeps the child"
    assert log.read_text().split() == ["qwen3_8b_rmsnorm", "qwen3_8b_swiglu", "qwen3_8b_rmsnorm"]


def test_a_worker_that_dies_is_a_launch_error_and_is_replaced(worker_gpu):
    import os

    from ptxgen.worker import DeviceWorker

    with DeviceWorker() as worker:
        pid = worker.call(os.getpid)
        assert pid != os.getpid()
        with pytest.raises(LaunchError, match="the device worker was killed by SIGKILL while running kill"):
            worker.call(os.kill, pid, 9)
        assert worker.call(os.getpid) not in (pid, os.getpid())


def test_verify_on_the_device_reports_the_faulting_kernel_and_goes_on(worker_gpu, small_spec):
    from ptxgen.cli import app

    log = worker_gpu(faulty=("qwen3_8b_swiglu",))
    result = CliRunner().invoke(app, ["verify", str(small_spec), "--backend", "device"], catch_exceptions=False)
    assert result.exit_code == 1, result.output
    output = one_line(result.output)
    assert "FAIL qwen3_8b_swiglu: running qwen3_8b_swiglu failed on Simulated GPU: CUDA_ERROR_ILLEGAL_ADDRESS" in output
    passes = [line for line in result.output.splitlines() if line.rstrip().endswith("pass")]
    assert {line.split()[0] for line in passes} == {"qwen3_8b_rmsnorm", "qwen3_8b_residual_add"}, result.output
    assert log.read_text().split().count("qwen3_8b_residual_add") == 1, "the kernel after the fault ran"
    worker_gpu()
    result = CliRunner().invoke(app, ["verify", str(small_spec), "--backend", "device"], catch_exceptions=False)
    assert result.exit_code == 0, result.output


# --- verify --sanitize against a fake compute-sanitizer --------------------------------------------------
FAKE_SANITIZER = """#!{python}
# Plays compute-sanitizer: records its options, runs the command after them, and reports one memcheck
# error for each launch (in the simulated GPU's launch log) of a kernel named in FAKE_SANITIZER_FAULTY.
import json, os, subprocess, sys
args, options = sys.argv[1:], {{}}
while args[0].startswith("--"):
    options[args[0]], args = args[1], args[2:]
with open(os.environ["FAKE_SANITIZER_CALLS"], "a") as calls:
    calls.write(json.dumps(options) + "\\n")
launches = os.environ["FAKE_SANITIZER_LAUNCHES"]
before = os.path.getsize(launches) if os.path.exists(launches) else 0
status = subprocess.call(args)
with open(launches) as log:
    log.seek(before)
    launched = log.read().split()
faulty = [entry for entry in launched if entry in os.environ["FAKE_SANITIZER_FAULTY"].split(",")]
lines = ["========= COMPUTE-SANITIZER"]
for entry in faulty:
    lines += ["========= Invalid __global__ write of size 4 bytes", f"=========     at {{entry}}+0x70",
              "=========     by thread (3,0,0) in block (1,0,0)", "=========     Address 0x7f0000 is out of bounds",
              "=========     Saved host backtrace up to driver entry point at kernel launch time",
              "=========         Host Frame: cuLaunchKernel [0x2f3b1] in libcuda.so.1", "========="]
lines.append(f"========= ERROR SUMMARY: {{len(faulty)}} error{{'' if len(faulty) == 1 else 's'}}")
with open(options["--log-file"], "w") as report:
    report.write("\\n".join(lines) + "\\n")
sys.exit(status)
"""


@pytest.fixture
def fake_sanitizer(worker_gpu, tmp_path, monkeypatch):
    """A compute-sanitizer on PATH that reports a memcheck error for each launch of the kernels in
    FAKE_SANITIZER_FAULTY; returns the file its options are recorded in (a JSON line a run)."""
    import os

    folder = tmp_path / "bin"
    folder.mkdir()
    script = folder / "compute-sanitizer"
    script.write_text(FAKE_SANITIZER.format(python=sys.executable))
    script.chmod(0o755)
    calls = tmp_path / "sanitizer-calls.txt"
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SANITIZER_CALLS", str(calls))
    monkeypatch.setenv("FAKE_SANITIZER_LAUNCHES", str(worker_gpu()))
    monkeypatch.setenv("FAKE_SANITIZER_FAULTY", "qwen3_8b_swiglu")
    return calls


def test_verify_sanitize_names_each_kernels_findings(fake_sanitizer, small_spec):
    from ptxgen.cli import app

    result = CliRunner().invoke(app, ["verify", str(small_spec), "--backend", "device", "--sanitize",
                                      "memcheck,racecheck", "--launch-timeout", "300"], catch_exceptions=False)
    assert result.exit_code == 1, result.output
    table = {tuple(line.split()[:2]): " ".join(line.split()[2:]) for line in result.output.splitlines()
             if line.startswith("qwen3_8b_") and line.split()[1] in ("memcheck", "racecheck")}
    assert table[("qwen3_8b_swiglu", "memcheck")] == ("1 Invalid __global__ write of size 4 bytes at qwen3_8b_swiglu+0x70 "
                                                     "by thread (3,0,0) in block (1,0,0)"), result.output
    for kernel in ("qwen3_8b_rmsnorm", "qwen3_8b_residual_add"):
        assert table[(kernel, "memcheck")] == table[(kernel, "racecheck")] == "0 none", result.output
    calls = [json.loads(line) for line in fake_sanitizer.read_text().splitlines()]
    assert [call["--tool"] for call in calls] == ["memcheck", "racecheck"] * 3, "each kernel, each tool, its own run"
    assert all(call["--launch-timeout"] == "300" for call in calls)
    passes = [line for line in result.output.splitlines() if line.rstrip().endswith("pass [memcheck]")]
    assert len(passes) == 4, "the checks ran under the sanitizer too (rmsnorm at 2 sizes, swiglu, residual_add)"


def test_verify_sanitize_json_gives_each_run_its_tool_findings_and_error_count(fake_sanitizer, small_spec):
    from ptxgen.cli import app

    result = CliRunner().invoke(app, ["verify", str(small_spec), "--backend", "device", "--sanitize", "memcheck",
                                      "--json"], catch_exceptions=False)
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    runs = {run["kernel"]: run for run in report["runs"]}
    assert [(run["tool"], run["target"], run["sanitizer_errors"], run["status"]) for run in runs.values()] == \
        [("memcheck", None, 0, "pass"), ("memcheck", None, 1, "fail"), ("memcheck", None, 0, "pass")], report
    swiglu = runs["qwen3_8b_swiglu"]
    assert swiglu["findings"] == [{"headline": "Invalid __global__ write of size 4 bytes", "count": 1,
                                   "where": "at qwen3_8b_swiglu+0x70 by thread (3,0,0) in block (1,0,0)"}], swiglu
    assert swiglu["failure"] is None and swiglu["checks"] and all(check["passed"] for check in swiglu["checks"])
    assert report["summary"] == {"passed": 2, "failed": 1, "not_checked": 0, "runs": 3}
    assert (report["backend"], report["arch"]) == ("device", None)


def test_verify_sanitize_refuses_what_it_cannot_do(fake_sanitizer, small_spec, monkeypatch):
    from ptxgen.cli import app

    for args, message in ((["--sanitize", "memcheck"], "add --backend device"),
                          (["--backend", "device", "--sanitize", "memcheck,leakcheck"], "expected tools among")):
        result = CliRunner().invoke(app, ["verify", str(small_spec), *args])
        assert isinstance(result.exception, LaunchError) and message in str(result.exception), result.output
    monkeypatch.setenv("PATH", str(fake_sanitizer.parent))  # no compute-sanitizer there
    result = CliRunner().invoke(app, ["verify", str(small_spec), "--backend", "device", "--sanitize", "all"])
    assert isinstance(result.exception, PtxgenError) and "compute-sanitizer is not on PATH" in str(result.exception)


def test_sanitizer_reports_are_parsed_into_findings():
    from ptxgen.device_verify import Finding, parse_report

    report = """========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at attention+0x1a0
=========     and Read access at attention+0x1c0 [16 hazards]
=========
========= Invalid __shared__ read of size 4 bytes
=========     at attention+0x90
=========     by thread (0,0,0) in block (2,0,0)
=========     Address 0x400 is out of bounds
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: cuLaunchKernel [0x2f3b1] in libcuda.so.1
=========
========= Invalid __shared__ read of size 4 bytes
=========     at attention+0x90
=========     by thread (0,0,0) in block (2,0,0)
=========     Address 0x404 is out of bounds
=========
========= Program hit CUDA_ERROR_LAUNCH_FAILED (error 719) due to "unspecified launch failure" on CUDA API call to cuStreamSynchronize.
=========     Saved host backtrace up to driver entry point at error
=========
========= ERROR SUMMARY: 4 errors
"""
    findings, errors = parse_report(report)
    assert errors == 4
    assert findings == [
        Finding("Error: Race reported between Write access at attention+0x1a0", ""),
        Finding("Invalid __shared__ read of size 4 bytes", "at attention+0x90 by thread (0,0,0) in block (2,0,0)", 2),
        Finding('Program hit CUDA_ERROR_LAUNCH_FAILED (error 719) due to "unspecified launch failure" on CUDA API '
                "call to cuStreamSynchronize.", "")]
    assert parse_report("========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n") == ([], 0)
    assert parse_report("") == ([], None)


def test_a_worker_that_cannot_start_is_one_clear_error():
    from ptxgen.worker import DeviceWorker

    with DeviceWorker(["false"]) as worker:  # a wrapper that exits at once (as a broken sanitizer would)
        with pytest.raises(LaunchError, match=r"the device worker \(false .* -m ptxgen.worker\) exited with status 1 "
                                              "before it started"):
            worker.call(len, [])
    with DeviceWorker(["/nonexistent/wrapper"]) as worker:
        with pytest.raises(PtxgenError, match="cannot start the device worker"):
            worker.call(len, [])


from ptxgen.bench import DeviceStep  # noqa: E402 (after the module-level skip)


class ChaoticStep(DeviceStep):
    """bench.DeviceStep without a device: each path's result is x moved by a function of x's exact
    bits (as rounding flips through many layers move a deep step), `gain` its size."""

    def __init__(self, gain: float, fused_scale: float = 1.0, role: str = "inout"):
        from types import SimpleNamespace

        from ptxgen.abi import Param

        self.result = Param("x", "f32", (4096,), role=role)
        self.host = {"x": np.random.default_rng(3).standard_normal(4096).astype(np.float32)}
        self.compiled = SimpleNamespace(name="deep", definition=SimpleNamespace(tolerance=lambda param: 1.5e-2))
        self.scalars = {}
        self.gain, self.fused_scale = gain, fused_scale
        self.run_kernel, self.run_step = "fused", "separate"

    def outcome(self, path):
        x = self.host["x"].astype(np.float64)
        bits = self.host["x"].view(np.uint32).astype(np.float64)
        moved = x * (1 + self.gain * np.sin(bits * (12.9898 if path == "fused" else 78.233)))
        return moved * (self.fused_scale if path == "fused" else 1.0)


@pytest.mark.parametrize("gain, fused_scale, passes", [
    (0.0, 1.0, True),      # shallow: both paths agree, the kind's tolerance (1.5e-2)
    (0.0, 1.02, False),    # a 2% error past it is caught
    (0.025, 1.0, True),    # deep: the paths part by ~3.5e-2, as each does from x one ulp away
    (0.025, 1.2, False),   # a 20% error is not a spread
])
def test_a_deep_fused_step_may_part_from_its_separate_kernels_by_what_one_ulp_of_input_moves_it(gain, fused_scale,
                                                                                               passes):
    """36 layers of Qwen3-8B on an H100: the decoder 3.5e-2 from its separate kernels, each path
    3.2-3.5e-2 from itself with x one ulp away, both bitwise stable (bench.SPREAD_MULTIPLE): the
    check allows twice the larger spread where that exceeds the kind's tolerance, and the
    inputs are put back after the spread runs."""
    from ptxgen.bench import SPREAD_MULTIPLE

    step = ChaoticStep(gain, fused_scale)
    x = step.host["x"].copy()
    check = step.check()
    assert np.array_equal(step.host["x"], x)
    spread = max(step.spread("fused", step.outcome("fused")), step.spread("separate", step.outcome("separate")))
    assert check.tolerance == max(1.5e-2, SPREAD_MULTIPLE * spread)
    assert spread < 1e-6 if gain == 0 else 0.02 < spread < 0.05, spread  # one ulp alone: ~6e-8
    assert check.passed == passes, (check.error, check.tolerance)


def test_a_result_the_step_does_not_read_has_no_spread():
    step = ChaoticStep(0.025, role="out")
    assert step.spread("fused", step.outcome("fused")) == 0.0


def test_make_bench_checks_its_output_files_before_the_gpus_minutes(sim, monkeypatch, run_all, tmp_path):
    """A result file `make bench` could not write (here a read-only .md of the run's name) stops
    it before any row is timed, one message naming --out; it was found after the whole run (a
    traceback from write_text)."""
    import datetime

    from ptxgen import worker

    class InProcess:  # the simulated GPU lives in this process
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def call(self, function, *args, **kwargs):
            return function(*args, **kwargs)

    monkeypatch.setattr(worker, "DeviceWorker", InProcess)
    monkeypatch.setattr("ptxgen.bench.run_bench", lambda *a, **k: pytest.fail("timed rows before checking --out"))
    from ptxgen.bench import device_info

    stem = run_all.stem_of(tmp_path, device_info()["name"], datetime.date.today())
    stem.with_suffix(".md").write_text("an earlier report\n")
    stem.with_suffix(".md").chmod(0o444)
    with pytest.raises(PtxgenError, match=rf"--out {stem}\.md: the file is read-only; refusing to replace it"):
        run_all.main(["--out", str(tmp_path)])
    assert stem.with_suffix(".md").read_text() == "an earlier report\n" and not stem.with_suffix(".json").exists()
