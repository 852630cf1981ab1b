"""Timing compiled kernels on the GPU against its measured copy bandwidth and peers (`ptxgen bench`).

Each kernel is first checked on the device against its float64 reference (as `ptxgen verify
--backend device` does); a kernel that fails is not timed. Timing: warm-up, then at least 100
back-to-back runs with a CUDA event after each (median, p10, p90), each run on the next of enough
rotating copies of the kernel's buffers that a memory-bound kernel is not served from L2; then the
same runs `batched`, CALLS_PER_EVENT between two events (each figure a group's mean), so that
neither an event's cost nor its place in the stream (it records once the run before it is done,
and the next run is queued behind it: by stream order no programmatic dependent launch overlaps
across it) is in them: how a run goes back to back in an engine's stream. The
runs go in chunks that fit the launch queue, each behind a spin kernel that holds the GPU while
the host queues it (DeviceSession.time); a figure the host could not keep up with is marked
host-bound. Bytes and flops come from the kind's traffic() model; the copy bandwidth they are
compared with is a device-to-device copy measured in the same run (read + write bytes).

Every row runs in a device worker (ptxgen.worker): a kernel that faults fails its row with the
CUDA error, and the next row runs in a fresh process.

Peers come from the kind's optional `torch_peer` hook and fused kinds are compared with their
`separate_step` (both declared, with their contracts, on ptxgen.kernels.base.Kind): bench runs
the kernel and the separate kernels on the device from the same state and compares the kernel's
first written parameter (a check like the others: a mismatch fails the row; see SPREAD_MULTIPLE
for how far apart two correct deep steps may be), then times the
separate kernels launched one by one and replayed as one CUDA graph, plus the wall-clock time of
one call at a time with a synchronize after each (host launch costs included, as in a batch-1
decode loop that must read each token before the next step).
"""

from __future__ import annotations

import datetime
import functools
import importlib.util
import io
import json
import math
import subprocess
import time
from pathlib import Path
from typing import Annotated, Callable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from rich.console import Console

from . import __version__
from .artifacts import write_file
from .compiled import CompiledKernel
from .dtypes import DTYPES, to_float64
from .errors import LaunchError, PtxgenError
from .peers import Skipped
from .tables import print_table
from .worker import DeviceWorker

MIN_ITERS = 100
WARMUP = 10
# Runs between two events in the batched figures: an event costs a tenth of it a run, and nine
# of ten runs follow another run directly (PDL can overlap them).
CALLS_PER_EVENT = 10
L2_MULTIPLE = 3  # the rotated buffer sets of a kernel span at least this many L2 caches
MAX_SETS = 4096
REFERENCE_FLOPS = 1e10  # also check at the timed sizes when the float64 reference costs at most this
ALIGN = 256
# A fused kernel and its separate kernels sum in other orders, and a rounding that flips (an int8
# activation, a kv_dtype cache element) moves everything after it, so through many layers two
# correct paths part by the model's own sensitivity to its input, not by the kind's one-step
# tolerance. Measured on an H100 (bench/results/H100-2026-11-27-lease/decoder_depth.json, Qwen3-8B
# shapes, pos 4095, rel. L2 of x): fused vs separate 1.3e-7, 4.0e-3, 1.7e-2, 3.5e-2 at 1, 4, 12, 36
# layers; each path against itself from x one f32 ulp away 2.2e-7, 2.2-4.0e-3, 1.6-1.7e-2,
# 3.2-3.5e-2; both paths bitwise equal run to run and on half the grid (no race). Two paths that
# part like independent perturbations differ by about sqrt(2) times either's spread (measured:
# 0.98-1.02 times the larger spread, 1.07-1.8 times the smaller): the check allows this many times
# the larger spread where that is more than the kind's tolerance.
SPREAD_MULTIPLE = 2.0
# size_fits: a kernel's rows are fitted when their flop-per-byte ratios agree within this factor
# (time then scales with bytes and flops alike; a causal prefill's grows with seq_len: no line).
FIT_INTENSITY_SPREAD = 1.1
# variant_comparisons: a variant is called faster or slower than its baseline when every figure
# both have moved by more than this fraction (run-to-run spread of a lease's medians: ~1-2%).
VARIANT_MARGIN = 0.05
# Issue 12: a fused norm + GEMV within this factor of the plain GEMV of its config (fusion_comparisons).
FUSED_GEMVS = {"fused_rmsnorm_q4k_gemv": "q4k_gemv"}
FUSION_BOUND = 1.05


# --- figures -----------------------------------------------------------------------------------------
def figures(timing, traffic, copy_gbs: float) -> dict:
    """Median/p10/p90 microseconds of a device.Timing, the median's GB/s, TFLOP/s and % of the copy
    bandwidth, and whether the host could not keep the GPU fed (host_bound: the figures include
    host time)."""
    p10, median, p90 = (float(v) for v in np.percentile(timing.times, [10, 50, 90]))
    seconds = median * 1e-6
    gbs = traffic.bytes / seconds / 1e9
    return {"median_us": median, "p10_us": p10, "p90_us": p90, "gbs": gbs,
            "tflops": traffic.flops / seconds / 1e12, "pct_copy_bw": 100.0 * gbs / copy_gbs,
            "host_bound": timing.host_bound, "calls_per_chunk": timing.calls_per_chunk,
            "calls_per_event": timing.calls_per_event}


def rotation_sets(touched_bytes: int, set_bytes: int, l2_bytes: int, free_bytes: int) -> int:
    """Copies of a kernel's buffers to cycle through so that each run starts with a cold L2.

    A run touches `touched_bytes` (the traffic model) of the `set_bytes` one copy occupies.
    """
    per_run = max(1, min(touched_bytes, set_bytes))
    wanted = math.ceil(L2_MULTIPLE * l2_bytes / per_run) + 1
    fits = (free_bytes // 2) // max(set_bytes, 1)
    return max(1, min(MAX_SETS, wanted, fits))


def git_commit() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


# --- timing ------------------------------------------------------------------------------------------
def time_kernel(gpu, compiled: CompiledKernel, arrays: dict, scalars: dict, iters: int, graph: bool,
                touched_bytes: int) -> dict:
    """Times of the kernel, each run alone and batched (CALLS_PER_EVENT runs between two events), and
    of CUDA-graph replays of it, over rotated copies of its buffers."""
    launch = compiled.launch(scalars, gpu.arch)
    stride = {p.name: max(ALIGN, -(-arrays[p.name].nbytes // ALIGN) * ALIGN) for p in compiled.params if p.is_array}
    gpu.trim()
    sets = rotation_sets(touched_bytes, sum(stride.values()), gpu.l2_bytes, gpu.free_memory())
    slabs = {}
    graphs = []
    try:
        for name, step in stride.items():  # one slab per parameter: copy s at offset s * step
            slabs[name] = gpu.alloc(step * sets)
            first = slabs[name].view(0, arrays[name].nbytes)
            gpu.upload(first, arrays[name])
            for s in range(1, sets):
                gpu.copy(slabs[name].view(s * step, arrays[name].nbytes), first)
        args = [compiled.args({name: slab.view(s * stride[name], arrays[name].nbytes) for name, slab in slabs.items()},
                              scalars) for s in range(sets)]
        device_kernel = gpu.kernel(compiled)
        launchers = [gpu.launcher(device_kernel, launch, args[s]) for s in range(sets)]

        def run(i):
            launchers[i % sets]()
        result = {"sets": sets, "set_bytes": sum(stride.values()), "timing": gpu.time(run, iters, WARMUP),
                  "batch_timing": gpu.time(run, iters, WARMUP, CALLS_PER_EVENT), "graph_timing": None,
                  "graph_note": None}
        if graph:
            try:
                for s in range(sets):
                    graphs.append(gpu.capture(lambda: gpu.launch(device_kernel, launch, args[s])))
            except LaunchError as error:  # e.g. a driver that cannot capture this launch: report, go on
                if gpu.broken:
                    raise
                result["graph_note"] = f"{compiled.name}: not timed as a CUDA graph: {error}"
            else:
                result["graph_timing"] = gpu.time(lambda i: gpu.replay(graphs[i % sets]), iters, WARMUP)
        return result
    finally:
        if not gpu.broken:  # after a fault the context is gone with everything in it
            for captured in graphs:
                gpu.destroy(captured)
            gpu.synchronize("timing")
            for slab in slabs.values():
                gpu.free(slab, keep=False)


def wall_times(gpu, enqueue, iters: int, warmup: int = WARMUP) -> list[float]:
    """Microseconds from queueing one call to its completion, one call at a time (host included)."""
    times = []
    for i in range(warmup + iters):
        start = time.perf_counter()
        enqueue()
        gpu.synchronize("a timed call")
        if i >= warmup:
            times.append((time.perf_counter() - start) * 1e6)
    return times


class DeviceStep:
    """A kernel and the same work as separate kernels (its kind's separate_step) on the device,
    over one set of buffers: the kernel's arrays plus the step's temporaries."""

    def __init__(self, gpu, compiled: CompiledKernel, arrays: dict[str, np.ndarray], scalars: dict,
                 compiled_of: Callable[[object], CompiledKernel]):
        from .runner import bind

        temporaries, self.calls = compiled.definition.separate_step(dict(scalars))
        self.gpu, self.compiled, self.scalars = gpu, compiled, dict(scalars)
        self.host = {**arrays, **{t.name: np.zeros(t.concrete_shape({}), DTYPES[t.dtype].numpy) for t in temporaries}}
        self.result = next(p for p in compiled.params if p.written)
        self.buffers, self.workspaces = {}, {}
        try:
            for name, array in self.host.items():
                self.buffers[name] = gpu.alloc(array.nbytes)
            self.upload(self.host)
            self.run_kernel = self.launcher(compiled, scalars, set(arrays), lambda p: self.buffers[p.name])
            self.steps = []
            for call in self.calls:
                def bound(param, call=call):
                    name, view = bind(call, param, self.host)
                    return self.buffers[name].view(view.ctypes.data - self.host[name].ctypes.data, view.nbytes)

                self.steps.append(self.launcher(compiled_of(call.kernel), call.scalars, set(call.args), bound))
        except BaseException:
            self.free()
            raise

    def launcher(self, compiled: CompiledKernel, scalars: dict, names: set[str], bound):
        """A prepared launch of `compiled`: bound(param) gives the buffers of the parameters in
        `names`; its other workspaces are allocated (zeroed) once per kernel."""
        launch = compiled.launch(scalars, self.gpu.arch)
        buffers = {}
        for param in compiled.params:
            if not param.is_array:
                continue
            if param.name in names:
                buffers[param.name] = bound(param)
                continue
            key = (compiled.name, param.name)
            if key not in self.workspaces:
                self.workspaces[key] = self.gpu.alloc(param.nbytes(scalars))
                self.gpu.zero(self.workspaces[key])
            buffers[param.name] = self.workspaces[key]
        return self.gpu.launcher(self.gpu.kernel(compiled), launch, compiled.args(buffers, scalars))

    @property
    def kernels(self) -> int:
        return len({call.kernel.name for call in self.calls})

    def upload(self, arrays: dict[str, np.ndarray]) -> None:
        for name, array in arrays.items():
            self.gpu.upload(self.buffers[name], array)

    def run_step(self) -> None:
        for queue in self.steps:
            queue()

    def outcome(self, enqueue) -> np.ndarray:
        """The first written parameter after one call of enqueue() from the initial state (every
        buffer but the kernel's read-only inputs is uploaded again first)."""
        read_only = {p.name for p in self.compiled.params if p.role == "in"}
        self.upload({name: array for name, array in self.host.items() if name not in read_only})
        enqueue()
        value = np.empty_like(self.host[self.result.name])
        self.gpu.download(value, self.buffers[self.result.name])
        return to_float64(value, self.result.dtype)

    def spread(self, enqueue, result: np.ndarray) -> float:
        """Relative L2 by which enqueue's result moves when the result's input (a read-and-rewritten
        f32 parameter: the decoder's x) starts every element one ulp away (0 for other results)."""
        from .verify import relative_l2

        if self.result.role != "inout" or self.result.dtype != "f32":
            return 0.0
        start = self.host[self.result.name].copy()
        away = np.where(np.random.default_rng(0).random(start.shape) < 0.5, -np.inf, np.inf).astype(np.float32)
        self.host[self.result.name][...] = np.nextafter(start, away)
        try:
            moved = self.outcome(enqueue)
        finally:
            self.host[self.result.name][...] = start
        return relative_l2(np.nan_to_num(moved), np.nan_to_num(result))

    def check(self):
        """The kernel against the separate kernels from the same state (a Check), allowed the
        kind's tolerance or SPREAD_MULTIPLE times how far either path moves from inputs one ulp
        away, whichever is larger."""
        from .verify import Check, relative_l2

        mine, theirs = self.outcome(self.run_kernel), self.outcome(self.run_step)
        unwritten = int(np.count_nonzero(~np.isfinite(mine)) + np.count_nonzero(~np.isfinite(theirs)))
        error = relative_l2(np.nan_to_num(mine), np.nan_to_num(theirs))
        spread = max(self.spread(self.run_kernel, mine), self.spread(self.run_step, theirs))
        tolerance = max(self.compiled.definition.tolerance(self.result), SPREAD_MULTIPLE * spread)
        return Check(self.compiled.name, f"{self.result.name} vs the separate kernels", self.scalars, mine.shape, error,
                     tolerance, unwritten)

    def time(self, iters: int, traffic, copy_gbs: float) -> dict:
        graph = self.gpu.capture(self.run_step)
        try:
            replay = lambda: self.gpu.replay(graph)  # noqa: E731
            return {
                "launches": len(self.calls), "kernels": self.kernels,
                "one_by_one": figures(self.gpu.time(lambda i: self.run_step(), iters, WARMUP), traffic, copy_gbs),
                "graph": figures(self.gpu.time(lambda i: replay(), iters, WARMUP), traffic, copy_gbs),
                "wall_us": {label: float(np.median(wall_times(self.gpu, enqueue, iters)))
                            for label, enqueue in (("kernel", self.run_kernel), ("one_by_one", self.run_step),
                                                   ("graph", replay))},
            }
        finally:
            self.gpu.destroy(graph)

    def free(self) -> None:
        if self.gpu.broken:  # the context went with everything in it
            return
        self.gpu.synchronize("the separate kernels")
        for buffer in [*self.buffers.values(), *self.workspaces.values()]:
            self.gpu.free(buffer, keep=False)
        self.buffers, self.workspaces = {}, {}


def load_torch():
    """(torch, None) when torch can use this GPU, else (None, why not)."""
    if importlib.util.find_spec("torch") is None:
        return None, "torch is not installed: no peer figures (pip install 'ptxgen[peers]')"
    try:
        import torch
    except Exception as error:  # a broken torch install must not stop the bench
        return None, f"torch failed to import ({type(error).__name__}: {error}): no peer figures"
    if not torch.cuda.is_available():
        return None, "torch sees no CUDA device: no peer figures"
    return torch, None


def to_torch(torch, array: np.ndarray, dtype: str):
    """A CUDA tensor with the array's values (bf16 bits -> bfloat16, u32 bits -> int32)."""
    array = np.ascontiguousarray(array) if array.flags.writeable else np.array(array)  # torch wants it writable
    if dtype == "bf16":
        return torch.from_numpy(array.view(np.int16)).to("cuda").view(torch.bfloat16)
    if dtype == "u32":
        return torch.from_numpy(array.view(np.int32)).to("cuda")
    return torch.from_numpy(array).to("cuda")


def time_peers(gpu, torch, kind, inputs: dict, scalars: dict, sets: int, iters: int, traffic, copy_gbs: float,
               reference: dict | None) -> tuple[list[dict], list[str]]:
    """Figures of each peer the kind names through its optional torch_peer hook."""
    from .verify import relative_l2

    read = [p for p in kind.params() if p.read]
    written = next(p for p in kind.params() if p.written)
    first = {p.name: to_torch(torch, inputs[p.name], p.dtype) for p in read}
    per_set = []
    try:
        for s in range(sets):
            tensors = first if s == 0 else {name: tensor.clone() for name, tensor in first.items()}
            made = kind.torch_peer(torch, tensors, dict(scalars))
            if made is None:
                per_set = first = None
                return [], [f"no peer: kind {kind.name} names none (Kind.torch_peer)"]
            per_set.append(made if isinstance(made, dict) else {"torch": made})
    except Exception as error:  # e.g. a torch too old for the hook: report, time the rest
        per_set = first = None
        torch.cuda.empty_cache()
        gpu.activate()
        return [], [f"{kind.name}.torch_peer() failed: {type(error).__name__}: {error}"]
    torch.cuda.synchronize()
    stream = torch.cuda.ExternalStream(int(gpu.stream))
    peers, notes = [], []
    for label in per_set[0]:
        if isinstance(per_set[0][label], Skipped):  # e.g. an optional peer library that is not installed
            notes.append(f"peer {label} skipped: {per_set[0][label].reason}")
            continue
        calls = [made[label] for made in per_set]
        entry = {"name": label, "error": None}
        try:
            with torch.cuda.stream(stream):
                result = calls[0]()
                gpu.synchronize(f"peer {label}")
                if reference is not None:
                    value = result.detach().float().cpu().numpy().astype(np.float64)
                    expected = reference[written.name]
                    if value.size == expected.size:
                        entry["error"] = relative_l2(value.reshape(expected.shape), expected)
                    else:
                        notes.append(f"peer {label}: {value.size} elements, {written.name} has {expected.size}")
                def call(i):
                    calls[i % sets]()
                timing = gpu.time(call, iters, WARMUP)
                batch = gpu.time(call, iters, WARMUP, CALLS_PER_EVENT)
            entry.update(figures(timing, traffic, copy_gbs), batch=figures(batch, traffic, copy_gbs))
        except PtxgenError:
            raise
        except Exception as error:  # a peer library that fails is reported, not fatal
            entry["failed"] = f"{type(error).__name__}: {error}"
            notes.append(f"peer {label} failed: {entry['failed']}")
        peers.append(entry)
    per_set = first = None  # let torch reuse the memory of the peers' inputs
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    gpu.activate()
    return peers, notes


def best_peer(peers: list[dict]) -> dict | None:
    """The fastest timed peer (name and median µs), or None."""
    timed = [p for p in peers if "median_us" in p]
    fastest = min(timed, key=lambda p: p["median_us"], default=None)
    return None if fastest is None else {"name": fastest["name"], "median_us": fastest["median_us"]}


# --- one row, all rows -------------------------------------------------------------------------------
def check_rows(checks) -> list[dict]:
    return [{"scalars": dict(c.scalars), "param": c.param, "error": float(c.error), "tolerance": float(c.tolerance),
             "unwritten": int(c.unwritten), "changed": int(c.changed), "element_error": c.element_error,
             "passed": bool(c.passed), "failure": c.failure, "again": c.again} for c in checks]


def new_row(compiled: CompiledKernel, scalars: dict) -> dict:
    """A row with nothing measured yet."""
    traffic = compiled.definition.traffic(scalars)
    config = {k: v for k, v in compiled.config.items() if k not in ("name", "kind")}
    return {"kernel": compiled.name, "kind": compiled.kind, "config": config, "scalars": dict(scalars),
            "bytes": int(traffic.bytes), "flops": int(traffic.flops), "checks": [], "passed": True, "failure": None,
            "sets": 0, "set_bytes": 0, "median_us": None, "p10_us": None, "p90_us": None, "gbs": None, "tflops": None,
            "pct_copy_bw": None, "host_bound": False, "calls_per_chunk": None, "batch": None, "graph": None, "peers": [],
            "best_peer": None, "step": None, "occupancy": None, "notes": []}


@functools.cache
def separate_kernels(archs: tuple[str, ...]) -> Callable[[object], CompiledKernel]:
    """The compiler of fused kernels' separate kernels, one per process and arch list."""
    from .pipeline import compiler

    return compiler(archs)


_ROW_INPUTS: dict = {}  # peer_key -> the last row's sample inputs (one entry: rows of a key run together)


def row_inputs(compiled: CompiledKernel, scalars: dict) -> dict[str, np.ndarray]:
    """A row's sample inputs (seed 0), made once for consecutive rows of one peer_key: a spec's
    variants of one kernel take the same arrays, and the 36-layer decoder's take ~30 s to make on
    a CPU. Read-only: every launch works on copies (runner.prepare_arrays), and one that did not
    would fail here instead of changing the next row's inputs."""
    key = peer_key(compiled, scalars)
    if key not in _ROW_INPUTS:
        _ROW_INPUTS.clear()
        inputs = compiled.definition.sample_inputs(np.random.default_rng(0), scalars)
        for array in inputs.values():
            array.setflags(write=False)
        _ROW_INPUTS[key] = inputs
    return dict(_ROW_INPUTS[key])


def bench_row(compiled: CompiledKernel, scalars: dict, iters: int, graph: bool, copy_gbs: float,
              verified: list | None, with_peers: bool = True, time_separate: bool = True) -> tuple[dict, list]:
    """Check one (kernel, scalars) on the device, then time it and (`with_peers`) its peers (in a
    device worker); a fused kind is checked against its separate kernels, which are timed too
    where `time_separate`. `verified`: the kernel's checks at its kind's verify sizes, if an
    earlier row made them. Returns the row and those checks."""
    from .device import session
    from .runner import prepare_arrays, run
    from .verify import compare, ran_target, verify_plan, verify_sizes

    gpu = session()
    kind = compiled.definition
    traffic = kind.traffic(scalars)
    row = new_row(compiled, scalars)
    if verified is None:  # the kind's own small sizes (or its stand-ins), once per kernel
        verified = [check for _, kernel, sizes in verify_plan(compiled)
                    for checks in verify_sizes(kernel, sizes, backend="device", smaller_grids=False) for check in checks]
    checks = list(verified)
    inputs = row_inputs(compiled, scalars)
    reference = None
    if traffic.flops <= REFERENCE_FLOPS:  # and at the timed sizes, as verify_kernel does
        reference = kind.reference(inputs, scalars)
        checks += compare(compiled, run(compiled, inputs, scalars, backend="device"), reference, scalars,
                          ran_target(compiled, "device", None))
    else:
        row["notes"].append(f"{compiled.name}: float64 reference too costly at this size: checked at the kind's "
                            f"verify sizes or stand-ins ({len(checks)} checks)")
    arrays = prepare_arrays(compiled, inputs, scalars)
    empty = compiled.launch(scalars, gpu.arch).empty
    step = None
    try:
        if not empty and kind.separate_step(dict(scalars)) is not None:
            step = DeviceStep(gpu, compiled, arrays, scalars, separate_kernels(tuple(compiled.binaries) or ("sm_80",)))
            checks.append(step.check())
        row["checks"] = check_rows(checks)
        row["passed"] = bool(checks) and all(check.passed for check in checks)
        if not checks:
            row["notes"].append(f"{compiled.name}: nothing to check it against at this size: not timed")
        if not row["passed"]:
            return row, verified
        if empty:
            row["notes"].append("empty launch: nothing to time")
            return row, verified
        if step is not None and time_separate:
            row["step"] = step.time(iters, traffic, copy_gbs)
    finally:
        if step is not None:
            step.free()

    row["occupancy"] = occupancy_row(gpu, compiled, scalars)
    if row["occupancy"]["ctas_per_sm"] != row["occupancy"]["model_ctas_per_sm"]:
        row["notes"].append(f"{compiled.name}: the driver fits {row['occupancy']['ctas_per_sm']} CTAs an SM, the model "
                            f"(ptxgen show) {row['occupancy']['model_ctas_per_sm']}")
    row["notes"] += [f"{compiled.name}: {row['occupancy']['assembler']} reports {loss}"
                     for loss in row["occupancy"]["performance_losses"]]
    timed = time_kernel(gpu, compiled, arrays, scalars, iters, graph, traffic.bytes)
    row["sets"], row["set_bytes"] = timed["sets"], timed["set_bytes"]
    if timed["sets"] * min(timed["set_bytes"], traffic.bytes) < L2_MULTIPLE * gpu.l2_bytes:
        row["notes"].append(f"only {timed['sets']} buffer set(s) fit in memory: runs may hit L2")
    row.update(figures(timed["timing"], traffic, copy_gbs))
    row["batch"] = figures(timed["batch_timing"], traffic, copy_gbs)
    if timed["graph_timing"] is not None:
        row["graph"] = figures(timed["graph_timing"], traffic, copy_gbs)
    if timed["graph_note"]:
        row["notes"].append(timed["graph_note"])
    torch, torch_note = load_torch() if with_peers else (None, None)
    if torch_note:
        row["notes"].append(torch_note)
    elif torch is not None:
        row["peers"], notes = time_peers(gpu, torch, kind, inputs, scalars, timed["sets"], iters, traffic, copy_gbs,
                                         reference)
        row["best_peer"] = best_peer(row["peers"])
        row["notes"] += notes
    return row, verified


def occupancy_row(gpu, compiled: CompiledKernel, scalars: dict) -> dict:
    """Which cubin the GPU loaded (its arch; the GPU's own where the driver JIT-compiled the PTX)
    from which PTX, by which assembler and with which performance losses it reported
    (assemble.performance_losses), and the driver's resident CTAs an SM for this launch (its
    occupancy calculator) beside the model's (perf.occupancy_per_arch over arch_launches, as
    `ptxgen show` computes it), with the registers and static shared bytes each side started from:
    the assembler's report (its static shared bytes as the driver counts them: without the reserve
    an sm_90 cubin's section holds, perf.driver_static_shared), or the driver's where the GPU's arch
    was JIT-compiled from PTX."""
    from .assemble import performance_losses
    from .perf import arch_launches, cubin_occupancy, driver_static_shared

    kernel = gpu.kernel(compiled)
    launch = gpu.prepare(kernel, compiled.launch(scalars, gpu.arch))
    binary = compiled.binary_for(gpu.arch)        # the cubin the GPU loads (sm_90a's on an sm_90 GPU)
    arch = binary.arch if binary is not None else gpu.arch
    registers, static = ((binary.resources["registers"], driver_static_shared(arch, binary.resources["shared_bytes"]))
                         if binary is not None else (kernel.registers, kernel.static_shared))
    model = cubin_occupancy(arch, arch_launches(compiled, scalars, [arch])[arch],
                            {"registers": registers, "shared_bytes": static})
    return {"cubin_arch": arch, "ptx_target": compiled.variant(gpu.arch).target,
            "assembler": compiled.assembler.get(arch, "the driver's JIT"),
            "performance_losses": performance_losses(binary.info_log) if binary is not None else [],
            "ctas_per_sm": gpu.resident_ctas(kernel, launch), "registers": kernel.registers,
            "static_shared": kernel.static_shared, "dynamic_shared": launch.dynamic_shared,
            "model_ctas_per_sm": model.ctas_per_sm, "model_limiter": model.limiter, "model_registers": registers,
            "model_static_shared": static}


def device_info() -> dict:
    """The GPU's name, arch, SMs, L2 bytes and driver version (in a device worker)."""
    from .device import session

    gpu = session()
    return {"name": gpu.name, "arch": gpu.arch, "sm_count": gpu.sm_count, "l2_bytes": gpu.l2_bytes,
            "driver": gpu.driver_version}


def measure_device() -> dict:
    """The GPU, its device-to-device copy bandwidth and the torch version (in a device worker)."""
    from .device import session

    copy_bytes, copy_seconds = session().copy_bandwidth()
    torch, _ = load_torch()
    return {"device": device_info(), "torch": torch.__version__ if torch is not None else None,
            "copy_bandwidth": {"bytes": copy_bytes, "median_us": copy_seconds * 1e6,
                               "gbs": 2 * copy_bytes / copy_seconds / 1e9}}


def run_bench(spec_file: dict, plan: list[tuple[CompiledKernel, dict]], iters: int = MIN_ITERS, graph: bool = False,
              progress: Callable[[str], None] = lambda label: None, worker=None,
              row_done: Callable[[dict], None] = lambda results: None, peers: str = "all") -> dict:
    """Every figure of a bench run, as written to --json. `spec_file` is {"file", "sha256"} of the
    spec the kernels came from; `progress(label)` is called before each row and `row_done(results)`
    after it (the results so far: --json rewrites its file, so a run cut short keeps its rows;
    `planned_rows` says how many the run meant to make); `worker` runs the device work (default: a
    DeviceWorker of its own); `peers`: "all" times each row's peers, "none" none, "once" those of
    each peer_key on its first row, later rows of that key sharing its figures (variants of one
    kernel, as `bench --tune` makes), and likewise a fused kind's separate kernels (each row is
    still checked against them: 30-45 s of a lease's 36-layer decoder rows went to timing the same
    separate kernels again). A row whose kernel faults (or whose device work fails) is a failed
    row naming the error; the rest go on."""
    if iters < MIN_ITERS:
        raise LaunchError(f"--iters: expected at least {MIN_ITERS} timed runs, got {iters}")
    owned = worker is None
    worker = DeviceWorker() if owned else worker
    try:
        measured = worker.call(measure_device)
        results = {"ptxgen_version": __version__, "git_commit": git_commit(),
                   "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   "device": measured["device"], "torch": measured["torch"], "spec": dict(spec_file), "iters": iters,
                   "copy_bandwidth": measured["copy_bandwidth"], "planned_rows": len(plan), "rows": []}
        verified: dict = {}
        timed_peers: dict = {}  # peer_key -> the row that timed them
        timed_steps: dict = {}  # peer_key -> the row that timed its separate kernels
        for compiled, scalars in plan:
            progress(f"{compiled.name} {describe_scalars(scalars)}")
            key = peer_key(compiled, scalars)
            first = timed_peers.get(key) if peers == "once" else None
            stepped = timed_steps.get(key) if peers == "once" else None
            started = time.perf_counter()
            try:
                row, verified[compiled.name] = worker.call(bench_row, compiled, scalars, iters, graph,
                                                           measured["copy_bandwidth"]["gbs"], verified.get(compiled.name),
                                                           peers != "none" and first is None, stepped is None)
            except LaunchError as error:  # a fault (the worker is replaced) or a launch the GPU refused
                row = new_row(compiled, scalars)
                row.update(passed=False, failure=str(error))
            row["wall_s"] = round(time.perf_counter() - started, 1)  # what the row cost a lease: checks, peers, timing
            if first is not None:
                row.update(peers=first["peers"], best_peer=first["best_peer"])
                row["notes"].append(f"{compiled.name}: peers shared with {first['kernel']} (timed there once: the "
                                    "same kind, shapes and scalars)")
            elif row["peers"]:
                timed_peers[key] = row
            if stepped is not None and row["passed"] and row["median_us"] is not None:
                row["step"] = stepped["step"]
                row["notes"].append(f"{compiled.name}: separate kernels timed with {stepped['kernel']} (the same "
                                    "kind, shapes and scalars; this row checked against them)")
            elif row["step"]:
                timed_steps[key] = row
            results["rows"].append(row)
            row_done(results)
        results["fits"] = size_fits(results)
        results["variants"] = variant_comparisons(results)
        return results
    finally:
        if owned:
            worker.stop()


def line_fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of y against x."""
    xs, ys = np.array([p[0] for p in points]), np.array([p[1] for p in points])
    slope = float(np.sum((xs - xs.mean()) * (ys - ys.mean())) / np.sum((xs - xs.mean()) ** 2))
    return float(ys.mean() - slope * xs.mean()), slope


def streaming_line(rows: list[dict], figure: Callable[[dict], dict | None], copy_gbs: float) -> dict | None:
    """time = fixed + bytes / rate through the rows' figure (per run, batched, a peer's), or None
    where a row lacks it or the time does not grow with the bytes."""
    figures = [figure(row) for row in rows]
    if not all(f and "median_us" in f for f in figures):
        return None
    points = [(row["bytes"] / 1e3, f["median_us"]) for row, f in zip(rows, figures)]  # (KB, us)
    fixed, slope = line_fit(points)
    if slope <= 0:
        return None
    return {"fixed_us": fixed, "gbs": 1 / slope, "pct_copy_bw": 100 / slope / copy_gbs,
            "worst_residual": max(abs(fixed + slope * kb - us) / us for kb, us in points)}


def same_but_size(row: dict) -> str:
    """What a row's kernel computes how, its size aside: the kind and the config without its name
    and the kind's shape fields (Kind.shape_fields); the runtime scalars are sizes too."""
    from .kernels import KINDS

    shapes = KINDS[row["kind"]].shape_fields if row["kind"] in KINDS else ()
    return json.dumps([row["kind"], {k: v for k, v in row["config"].items() if k not in shapes}], sort_keys=True)


def size_fits(results: dict) -> list[dict]:
    """For each kernel timed at two or more sizes with one flop-per-byte ratio (runtime scalar sets
    moving different bytes, or kernels of one kind and config but for their shape fields, as a
    GEMV's n x k): the straight line time = fixed + bytes / rate through its per-run medians, its
    batched ones, and each peer's timed at every size. What a kernel spends whatever its size
    (launch, ramp, tails, merges) apart from how fast it streams: a short run's % of copy
    bandwidth mixes the two."""
    copy_gbs = results["copy_bandwidth"]["gbs"]
    groups: dict[str, list[dict]] = {}
    for row in results["rows"]:
        if row["median_us"] is not None and row["bytes"] > 0:
            groups.setdefault(same_but_size(row), []).append(row)
    fits = []
    for rows in groups.values():
        intensities = [row["flops"] / row["bytes"] for row in rows]
        if len({row["bytes"] for row in rows}) < 2 or max(intensities) > FIT_INTENSITY_SPREAD * min(intensities):
            continue
        lines = {"per_run": streaming_line(rows, lambda row: row, copy_gbs),
                 "batched": streaming_line(rows, lambda row: row.get("batch"), copy_gbs)}
        names = [p["name"] for p in rows[0]["peers"] if "median_us" in p]
        peers = {}
        for name in names:
            def peer(row, name=name):
                return next((p for p in row["peers"] if p["name"] == name), None)
            line = {"per_run": streaming_line(rows, peer, copy_gbs),
                    "batched": streaming_line(rows, lambda row: (peer(row) or {}).get("batch"), copy_gbs)}
            if any(line.values()):
                peers[name] = line
        if any(lines.values()):
            kernels = list(dict.fromkeys(row["kernel"] for row in rows))
            fits.append({"kernel": " + ".join(kernels), "kernels": [row["kernel"] for row in rows],
                         "scalars": [row["scalars"] for row in rows], **lines, "peers": peers})
    return fits


def figure_us(row: dict, figure: str) -> float | None:
    """A row's median µs by `figure`: "median" (each run alone), "batch" or "graph" (None where not
    timed)."""
    found = row if figure == "median" else row.get(figure)
    return None if not found or found.get("median_us") is None else found["median_us"]


def flat_fields(config: dict, prefix: str = "") -> dict:
    """A config's fields with nested tables' as dotted names (`sm90a.pingpong`)."""
    flat = {}
    for name, value in config.items():
        if isinstance(value, dict) and value:
            flat.update(flat_fields(value, f"{prefix}{name}."))
        else:
            flat[f"{prefix}{name}"] = value
    return flat


def variant_key(row: dict) -> str | None:
    """What variants of one kernel share: the kind, the runtime scalars and the config fields that
    have no default (the shapes and heads a spec must name), with the kind's shape fields."""
    from .kernels import KINDS

    if row["kind"] not in KINDS:
        return None
    required = KINDS[row["kind"]].size_fields()
    return json.dumps([row["kind"], row["scalars"], {k: v for k, v in row["config"].items() if k in required}],
                      sort_keys=True)


def variant_comparisons(results: dict) -> list[dict]:
    """Each timed row against the row it is a variant of: of the timed rows of its kind, scalars
    and required fields (variant_key), the one whose name is the longest prefix of its own before
    a `_` (a lease names a variant after the kernel it changes: gemv_4096x4096_warps8_prefetch
    after gemv_4096x4096_warps8), else the first of those that have no such row. Its per-run and
    batched medians as ratios to that baseline's, the fields they differ in, and a verdict
    (faster, slower or within VARIANT_MARGIN, per figure where they disagree): which change to
    make a default."""
    groups: dict[str, list[dict]] = {}
    for row in results["rows"]:
        key = variant_key(row)
        if key is not None and row["passed"] and row["median_us"] is not None:
            groups.setdefault(key, []).append(row)
    found = []
    for rows in groups.values():
        prefixes = {row["kernel"]: [other for other in rows if row["kernel"].startswith(other["kernel"] + "_")]
                    for row in rows}
        root = next(row for row in rows if not prefixes[row["kernel"]])
        for row in rows:
            base = max(prefixes[row["kernel"]], key=lambda other: len(other["kernel"]), default=root)
            if base is row:
                continue
            base_fields = flat_fields(base["config"])
            fields = flat_fields(row["config"])
            differs = {name: fields.get(name) for name in sorted(set(fields) | set(base_fields))
                       if fields.get(name) != base_fields.get(name)}
            ratios = {name: figure_us(row, figure) / figure_us(base, figure)
                      for name, figure in (("per_run", "median"), ("batched", "batch"))
                      if figure_us(row, figure) and figure_us(base, figure)}
            words = {figure: "faster" if ratio < 1 - VARIANT_MARGIN else "slower" if ratio > 1 + VARIANT_MARGIN
                     else f"within {VARIANT_MARGIN:.0%}" for figure, ratio in ratios.items()}
            verdict = (next(iter(words.values())) if len(set(words.values())) == 1 else
                       ", ".join(f"{word} {figure.replace('_', ' ')}" for figure, word in words.items()))
            found.append({"kernel": row["kernel"], "baseline": base["kernel"], "scalars": row["scalars"],
                          "changes": differs, **ratios, "verdict": verdict})
    return found


def peer_key(compiled: CompiledKernel, scalars: dict) -> tuple:
    """What a row's peers depend on, for `peers="once"`: the kind, the shapes and dtypes of the
    arrays the caller passes (workspaces aside) and the runtime scalars. A config field that
    changes the arithmetic but no shape (an eps) is not in it: "once" is for variants of one
    kernel's schedule."""
    arrays = tuple((p.name, p.dtype, p.concrete_shape(scalars)) for p in compiled.params
                   if p.is_array and p.role != "workspace")
    return compiled.kind, arrays, describe_scalars(scalars)


# --- output ----------------------------------------------------------------------------------------
HOST_BOUND_NOTE = ("* host-bound: the host could not queue a chunk of calls within the time a spin kernel held the "
                   "GPU (a full launch queue or a slow host), so the GPU may have waited for it: the figure may "
                   "include host time")


def describe_scalars(scalars: dict) -> str:
    return ", ".join(f"{name}={value}" for name, value in scalars.items())


def microseconds(figure: dict, digits: int = 2) -> str:
    """A figure's median µs, marked * when host-bound."""
    return f"{figure['median_us']:.{digits}f}" + ("*" if figure.get("host_bound") else "")


def timed_figures(results: dict) -> list[dict]:
    """Every figure dict of the rows (kernel, batched, graph, peers and theirs, separate kernels)."""
    found = []
    for row in results["rows"]:
        if row["median_us"] is not None:
            found.append(row)
        found += [f for f in (row.get("batch"), row["graph"], *(row["step"] or {}).values())
                  if isinstance(f, dict) and "median_us" in f]
        found += [f for p in row["peers"] if "median_us" in p for f in (p, p.get("batch")) if f]
    return found


def failures(results: dict) -> list[str]:
    lines = []
    for row in results["rows"]:
        if row.get("failure"):
            lines.append(f"{row['kernel']} ({describe_scalars(row['scalars'])}): {row['failure']}")
        for check in row["checks"]:
            if not check["passed"]:
                lines.append(f"{row['kernel']} ({describe_scalars(check['scalars'])}): {check['param']} against the "
                             f"float64 reference: {check['failure']}")
    return lines


def batched(figure: dict | None) -> str:
    """A figure's batched median µs and % of copy bandwidth, or nothing where it has none."""
    batch = (figure or {}).get("batch")
    return f"{microseconds(batch)} ({batch['pct_copy_bw']:.1f}%)" if batch else ""


def peer_lines(row: dict) -> list[str]:
    """One line per timed peer: name, median µs, % copy bw, TFLOP/s, batched µs (% copy bw); the
    fastest marked (best)."""
    best = (row.get("best_peer") or {}).get("name")
    return [f"{p['name']}{' (best)' if p['name'] == best and len(row['peers']) > 1 else ''}: {microseconds(p)}, "
            f"{p['pct_copy_bw']:.1f}%, {p['tflops']:.3g}" + (f"; batched {batched(p)}" if p.get("batch") else "")
            for p in row["peers"] if "median_us" in p]


def print_results(results: dict, out: Console, err: Console) -> None:
    device, copy = results["device"], results["copy_bandwidth"]
    out.print(f"{device['name']} ({device['arch']}, driver {device['driver']}): device-to-device copy "
                  f"{copy['gbs']:.0f} GB/s (read + write); {results['iters']} timed runs per figure",
                  markup=False, highlight=False)
    table = []
    for row in results["rows"]:
        if not row["passed"]:
            timing = ["FAIL"] + [""] * 6
        elif row["median_us"] is None:
            timing = ["-"] + [""] * 6
        else:
            timing = [microseconds(row), f"{row['p10_us']:.2f}-{row['p90_us']:.2f}", f"{row['gbs']:.1f}",
                      f"{row['tflops']:.3g}", f"{row['pct_copy_bw']:.1f}%", batched(row),
                      microseconds(row["graph"]) if row["graph"] else ""]
        table.append([row["kernel"], describe_scalars(row["scalars"]), *timing, "\n".join(peer_lines(row))])
    print_table("", ["kernel", "scalars", "median µs", "p10-p90 µs", "GB/s", "TFLOP/s", "% copy bw",
                     f"batched µs ({CALLS_PER_EVENT} an event)", "graph µs",
                     "peer: median µs, % copy bw, TFLOP/s; batched"], table, out)
    steps = [row for row in results["rows"] if row.get("step") and row["median_us"] is not None]
    if steps:
        table = []
        for row in steps:
            step, wall = row["step"], row["step"]["wall_us"]
            table.append([row["kernel"], describe_scalars(row["scalars"]), f"{step['launches']} ({step['kernels']} kernels)",
                          microseconds(row, 1), microseconds(step["one_by_one"], 1), microseconds(step["graph"], 1),
                          f"{wall['kernel']:.1f} / {wall['one_by_one']:.1f} / {wall['graph']:.1f}",
                          f"{step['one_by_one']['median_us'] / row['median_us']:.2f}x"])
        print_table("the same work as separate kernels (the kind's separate_step)",
                    ["kernel", "scalars", "launches", "one launch µs", "separate µs", "separate, graph µs",
                     "wall µs a call (one launch / separate / graph)", "separate ÷ one launch"], table, out)
    fits = results["fits"]  # run_bench's size_fits
    if fits:
        table = []
        for fit in fits:
            sizes = "; ".join(describe_scalars(s) or kernel for kernel, s in zip(fit["kernels"], fit["scalars"]))
            for name, line in [(fit["kernel"], fit), *((f"  peer {n}", p) for n, p in fit["peers"].items())]:
                cells = [f"{f['fixed_us']:.2f} + {f['gbs']:.0f} ({f['pct_copy_bw']:.1f}%)" if f else ""
                         for f in (line["per_run"], line["batched"])]
                worst = max(f["worst_residual"] for f in (line["per_run"], line["batched"]) if f)
                table.append([name, sizes if line is fit else "", *cells, f"{worst:.1%}"])
        print_table("fixed cost and streaming rate: a least-squares line through each kernel's times against its "
                    "bytes", ["kernel", "sizes", "per run: fixed µs + GB/s (% copy bw)",
                              "batched: fixed µs + GB/s (% copy bw)", "worst residual"], table, out)
    if "tune" not in results:  # --tune ranks its variants against the spec's config itself (tune.print_tune)
        print_variants(results.get("variants", []), out)
    notes = sorted({note for row in results["rows"] for note in row["notes"]})
    if any(figure.get("host_bound") for figure in timed_figures(results)):
        notes.append(HOST_BOUND_NOTE)
    for note in notes:
        err.print(f"note: {note}", markup=False, highlight=False)


def fusion_comparisons(rows: list[dict]) -> list[dict]:
    """Each fused norm + GEMV row against the first plain GEMV row of the same config (its norm's
    eps aside: shapes, pdl and tuning) and runtime scalars: per figure ("median": per run, "batch")
    its time ratio and whether it is within FUSION_BOUND, or why there is none."""
    def key(row):
        return {name: value for name, value in row["config"].items() if name != "eps"}, row["scalars"]

    comparisons = []
    for fused in rows:
        plain = next((row for row in rows if row["kind"] == FUSED_GEMVS.get(fused["kind"]) and key(row) == key(fused)),
                     None)
        if plain is None:
            continue
        figures = {}
        for figure in ("median", "batch"):
            fused_us, plain_us = figure_us(fused, figure), figure_us(plain, figure)
            if not (fused["passed"] and plain["passed"]):
                figures[figure] = {"status": "kernel failed its check", "met": False}
            elif not (fused_us and plain_us):
                figures[figure] = {"status": "not timed", "met": None}
            else:
                figures[figure] = {"ratio": fused_us / plain_us, "fused_us": fused_us, "plain_us": plain_us,
                                   "met": fused_us / plain_us <= FUSION_BOUND}
        comparisons.append({"fused": fused, "plain": plain, "figures": figures})
    return comparisons


def print_variants(variants: list[dict], console: Console) -> None:
    """variant_comparisons' rows as a table (nothing where no row has a variant)."""
    if not variants:
        return
    table = []
    for variant in variants:
        changes = " ".join(f"{name}={json.dumps(value)}" for name, value in variant["changes"].items())
        table.append([variant["kernel"], describe_scalars(variant["scalars"]), variant["baseline"], changes,
                      f"{variant['per_run']:.3f}", f"{variant['batched']:.3f}" if "batched" in variant else "",
                      variant["verdict"]])
    print_table("variants: time as a ratio to the row each varies (of the same kind, scalars and shapes, the longest "
                "prefix of its name; below 1: faster)", ["kernel", "scalars", "against", "changes", "per run",
                                                          "batched", "verdict"], table, console)


def write_json(path: Path, results: dict, what: str = "--json") -> None:
    write_file(path, (json.dumps(results, indent=2) + "\n").encode(), what)


class _Recorded(BaseModel):
    """A part of a results file as new_row and bench write it: the fields its readers use, checked
    for type (strict: "3" is no number); the others are kept as they are."""

    model_config = ConfigDict(extra="allow", strict=True)


Median = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0)]


class _Figure(_Recorded):
    median_us: Median | None = None  # None: not timed


class _Peer(_Figure):
    name: str
    batch: _Figure | None = None


class _Row(_Figure):
    kernel: str
    kind: str
    config: dict
    scalars: dict[str, int]
    passed: bool
    median_us: Median | None  # present in every row, null where not timed
    batch: _Figure | None = None
    graph: _Figure | None = None
    peers: list[_Peer] = []


class _Occupancy(_Recorded):
    ctas_per_sm: int
    model_ctas_per_sm: int
    registers: int
    model_registers: int
    static_shared: int
    model_static_shared: int
    model_limiter: str


class _ModelRow(_Row):
    """What bench/model_check.py reads of a row besides."""

    peers: list[_Peer]
    bytes: Count
    flops: Count
    occupancy: _Occupancy | None = None


class _Results(_Recorded):
    rows: list[_Row]
    planned_rows: Count | None = None


class _Device(_Recorded):
    name: str


class _Copy(_Recorded):
    gbs: Median


class _ModelResults(_Results):
    rows: list[_ModelRow]
    device: _Device
    copy_bandwidth: _Copy


def read_results(path: Path, model: bool = False) -> dict | None:
    """A `ptxgen bench --json` file (what write_json wrote), or None for JSON of another kind (a
    lease folder also holds timelines and whole-model rows); a file that cannot be read, is not
    JSON or lacks what its readers use (variants.py; with `model`, bench/model_check.py) is
    refused (PtxgenError) naming the first such field."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise PtxgenError(f"{path}: cannot read: {error.strerror or error}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise PtxgenError(f"{path}: not a JSON file: {error}") from None
    if not (isinstance(data, dict) and isinstance(data.get("rows"), list)):
        return None
    try:
        (_ModelResults if model else _Results).model_validate(data)
    except ValidationError as error:
        problem = error.errors(include_url=False)[0]
        where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in problem["loc"]).lstrip(".")
        why = "Input should be an object" if problem["type"] == "model_type" else problem["msg"]
        got = "" if problem["type"] == "missing" else f" (got {problem['input']!r})"
        raise PtxgenError(f"{path}: not a whole `ptxgen bench --json` file: {where}: {why}{got}") from None
    return data


def require_matplotlib() -> None:
    if importlib.util.find_spec("matplotlib") is None:
        raise PtxgenError("--plot needs matplotlib: pip install 'ptxgen[plot]' (or pip install matplotlib)")


def plot(path: Path, results: dict) -> None:
    """Roofline-style chart: achieved TFLOP/s against flop/byte, under the measured copy bandwidth."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    copy_gbs = results["copy_bandwidth"]["gbs"]
    points = []  # (intensity, TFLOP/s, label, is_peer)
    for row in results["rows"]:
        if row["median_us"] is None or row["flops"] <= 0 or row["bytes"] <= 0:
            continue
        intensity = row["flops"] / row["bytes"]
        label = f"{row['kernel']} {describe_scalars(row['scalars'])}".strip()
        points.append((intensity, row["tflops"], label, False))
        points += [(intensity, p["tflops"], f"{p['name']} ({row['kernel']})", True)
                   for p in row["peers"] if "tflops" in p]
    figure, axes = plt.subplots(figsize=(10, 6.5))
    if points:
        low = min(p[0] for p in points) / 2
        high = max(p[0] for p in points) * 2
        xs = np.geomspace(low, high, 64)
        axes.plot(xs, xs * copy_gbs / 1e3, color="gray", label=f"measured copy bandwidth, {copy_gbs:.0f} GB/s")
        for intensity, tflops, label, is_peer in points:
            axes.scatter([intensity], [tflops], marker="x" if is_peer else "o",
                         color="tab:orange" if is_peer else "tab:blue")
            axes.annotate(label, (intensity, tflops), fontsize=7, xytext=(4, 2), textcoords="offset points")
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("arithmetic intensity (flop per byte of the traffic() model)")
    axes.set_ylabel("achieved TFLOP/s")
    axes.set_title(f"ptxgen (o) and peers (x) on {results['device']['name']}")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(loc="upper left")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=130, bbox_inches="tight")
    plt.close(figure)
    write_file(path, buffer.getvalue(), "--plot")
