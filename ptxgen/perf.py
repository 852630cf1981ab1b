"""A performance model that needs no GPU: occupancy, instructions per byte, issue-bound time and
bytes in flight against Little's law for one kernel launch on a chosen GPU, and a verdict.

Everything is computed from plain values: the PTX text and launch geometry, the resources ptxas
reported per arch (the manifest's `cubins`), the bytes the kind's traffic model moves, and a
`Gpu`. Instructions are PTX instructions executed by the CPU interpreter; the SASS ptxas makes
of them differs (`sass_counts` counts it offline when the optional nvdisasm wheel is installed).

The time model has five terms, all in microseconds:
- bandwidth: traffic bytes / the GPU's copy bandwidth (the floor);
- issue: warp-instructions / (SMs x 4 schedulers x 1 instruction a cycle x clock);
- special functions: the executed ex2, lg2, rcp, rsqrt, sin, cos ... .approx warp-instructions x 32
  / (16 results a clock an SM x SMs x clock) (SFU_RESULTS_PER_CYCLE): a softmax's exponentials, 1/512
  of a d128 attention tile's matrix FLOPs, take about half its matrix time at these rates;
- tensor: the matrix FLOPs the executed mma.sync and wgmma instructions do (tensor_flops_of: the
  work the kernel really does, masked tiles and a ones block for row sums included) / the GPU's
  dense f16 rate (datasheet; 8-bit operands at twice it). mma.sync is priced at wgmma's rate, a
  floor on sm_90. Without these two terms the sm_90a prefill at 4k tokens on an H100 was priced
  at 61-90 us, under its 139 us compute roofline; with them 153-310 us, where 303 us was measured
  (2026-11-27). On the H200 of 2026-11-28 every sm_90a prefill row, ping-pong and persistent
  included, sat within 10% of the serialized end (274.59 us at 4k against 149.25..298.23): its
  exponentials, matrix work and issue did not overlap
  (bench/results/H200-2026-11-28-lease/model_check_prefill.txt);
- latency: each warp waits `rounds` dependent DRAM round trips (a round: global loads, or
  atomics that return a value, issued together and waited for together; a memory fence waits
  for every one in flight, so loads issued ahead of it overlap nothing after it), and each SM runs
  ceil(CTAs / (SMs x resident CTAs)) generations of CTAs one after another;
- tail: work that comes after the rest of the grid is done ends the launch, on top of either
  estimate below. Where the kind declares a dependent tail (Kind.dependent_tail: a split-KV
  count-in and merge), it is its steps one after another: each declared round trip at the GPU's latency
  (a release waiting for the CTA's stores to be acknowledged, an atomic, the last CTA's loads of
  the partials; the L2 holds what they touch, but L2 latency is not measured on these GPUs, so the
  one round-trip figure the model has is used), plus the instructions only the slowest warp
  executes (the merge; counted by the interpreter over a sample holding a whole group of CTAs,
  paths that split CTAs counted whole) at one every max(4 cycles, the CTA's warps per scheduler):
  4 cycles is the CUDA C++ Programming Guide's dependent-issue latency of most arithmetic
  instructions (Performance Guidelines, Multiprocessor Level; a floor for shuffles, ex2 and shared
  memory), the clock the GPU's. Rounds of the tail that every warp waits through leave the latency
  term. Cross-check, the ncu readings of bench/results/H100-2026-11-23-session3 at the same
  geometry (128 CTAs, one an SM): elapsed minus SM-active cycles (the all-SM average taken over
  the 128 with a CTA) is 9,178 cycles (6.2 us at 1.47 GHz) for decode attention at 8k keys
  (attn_t128) against 5,732 (3.6 us at 1.58 GHz) for the Q4_K GEMV g12288_default: 2.6 us more of
  the launch with most SMs empty; the tail here is 2.2 us for that row (2.4 us at 1.47 GHz). It
  does not explain the recorded decode attention below 8k keys, 1.6-3.8 us above the serialized
  estimate: not modelled (bench/model_check.py lists those rows). Nor deeper rings: a
  cp.async.wait_group N leaves its N newest groups in flight here, so 3-4 stages cost fewer
  rounds, but on the H100 (attn_sweep.json of 2026-11-23) they measured slower than 2 at every
  length (3 stages at 32k keys: 64.37 us, above the serialized 61.28, against 2 stages' 58.14):
  with two CTAs an SM they put 68 KB a SM in flight where 34 KB already streamed at 95% of copy,
  and nothing here prices too many bytes in flight.
  A persistent decoder declares its grid barriers (2 round trips each: the last arrival's
  fence, its add reaching the word and a waiter's poll) and each layer's count-in; polls of
  synchronisation words (relaxed, acquire or volatile loads) are not load rounds, since how
  often a spinning thread polls follows the schedule, not the work. Loads a step has in flight
  (TailStep.overlapped_bytes: the decoder's next phase's first weights, issued before the
  barrier's wait) stream while it runs: their time, up to the step's round trips, leaves the
  bandwidth term.
  Without a declared tail, the tail is the rounds only some warps wait through, from the PTX
  alone: (critical rounds - mean rounds) x latency.
A kind too large to interpret is counted at smaller configs that repeat its work and
extrapolated (Kind.model_scaling: a persistent decoder's one layer and two-layer configs; a
single-matrix GEMV's CTAs, a few of them with one round of rows and with two). A grid
too large is counted on its first CTAs and scaled, by their number, or where the kind says its
CTAs' work differs (Kind.cta_work: a causal prefill's query blocks) by all the work over theirs;
the report then adds how evenly that work is dealt: the CTAs list-scheduled in dispatch order over
the resident CTA slots, the makespan over the larger of an even spread and the longest CTA
(dispatch_balance: what the order costs), and the longest CTA over an even spread (what no order
can win back: one CTA's chain of dependent tiles; a causal prefill at 1k tokens, whose grid is one
wave). Their product (`compute_factor`: the busiest slot's makespan over an even spread) scales the
terms of the SM's own throughputs (issue, tensor, special functions), which spread the work
evenly; the bytes' and latency terms stay as they are. On the H200 of 2026-11-28 it took the
mma.sync prefill at 1k tokens (45.34 us measured; longest CTA 1.75x an even share) from
10.54..36.98 to 18.47..53.85 us.
If the warps of an SM overlap perfectly, the time is the largest of the terms before the tail plus
the tail ("overlapped"); if they issue their loads together, wait together and compute
together (a CTA barrier, or few rounds per warp, keeps them in step), the terms add
("serialized"). Beside them, Little's law: the
global-load bytes a thread has in flight when it waits x resident threads, against bandwidth x
latency / SMs. Copies that complete on an mbarrier (an sm_90a producer's cp.asyncs handed over
with cp.async.mbarrier.arrive, its bulk and tensor copies) are waited for by other threads (the
consumers' mbarrier waits), which a thread's data flow does not follow: they leave the thread's
count where it hands them over, and the kind states what a CTA keeps in flight that way
(Kind.ring_bytes: the sm_90a prefill's K and V stages, at most all of them being filled; the
consumers' wait for the first stages, a round trip a CTA generation, is not counted). Before
that, the cp.async prefill's count kept every copy in flight for good (1440 KB an SM at 4k tokens
on the H200, more than its shared memory) and the tma prefill's read 0. Both estimates add the
GPU's fixed cost of a launch (`launch_us`, what back-to-back timing of the smallest kernels leaves
beyond this model: 3.9 us on the H100, see LAUNCH_NOTE; omitted, and said so, where not
measured). There is no term for L2 hits.
"""

from __future__ import annotations

import heapq
import math
import re
import subprocess
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Mapping

import numpy as np

from .archs import ARCHS, Arch
from .assemble import wheel_binary
from .errors import PtxgenError
from .interp import launch as interpret
from .interp.parser import TYPES, Addr, Imm, Neg, Pair, Reg, Vec, parse
from .abi import Launch, round_up
from .compiled import CompiledKernel
from .kernels.base import MAX_COUNTED_BYTES, DependentTail, ModelScaling
from .runner import prepare_arrays


# --- GPUs -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Gpu:
    name: str
    arch: str
    sms: int
    clock_ghz: float  # SM clock the issue-bound time assumes
    datasheet_gbs: float  # DRAM bandwidth, datasheet
    copy_gbs: float | None  # measured device-to-device copy, (read + write) / time; None: not measured
    latency_ns: float  # DRAM latency under load, for Little's law and each dependent round trip
    launch_us: float | None  # fixed cost of a launch in back-to-back timing; None: not measured
    sources: str
    # Dense f16/bf16 matrix rate with f32 accumulation, datasheet TFLOP/s; None: not stated here.
    tensor_tflops: float | None = None

    @property
    def bandwidth_gbs(self) -> float:
        """What a streaming kernel can reach: the measured copy rate where there is one."""
        return self.copy_gbs or self.datasheet_gbs

    @property
    def bytes_in_flight_needed(self) -> float:
        """Per SM, by Little's law: bandwidth x latency / SMs."""
        return self.bandwidth_gbs * self.latency_ns / self.sms


LAUNCH_NOTE = ("the H100 bench of 2026-11-23 (bench/results/NVIDIA-H100-80GB-HBM3-2026-11-23.json) timed "
               "its five smallest kernels (rope, kv_append, residual_add, swiglu: 2-100 KB) at 4.26-4.74 us "
               "a launch back to back, 3.7-4.1 us above this model's 0.6-0.65 us for them; 3.9 us is their "
               "median: the gap between launches, a grid's start and its end")
# Programmatic dependent launch bought nothing back to back on the H100 (bench/results/
# H100-2026-11-27-lease): Q4_K 4096 x 4096 9.38 us with it, 9.14 without; decode attention 16.59 /
# 22.91 / 57.79 us with it at 4k / 8k / 32k keys, 16.75 / 22.66 / 57.55 without. Both fill every
# SM's registers (one and two CTAs an SM), so the next grid's CTAs cannot start beside them; and
# each run was followed by a CUDA event, which waits for the whole grid. Batched (ten runs between
# two events) it does pay: on the H200 of 2026-11-28 4096 x 4096 took 5.38 us with PDL and 6.81
# without, decode attention 11.84 / 16.02 / 41.21 us against 13.57 / 17.96 / 42.62 at 4k / 8k / 32k
# keys; per run nothing again. launch_us is the per-run cost, so the model keeps pricing both alike.
PDL_NOTE = "a PDL launch is costed as a plain one (measured: no gain back to back on the H100, 2026-11-27)"
TENSOR_NOTE = ("989 TFLOP/s dense f16/bf16 matrix rate, datasheet (wgmma's; mma.sync is priced at it too, "
               "a floor: not measured apart here)")
LATENCY_NOTE = ("latency 600 ns: assumed (issue 12's 600-800 ns under load, the low end); not measured "
                "on this GPU")
GPUS = {
    gpu.name: gpu
    for gpu in (
        Gpu("h100-sxm", "sm_90", 132, 1.98, 3350, 2991, 600, 3.9,
            "H100 SXM5 80GB: 132 SMs; 1.98 GHz, NVIDIA's published maximum SM boost clock, which an "
            "unlocked bench may reach (its clock was not recorded), while Nsight Compute locks the base "
            "clock (1.56-1.58 GHz in shared/measurements/H100-2026-11-23); HBM3 3.35 TB/s datasheet; "
            "copy 2991 GB/s measured there; " + LATENCY_NOTE + "; launch 3.9 us: " + LAUNCH_NOTE + "; " + PDL_NOTE
            + "; " + TENSOR_NOTE, tensor_tflops=989.0),
        Gpu("h200", "sm_90", 132, 1.98, 4800, 4226, 600, None,
            "H200 SXM 141GB: 132 SMs, 1.98 GHz published maximum boost; HBM3e 4.8 TB/s datasheet; copy "
            "4223-4229 GB/s measured there (bench/results/H200-2026-11-28-lease, 4226 the median); "
            + LATENCY_NOTE + "; launch cost not measured; " + TENSOR_NOTE, tensor_tflops=989.0),
        Gpu("a100-80gb", "sm_80", 108, 1.41, 2039, None, 600, None,
            "A100 SXM4 80GB: 108 SMs, 1.41 GHz boost, HBM2e 2039 GB/s datasheet, 312 TFLOP/s dense f16 matrix "
            "datasheet; copy not measured; " + LATENCY_NOTE + "; launch cost not measured", tensor_tflops=312.0),
        Gpu("l40s", "sm_89", 142, 2.52, 864, None, 600, None,
            "L40S: 142 SMs, 2.52 GHz boost, GDDR6 864 GB/s datasheet; copy not measured; " + LATENCY_NOTE
            + "; launch cost not measured"),
        Gpu("rtx4090", "sm_89", 128, 2.52, 1008, None, 600, None,
            "GeForce RTX 4090: 128 SMs, 2.52 GHz boost, GDDR6X 1008 GB/s datasheet; copy not measured; "
            + LATENCY_NOTE + "; launch cost not measured"),
    )
}
DEFAULT_GPU = "h100-sxm"
SCHEDULERS_PER_SM = 4  # each issues at most one warp-instruction a cycle (sm_80 .. sm_120)
# Cycles before a warp can issue an instruction that needs the previous one's result: "typically 4
# clock cycles" for most arithmetic instructions (CUDA C++ Programming Guide, Performance
# Guidelines, Multiprocessor Level, said of compute capability 7.x; taken for 8.x and 9.0 too). A
# floor: shuffles, ex2, shared memory and barriers take longer.
DEPENDENT_ISSUE_CYCLES = 4


def gpu_named(name: str) -> Gpu:
    if name not in GPUS:
        raise PtxgenError(f"--gpu: expected one of {', '.join(GPUS)}, got {name!r}")
    return GPUS[name]


def arch_limits(name: str) -> Arch:
    """The residency limits of an arch; sm_90a (and other feature suffixes) share sm_90's."""
    return ARCHS[name.rstrip("af")]


# --- occupancy ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Occupancy:
    ctas_per_sm: int
    warps_per_sm: int
    fraction: float  # of the arch's maximum resident warps
    limiter: str  # registers | shared | warps | ctas (the first of them that binds)
    ctas_allowed: dict  # resident CTAs per SM each resource alone allows


def occupancy(arch: Arch, threads_per_cta: int, registers_per_thread: int, shared_per_cta: int) -> Occupancy:
    """Resident CTAs per SM by the rules of CUDA's occupancy calculator. `shared_per_cta` is
    static + dynamic bytes. Shared memory is counted against the largest carve-out (the driver
    picks a smaller one when that loses no CTA, so Nsight Compute's "Block Limit Shared Mem" can
    be lower than ours without lowering the occupancy)."""
    warps = -(-threads_per_cta // 32)
    per_partition = arch.registers_per_sm // arch.sub_partitions // arch.warp_registers(registers_per_thread)
    fits = arch.fits_registers(threads_per_cta, registers_per_thread)
    shared = round_up(shared_per_cta + arch.reserved_shared_per_cta, arch.shared_granularity)
    allowed = {
        "registers": per_partition * arch.sub_partitions // warps if fits else 0,
        "shared": arch.shared_per_sm // shared
        if shared <= arch.max_shared_per_cta + arch.reserved_shared_per_cta else 0,
        "warps": arch.max_warps_per_sm // warps if threads_per_cta <= arch.max_threads_per_cta else 0,
        "ctas": arch.max_ctas_per_sm,
    }
    ctas = min(allowed.values())
    limiter = next(name for name, value in allowed.items() if value == ctas)
    return Occupancy(ctas, ctas * warps, ctas * warps / arch.max_warps_per_sm, limiter, allowed)


# --- global loads in the PTX: what a thread keeps in flight ------------------------------------

# Unpacking a loaded vector (mov, cvt) is not a use: ptxas issues every load of a block first and
# moves such copies to where their results are needed.
COPIES = {"mov", "cvt"}
NO_DESTINATION = {"st", "bar", "barrier", "bra", "ret", "exit", "red", "membar", "fence", "cp", "prefetch",
                  "prefetchu", "trap", "nanosleep"}


def _registers(operand) -> set[int]:
    if isinstance(operand, Reg):
        return {operand.id}
    if isinstance(operand, Neg):
        return {operand.reg.id}
    if isinstance(operand, Pair):  # `a|p`, either half may be a sink `_`
        return _registers(operand.first) | _registers(operand.second)
    if isinstance(operand, Vec):
        return set().union(*(_registers(item) for item in operand.items))
    if isinstance(operand, Addr) and isinstance(operand.base, Reg):
        return {operand.base.id}
    return set()


def _reads_writes(ins) -> tuple[set, set]:
    operands = ins.operands
    writes = set() if ins.base in NO_DESTINATION or not operands else _registers(operands[0])
    if writes and not isinstance(operands[0], Addr):
        operands = operands[1:]
    reads = set().union(*(_registers(op) for op in operands)) if operands else set()
    if ins.guard is not None:
        reads.add(ins.guard[0])
    return reads, writes


def _loaded(ins) -> dict:
    """Global-load bytes this instruction puts in flight, by what a later wait is on: each
    destination register, or for cp.async (global to shared) a key of its own; none for a bulk
    copy, which completes on an mbarrier (Kind.ring_bytes). An atomic that
    returns a value is a round trip too (its bytes: the value). A relaxed, acquire or volatile
    load is a poll of a synchronisation word (a grid barrier's generation), whose repetitions
    follow the schedule rather than the work: not counted (a kind's DependentTail holds it)."""
    if ins.base == "ld" and {"relaxed", "acquire", "volatile"} & set(ins.mods):
        return {}
    if ins.base in ("ld", "atom") and "global" in ins.mods:
        size = next(TYPES[m][0] for m in reversed(ins.mods) if m in TYPES)
        return {reg: size for reg in _registers(ins.operands[0])}
    if ins.base == "cp" and ins.mods[:1] == ["async"] and "global" in ins.mods and "bulk" not in ins.mods:
        size = next((op.value for op in ins.operands[2:] if isinstance(op, Imm)), 16)
        return {("cp.async", ins.index, 0): size}
    return {}


# A copy's key is ("cp.async", instruction, groups committed since it was issued): 0 while its
# group is open, 1 in the newest committed group, .. up to this cap (more than any wait_group's N).
GROUP_AGE_CAP = 8


def _committed(state) -> frozenset:
    """The keys in flight after a cp.async.commit_group: every copy a group older."""
    return frozenset((k[0], k[1], min(k[2] + 1, GROUP_AGE_CAP)) if isinstance(k, tuple) else k for k in state)


def _size_key(key):
    return key[:2] if isinstance(key, tuple) else key


def _successors(ins, count: int) -> list[int]:
    if ins.base == "bra":
        return [ins.target] if ins.guard is None else [ins.target, ins.index + 1]
    if ins.base in ("ret", "exit") and ins.guard is None:
        return []
    return [ins.index + 1] if ins.index + 1 < count else []


@dataclass(frozen=True)
class LoadRounds:
    starts: tuple[int, ...]  # global loads issued while nothing is in flight: each opens a round
    waits: dict  # instruction index -> global-load bytes a thread has in flight when it waits there


def load_rounds(program) -> LoadRounds:
    """Static data flow over the PTX: which global loads are in flight at each instruction. The
    first use of any of them waits, and by then the ones issued with it have arrived too (one
    thread's requests see about the same latency), so a use empties the set; but a
    cp.async.wait_group N leaves the copies of the N newest committed groups in flight (a ring's
    tiles ahead of the one it waits for)."""
    code = program.instructions
    effects = [(*_reads_writes(ins), _loaded(ins)) for ins in code]
    pending = [None] * len(code)  # keys in flight on entry (union over paths), None = unreached
    pending[0] = frozenset()
    sizes, work = {}, [0]
    while work:
        index = work.pop()
        reads, writes, loaded = effects[index]
        state = pending[index]
        if code[index].base in COPIES and reads & state:
            state = state | writes  # the copies are in flight with the loads they copy
            sizes.update({reg: sizes.get(reg, 0) for reg in writes})
        elif code[index].base == "cp" and code[index].mods == ["async", "commit_group"]:
            state = _committed(state)
        elif code[index].base == "cp" and code[index].mods[:2] == ["async", "mbarrier"]:
            # cp.async.mbarrier.arrive: the thread's copies are the mbarrier's now, whose waiters
            # are other threads (Kind.ring_bytes counts them), not its own
            state = frozenset(k for k in state if not isinstance(k, tuple))
        else:
            state = (_after_wait(code[index], reads, state) - writes) | loaded.keys()
        sizes.update({_size_key(key): size for key, size in loaded.items()})
        for successor in _successors(code[index], len(code)):
            merged = state if pending[successor] is None else pending[successor] | state
            if merged != pending[successor]:
                pending[successor] = merged
                work.append(successor)
    waits = {i: sum(sizes[_size_key(k)] for k in pending[i]) for i, ins in enumerate(code)
             if pending[i] and _waits(ins, effects[i][0], pending[i])}
    # A round is a thread's: loads it waits for somewhere (not copies it hands to an mbarrier).
    waited = {_size_key(k) for i in waits for k in pending[i]}
    starts = tuple(i for i, (reads, _, loaded) in enumerate(effects)
                   if loaded and pending[i] is not None and not _after_wait(code[i], reads, pending[i])
                   and any(_size_key(k) in waited for k in loaded))
    return LoadRounds(starts, waits)


def _after_wait(ins, reads: set, state) -> frozenset:
    if not _waits(ins, reads, state):
        return state
    if ins.base == "cp" and ins.mods[:2] == ["async", "wait_group"]:  # the newer groups stay in flight
        newest = _group_depth(ins)
        return frozenset(k for k in state if isinstance(k, tuple) and k[2] <= newest)
    return frozenset()


def _group_depth(ins) -> int:
    """N of a cp.async.wait_group N."""
    return next(op.value for op in ins.operands if isinstance(op, Imm))


def _waits(ins, reads: set, state) -> bool:
    """Whether `ins` stalls on a load in flight: cp.async.wait_all on any copy, cp.async.wait_group
    N on one of a group older than the N newest committed ones. A memory fence (fence.sc / fence.acq_rel, membar; not a proxy or mbarrier_init fence) waits
    for every one: it holds the warp until its earlier accesses are performed, so loads issued
    ahead of it (a next task's) no longer overlap what follows it."""
    if not state or ins.base in COPIES:
        return False
    if ins.base == "cp" and ins.mods[:2] == ["async", "wait_all"]:
        return any(isinstance(key, tuple) for key in state)
    if ins.base == "cp" and ins.mods[:2] == ["async", "wait_group"]:
        return any(isinstance(key, tuple) and key[2] > _group_depth(ins) for key in state)
    if ins.base == "membar" or (ins.base == "fence" and {"sc", "acq_rel"} & set(ins.mods)):
        return True
    return bool(reads & state)


# --- executed instructions --------------------------------------------------------------------

# Larger grids are sampled: the interpreter runs about 1e8 thread-instructions a second, and a
# prefill attention CTA alone executes 3.5e6.
MAX_COUNTED_THREADS = 1 << 14
# A sample weighted by the CTAs' work (Kind.cta_work) stops at this many times the largest CTA's
# work: a persistent prefill CTA walks 8 query blocks at 4k tokens, and 56 of them (the thread
# budget) took show 2 m 17 s where the first 8 scale as well (their blocks are dealt forward and
# back, each CTA a mix of heavy and light).
SAMPLED_WORK = 8
# dispatch_balance list-schedules at most this many CTAs (a Python loop: about a second)
MAX_DISPATCHED_CTAS = 1 << 20


# Count's figures of the whole launch (the others are a warp's: the mean or the slowest).
LAUNCH_TOTALS = ("thread_instructions", "warp_instructions", "tensor_flops", "sfu_instructions")


@dataclass(frozen=True)
class Count:
    thread_instructions: int  # PTX, whole grid (scaled when sampled)
    warp_instructions: int  # a warp issues once however many of its lanes take part
    rounds_per_warp: float  # dependent global-load round trips a warp waits through
    # Rounds of the slowest warp: a round start that only some warps reach counts whole (exact for
    # work a few CTAs do after the others, such as a last CTA's merge; more than the truth where
    # CTAs split between two paths that each load).
    critical_rounds: int
    # Global-load bytes a thread has in flight at the wait it reaches most often (the main loop's).
    outstanding_bytes: int
    instructions_per_warp: float  # warp-instructions of the mean warp
    # Of the slowest warp, counted like critical_rounds (an instruction only some warps reach counts whole).
    critical_instructions: int
    ctas_run: int
    ctas: int
    scaled: str = ""  # how the counts were extrapolated from smaller configs (Kind.model_scaling)
    weighted: bool = False  # scaled by the CTAs' work (Kind.cta_work), not their number
    # Matrix FLOPs the executed mma.sync / wgmma instructions do, in f16-rate units (tensor_flops_of).
    tensor_flops: int = 0
    # Warp-instructions of the special-function unit (SFU_OPS: ex2, lg2, rcp, rsqrt, sin, cos ...).
    sfu_instructions: int = 0

    @property
    def counted(self) -> str:
        if self.scaled:
            return self.scaled
        if self.ctas_run == self.ctas:
            return f"all {self.ctas} CTAs executed"
        if self.weighted:
            return (f"CTAs 0..{self.ctas_run - 1} of {self.ctas} executed, counts scaled by the work of all "
                    "over theirs (Kind.cta_work)")
        return (f"CTAs 0..{self.ctas_run - 1} of {self.ctas} executed, counts scaled by {self.ctas}/{self.ctas_run} "
                "(exact when the other CTAs repeat their work)")


    def extrapolated(self, steps: list[tuple[Count, float]], scaling: ModelScaling) -> Count:
        """These counts plus `times` x (count - these) for each of `steps`, the launch's totals
        then times its cta_scale; where its work is `dealt`, the slowest warp as far above the
        mean as in the last step (ModelScaling)."""
        def total(name: str):
            value = getattr(self, name) + sum(times * (getattr(count, name) - getattr(self, name))
                                              for count, times in steps)
            return value * scaling.cta_scale if name in LAUNCH_TOTALS else value

        summed = {name: total(name) for name in ("thread_instructions", "warp_instructions", "rounds_per_warp",
                                                 "critical_rounds", "instructions_per_warp", "critical_instructions",
                                                 "tensor_flops", "sfu_instructions")}
        if scaling.dealt and steps:
            last = steps[-1][0]
            summed["critical_rounds"] = summed["rounds_per_warp"] + last.critical_rounds - last.rounds_per_warp
            summed["critical_instructions"] = (summed["instructions_per_warp"] + last.critical_instructions
                                               - last.instructions_per_warp)
        # Bytes in flight at the wait reached most often: a decoder's busiest layer; a dealt
        # launch's main loop, which the last step runs most.
        outstanding = (steps[-1][0].outstanding_bytes if scaling.dealt and steps
                       else max([self.outstanding_bytes] + [count.outstanding_bytes for count, _ in steps]))
        rounded = {name: round(value) if isinstance(getattr(self, name), int) else value
                   for name, value in summed.items()}
        return replace(self, **rounded, scaled=scaling.note, outstanding_bytes=outstanding)


def count_instructions(ptx: str, entry: str, launch: Launch, args: list,
                       max_threads: int = MAX_COUNTED_THREADS, min_ctas: int = 1,
                       work: np.ndarray | None = None, tensor_maps: tuple = ()) -> Count:
    """Run the launch in the interpreter (sanitizer off; arrays in args are written) and count.
    A grid of more than `max_threads` threads runs only its first whole rows of CTAs (or first
    CTAs), at least `min_ctas` of them (a DependentTail's group), and scales the counts: by the
    CTAs' number, or where their `work` differs (Kind.cta_work) by all the work over what ran;
    a cooperative or any-grid launch always runs whole, since its CTAs wait for each other.
    `tensor_maps`: the variant's (abi.TensorMap), over arrays in args."""
    ctas = math.prod(launch.grid)
    threads = launch.threads_per_cta
    run = ctas
    if ctas * threads > max_threads and not (launch.cooperative or launch.any_grid):
        row = launch.grid[0]
        run = row * (max_threads // (row * threads)) or max(1, max_threads // threads)
        if work is not None:
            enough = int(np.searchsorted(np.cumsum(work), SAMPLED_WORK * float(work.max()))) + 1
            run = min(run, enough)
        run = min(ctas, max(run, min_ctas))
    stats = interpret(ptx, entry, launch.grid, launch.block, args, dynamic_shared=launch.dynamic_shared,
                      sanitize=False, max_ctas=run, tensor_maps=tensor_maps)
    program = parse(ptx, entry)
    rounds = load_rounds(program)
    warps_run = run * -(-threads // 32)
    scale = ctas / run if work is None else float(work.sum() / work[:run].sum())
    busiest = max(rounds.waits, key=lambda i: (stats.warps_at[i], rounds.waits[i]), default=None)
    return Count(
        thread_instructions=round(stats.thread_instructions * scale),
        warp_instructions=round(stats.warp_instructions * scale),
        rounds_per_warp=float(sum(stats.warps_at[i] for i in rounds.starts)) / warps_run,
        critical_rounds=sum(-(-int(stats.warps_at[i]) // warps_run) for i in rounds.starts),
        outstanding_bytes=rounds.waits[busiest] if busiest is not None else 0,
        instructions_per_warp=float(stats.warp_instructions) / warps_run,
        critical_instructions=sum(-(-int(warps) // warps_run) for warps in stats.warps_at),
        ctas_run=run,
        ctas=ctas,
        weighted=work is not None,
        tensor_flops=round(scale * sum(int(stats.warps_at[ins.index]) * tensor_flops_of(ins)
                                       for ins in program.instructions)),
        sfu_instructions=round(scale * sum(int(stats.warps_at[ins.index]) for ins in program.instructions
                                           if ins.base in SFU_OPS and "approx" in ins.mods)),
    )


# The approximate functions the special-function unit (MUFU) computes, at SFU_RESULTS_PER_CYCLE
# lane results a clock an SM: the CUDA C++ Programming Guide's throughput table for compute
# capability 8.x and 9.0 (reciprocal, reciprocal square root, base-2 logarithm and exponential,
# sine, cosine); FlashAttention-3's paper gives the H100 SXM5 3.9 TFLOPS of special functions,
# the same at 132 SMs and 1.83 GHz. A warp-instruction takes the unit for 32 results.
SFU_OPS = {"ex2", "lg2", "rcp", "rsqrt", "sin", "cos", "tanh", "sqrt"}
SFU_RESULTS_PER_CYCLE = 16


# Matrix operand types that run at a multiple of the f16/bf16 rate (Hopper and Ampere datasheets:
# 8-bit types twice it, tf32 half); f16 and bf16 run at 1.
TENSOR_RATE = {"s8": 2, "u8": 2, "e4m3": 2, "e5m2": 2, "tf32": 0.5}


def tensor_flops_of(ins) -> float:
    """The matrix FLOPs one warp's execution of `ins` does, in f16-rate units: 2 m n k for an
    mma.sync of one warp, a quarter of it for a wgmma (its warpgroup's four warps each execute
    it); 0 for anything else."""
    if ins.base not in ("mma", "wgmma") or (ins.base == "wgmma" and "mma_async" not in ins.mods):
        return 0
    shape = next((re.fullmatch(r"m(\d+)n(\d+)k(\d+)", m) for m in ins.mods if re.fullmatch(r"m\d+n\d+k\d+", m)), None)
    if shape is None:
        return 0
    m, n, k = (int(v) for v in shape.groups())
    types = [t for t in ins.mods if t in TYPES or t in TENSOR_RATE]  # D, A, B(, C): A's sets the rate
    operand = types[1] if len(types) > 1 else "f16"
    per_warp = 2 * m * n * k / (4 if ins.base == "wgmma" else 1)
    return per_warp / TENSOR_RATE.get(operand, 1)


@dataclass(frozen=True)
class SegmentCount:
    """A stretch of a kernel's code (between two labels), counted over one launch."""
    name: str
    rounds_per_warp: float  # dependent global-load rounds the mean warp opens there
    warp_instructions: int  # executed there, all warps


def segment_counts(ptx: str, entry: str, launch: Launch, args: list,
                   ends: list[tuple[str, str | None]]) -> list[SegmentCount]:
    """count_instructions split at labels, the whole grid run (sanitizer off; arrays in args are
    written): segment (name, label) holds the instructions from where the one before it ended up
    to that label's (None: the end of the code), for a kernel whose code runs its stretches in
    that order (a persistent decoder's phases, between the labels its barrier arrivals end at)."""
    program = parse(ptx, entry)
    text = ptx.splitlines()
    bounds = []
    for name, label in ends:
        if label is None:
            bounds.append(len(program.instructions))
            continue
        line = next((number for number, row in enumerate(text, 1) if row.strip() == f"{label}:"), None)
        if line is None:
            raise PtxgenError(f"{entry}: no label {label} in its PTX to end segment {name} at")
        bounds.append(next((ins.index for ins in program.instructions if ins.line > line), len(program.instructions)))
    stats = interpret(ptx, entry, launch.grid, launch.block, args, dynamic_shared=launch.dynamic_shared,
                      sanitize=False)
    starts = set(load_rounds(program).starts)
    warps_run = math.prod(launch.grid) * -(-launch.threads_per_cta // 32)
    counts, first = [], 0
    for (name, _), end in zip(ends, bounds):
        rounds = sum(int(stats.warps_at[i]) for i in range(first, end) if i in starts)
        counts.append(SegmentCount(name, rounds / warps_run, int(stats.warps_at[first:end].sum())))
        first = end
    return counts


# --- the model ----------------------------------------------------------------------------------

def issue_time_us(warp_instructions: int, gpu: Gpu) -> float:
    return warp_instructions / (gpu.sms * SCHEDULERS_PER_SM * gpu.clock_ghz * 1e3)


def bandwidth_floor_us(nbytes: int, gpu: Gpu) -> float:
    return nbytes / (gpu.bandwidth_gbs * 1e3)


def occupancy_per_arch(launches: Mapping[str, Launch], cubins: dict[str, dict]) -> dict[str, Occupancy]:
    """Each arch's occupancy for its launch (an arch-specific variant's CTA may differ), from the
    resources ptxas reported (`cubins`: arch -> `registers`, `shared_bytes` = static shared): no
    interpretation needed."""
    return {arch: cubin_occupancy(arch, launches[arch], res, cubin_arch=arch) for arch, res in cubins.items()}


def driver_static_shared(cubin_arch: str | None, section_bytes: int) -> int:
    """The static shared memory the driver reports (CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES) for a
    cubin of `cubin_arch` whose kernel's .nv.shared section holds `section_bytes` (the manifest's
    `shared_bytes`): from sm_90 on the section starts with the 1 KB the driver reserves a CTA,
    which `occupancy` adds itself (the H200 of 2026-11-28 reported 16 bytes for a 1040-byte
    section, 80 for a 1104-byte one). None: a figure the driver gave, as it is."""
    limits = ARCHS.get(cubin_arch) if cubin_arch else None
    if limits is not None and limits.reserve_in_section and section_bytes >= limits.reserved_shared_per_cta:
        return section_bytes - limits.reserved_shared_per_cta
    return section_bytes


def cubin_occupancy(limits_arch: str, launch: Launch, resources: dict, cubin_arch: str | None = None) -> Occupancy:
    """A cubin's CTA (ptxas's `registers` and static `shared_bytes`, the launch's threads and
    dynamic shared memory) under `limits_arch`'s limits. `cubin_arch`: the arch the cubin was
    assembled for, whose shared section may hold the driver's reserve (driver_static_shared);
    None where `shared_bytes` is the driver's own figure."""
    return occupancy(arch_limits(limits_arch), launch.threads_per_cta, resources["registers"],
                     driver_static_shared(cubin_arch, resources["shared_bytes"]) + launch.dynamic_shared)


def dispatch_balance(work: np.ndarray, slots: int) -> float:
    """How much longer the CTAs take than an even spread of their work over `slots` resident CTA
    slots: list scheduling in dispatch order (each CTA to the slot that frees first, the slots
    taken as equally fast: co-resident CTAs share their SM), its makespan over the larger of
    total / slots and the largest CTA. 1.0: balanced."""
    loads = [0.0] * max(1, min(slots, len(work)))
    for w in work.tolist():
        heapq.heapreplace(loads, loads[0] + w)
    return max(loads) / max(float(work.sum()) / slots, float(work.max()))


def dispatch_report(work: np.ndarray, slots: int) -> dict:
    """show's `dispatch`: what the order of CTAs of unequal work costs (dispatch_balance), the
    longest CTA over an even spread of all of it (what no order wins back), and the makespan in
    the work's own units (Kind.cta_work's: a prefill's key tiles), which compares two ways of
    cutting the same launch."""
    balance = dispatch_balance(work, slots)
    return {"slots": slots, "makespan_over_even": round(balance, 3),
            "longest_over_even": round(float(work.max()) * slots / float(work.sum()), 3),
            "makespan": round(balance * max(float(work.sum()) / slots, float(work.max())), 2)}


def evaluate(ptx: str, entry: str, launch: Launch, args: list, cubins: dict[str, dict], traffic_bytes: int,
             gpu: Gpu, *, cubin: bytes | None = None, max_threads: int = MAX_COUNTED_THREADS,
             tail: DependentTail | None = None, count: Count | None = None,
             launches: Mapping[str, Launch] | None = None, work: np.ndarray | None = None,
             arch: str | None = None, ring_bytes: int = 0) -> dict:
    """The model's report for one launch. `cubins`: arch -> resources as in the manifest
    (`registers`, `shared_bytes` = static shared); it must include `arch`, the cubin's that runs
    on the GPU (default the GPU's own; an sm_90 GPU runs an sm_90a cubin where the spec builds
    one: CompiledKernel.binary_for). With that `cubin` and nvdisasm installed, the report adds its
    SASS counts. `tail`: the
    kind's DependentTail at this launch, if it has one. `count`: the launch's counts, made
    elsewhere (scaled_count); else the interpreter runs it here. `launches`: each arch's launch
    for its occupancy, where they differ (default: `launch`, the GPU arch's). `work`: the CTAs'
    relative work where it differs (Kind.cta_work): the report adds how evenly they are dealt.
    `ring_bytes`: what a CTA keeps in flight in mbarrier-completed copies (Kind.ring_bytes)."""
    arch = arch or gpu.arch
    if arch not in cubins:
        raise PtxgenError(f"--gpu {gpu.name} is {gpu.arch}, which the spec does not build "
                          f"(archs: {', '.join(cubins)})")
    threads = launch.threads_per_cta
    occupancies = occupancy_per_arch(launches or {arch: launch for arch in cubins}, cubins)
    if count is None:
        count = count_instructions(ptx, entry, launch, args, max_threads, min_ctas=tail.group_ctas if tail else 1)
    # the cubin's resources under the GPU's own limits (an sm_89 GPU running the sm_80 cubin holds
    # 1536 threads an SM, not sm_80's 2048)
    here = cubin_occupancy(gpu.arch, launch, cubins[arch], cubin_arch=arch)
    ctas = math.prod(launch.grid)
    report = {
        "gpu": {**asdict(gpu), "bandwidth_gbs": gpu.bandwidth_gbs},
        "occupancy": {arch: round(o.fraction, 4) for arch, o in occupancies.items()},
        "occupancy_detail": {arch: asdict(o) for arch, o in occupancies.items()},
        "thread_instructions": count.thread_instructions,
        "warp_instructions": count.warp_instructions,
        "counted": count.counted,
        "bytes": traffic_bytes,
        "thread_instructions_per_byte": round(count.thread_instructions / traffic_bytes, 3) if traffic_bytes else None,
    }
    sass = sass_counts(cubin) if cubin is not None else None
    if sass is not None:
        report["sass"] = {**sass, "ptx_loop_bodies": ptx_loop_bodies(ptx, entry)}
    if here.ctas_per_sm == 0:
        return {**report, "verdict": f"cannot launch on {gpu.arch}: a CTA needs more {here.limiter} than an SM has"}
    # An SM holds at most its resident CTAs; a grid smaller than one wave spreads thinner.
    resident_ctas = min(here.ctas_per_sm, ctas / gpu.sms)
    in_flight = (count.outstanding_bytes * threads + ring_bytes) * resident_ctas
    generations = math.ceil(ctas / (gpu.sms * here.ctas_per_sm))
    if tail is None:
        rounds = count.rounds_per_warp
        tail_us = (count.critical_rounds - rounds) * gpu.latency_ns * 1e-3
        tail_note = f"{count.critical_rounds} rounds the slowest warp"
        streamed_us = 0.0
    else:
        rounds = count.rounds_per_warp - tail.counted_by_every_warp  # the tail's own rounds come after
        serial = count.critical_instructions - count.instructions_per_warp
        cycles = issue_interval_cycles(threads)
        tail_us = dependent_tail_us(tail.round_trips, serial, cycles, gpu)
        streamed_us = tail_streamed_us(tail, gpu)
        tail_note = (f"{tail.round_trips} dependent round trips + {serial:.0f} serial instructions at "
                     f"{cycles} cycles, after the stream" + (f", {streamed_us:.1f} us of bytes streamed through "
                                                             "them" if streamed_us else ""))
        report["dependent_tail"] = {"steps": [asdict(step) for step in tail.steps], "round_trips": tail.round_trips,
                                    "serial_instructions": round(serial, 1), "cycles_per_instruction": cycles,
                                    "streamed_us": round(streamed_us, 3)}
    floor = bandwidth_floor_us(traffic_bytes, gpu)
    times = {
        # What the tail streams (loads in flight through its round trips) leaves the bytes' time.
        "bandwidth": floor - streamed_us,
        "issue": issue_time_us(count.warp_instructions, gpu),
        "latency": generations * rounds * gpu.latency_ns * 1e-3,
        "tensor": count.tensor_flops / (gpu.tensor_tflops * 1e6) if gpu.tensor_tflops else 0.0,
        "sfu": count.sfu_instructions * 32 / (SFU_RESULTS_PER_CYCLE * gpu.sms * gpu.clock_ghz * 1e3),
    }
    dispatch = (dispatch_report(work, here.ctas_per_sm * gpu.sms) if work is not None
                and len(work) <= MAX_DISPATCHED_CTAS else None)
    if dispatch:
        # The SM's own throughputs (issue, matrix, special functions) spread the work evenly; CTAs of
        # unequal work end when the busiest resident slot does: its makespan over an even spread.
        spread = dispatch["makespan_over_even"] * max(1.0, dispatch["longest_over_even"])
        dispatch["compute_factor"] = round(spread, 3)
        times.update({term: times[term] * spread for term in ("issue", "tensor", "sfu")})
    overlapped, serialized = estimates(times, tail_us, gpu)
    report.update({
        "launch_us": gpu.launch_us,
        "bandwidth_floor_us": round(floor, 3),
        "issue_time_us": round(times["issue"], 3),
        "latency_time_us": round(times["latency"], 3),
        "tensor_time_us": round(times["tensor"], 3),
        "tensor_flops": count.tensor_flops,
        "sfu_time_us": round(times["sfu"], 3),
        "sfu_instructions": count.sfu_instructions,
        "tail_time_us": round(tail_us, 3),
        "rounds_per_warp": round(rounds, 3),
        "critical_rounds": count.critical_rounds,
        "generations": generations,
        "bytes_in_flight": {
            "per_thread": count.outstanding_bytes,
            "ring_per_cta": ring_bytes,
            "resident_threads_per_sm": round(threads * resident_ctas, 1),
            "per_sm": round(in_flight),
            "needed_per_sm": round(gpu.bytes_in_flight_needed),
        },
        "estimate_us": {"overlapped": round(overlapped, 3), "serialized": round(serialized, 3)},
        "percent_of_bandwidth": {"overlapped": round(100 * floor / overlapped, 1),
                                 "serialized": round(100 * floor / serialized, 1)},
        "verdict": verdict(times, floor, tail_us, tail_note, rounds, in_flight, gpu, declared_tail=tail is not None),
    })
    if dispatch:
        report["dispatch"] = dispatch
    return report


def evaluate_kernel(compiled: CompiledKernel, gpu: Gpu, *, resources: dict[str, dict] | None = None, seed: int = 0,
                    max_threads: int = MAX_COUNTED_THREADS, scalars: dict[str, int] | None = None) -> dict:
    """`evaluate` of a compiled kernel at `scalars` (default: its kind's example scalars, what
    `ptxgen show` reports), on the kind's sample inputs, with the kind's dependent tail there;
    a kind too large to interpret is counted at the smaller configs its model_scaling names.
    `resources` (arch -> registers / shared_bytes) defaults to what the assembler reported for
    each cubin. A variant made for programmatic dependent launch costs the same launch
    (PDL_NOTE)."""
    kind = compiled.definition
    scalars = kind.example_scalars() if scalars is None else scalars
    launch = compiled.launch(scalars, gpu.arch)
    if launch.empty:
        return {"scalars": scalars, "verdict": "no CTAs at these scalars"}
    scaling = kind.model_scaling()
    moved = kind.traffic(scalars).bytes
    if scaling is None and moved > MAX_COUNTED_BYTES:
        return {"scalars": scalars, "skipped": f"too large to interpret at these scalars ({moved:,} bytes a call; "
                                               f"the model counts calls of up to {MAX_COUNTED_BYTES:,})"}
    if resources is None:
        resources = {arch: dict(binary.resources) for arch, binary in compiled.binaries.items()}
    binary = compiled.binary_for(gpu.arch)
    count = (launch_count(compiled, gpu.arch, scalars, seed, max_threads) if scaling is None
             else scaled_count(scaling, gpu.arch, scalars, seed, max_threads))
    variant = compiled.variant(gpu.arch)
    running = compiled.definition_for(variant.target)  # the kind of the PTX the GPU runs
    return {"scalars": scalars, **evaluate(variant.ptx, compiled.name, launch, [], resources,
                                           kind.traffic(scalars).bytes, gpu,
                                           cubin=binary.cubin if binary is not None else None,
                                           max_threads=max_threads, tail=kind.dependent_tail(scalars), count=count,
                                           launches=arch_launches(compiled, scalars, resources),
                                           work=running.cta_work(scalars),
                                           arch=binary.arch if binary is not None else None,
                                           ring_bytes=running.ring_bytes())}


def arch_launches(compiled: CompiledKernel, scalars: Mapping[str, int], archs) -> dict[str, Launch]:
    """Each arch's cubin's launch at `scalars` (the PTX it was assembled from: an sm_90a
    variant's CTA may differ from the portable one's)."""
    compiled.check_scalars(scalars)
    return {arch: compiled.variants[compiled.binaries[arch].target].geometry.at(dict(scalars))
            if arch in compiled.binaries else compiled.launch(scalars, arch) for arch in archs}


def launch_count(compiled: CompiledKernel, arch: str, scalars: dict[str, int], seed: int, max_threads: int) -> Count:
    """count_instructions of a compiled kernel's launch at `scalars` on its kind's sample inputs
    (the sample holding a whole group of its DependentTail's CTAs)."""
    kind = compiled.definition
    tail = kind.dependent_tail(scalars)
    arrays = prepare_arrays(compiled, kind.sample_inputs(np.random.default_rng(seed), scalars), scalars)
    variant = compiled.variant(arch)
    return count_instructions(variant.ptx, compiled.name, compiled.launch(scalars, arch),
                              compiled.args(arrays, scalars), max_threads, min_ctas=tail.group_ctas if tail else 1,
                              work=compiled.definition_for(variant.target).cta_work(scalars),
                              tensor_maps=variant.tensor_maps)


def scaled_count(scaling: ModelScaling, arch: str, scalars: dict[str, int], seed: int, max_threads: int) -> Count:
    """The counts ModelScaling describes: its configs' launches counted at `scalars` (launch_count)
    and extrapolated (Count.extrapolated)."""
    from .pipeline import compile_kernel

    def counted(config) -> Count:
        return launch_count(compile_kernel(config, (arch,), until="ptx"), arch, scalars, seed, max_threads)

    return counted(scaling.base).extrapolated([(counted(config), times) for config, times in scaling.steps], scaling)


def issue_interval_cycles(threads_per_cta: int) -> int:
    """Cycles between two instructions of one warp of a CTA running alone on its SM: a warp waits
    DEPENDENT_ISSUE_CYCLES for the result it needs, and each scheduler issues one instruction a
    cycle for all of the CTA's warps it holds."""
    return max(DEPENDENT_ISSUE_CYCLES, math.ceil(math.ceil(threads_per_cta / 32) / SCHEDULERS_PER_SM))


def dependent_tail_us(round_trips: int, serial_instructions: float, cycles_per_instruction: int, gpu: Gpu) -> float:
    """A dependent tail's time: its round trips one after another at the GPU's latency, and the
    instructions only the slowest warp executes at one every `cycles_per_instruction`."""
    return round_trips * gpu.latency_ns * 1e-3 + serial_instructions * cycles_per_instruction / (gpu.clock_ghz * 1e3)


def tail_streamed_us(tail: DependentTail, gpu: Gpu) -> float:
    """The bytes' time a tail's steps stream while they run: each step's overlapped bytes at the
    GPU's bandwidth, up to the step's round trips at its latency."""
    return sum(min(step.round_trips * gpu.latency_ns * 1e-3, bandwidth_floor_us(step.overlapped_bytes, gpu))
               for step in tail.steps)


def estimates(times: dict, tail: float, gpu: Gpu) -> tuple[float, float]:
    """(overlapped, serialized) time in us: the largest term or their sum, plus the tail and the
    GPU's launch cost (0 where not measured)."""
    fixed = (gpu.launch_us or 0.0) + tail
    return max(times.values()) + fixed, sum(times.values()) + fixed


def verdict(times: dict, floor: float, tail: float, tail_note: str, rounds: float, in_flight: float, gpu: Gpu,
            declared_tail: bool = False) -> str:
    """One line naming the likely limiter and the range of bandwidth the model expects (`floor`:
    the bytes' time at full bandwidth, beside the bandwidth term, which is less what the tail
    streamed). A kind's declared dependent tail counts as latency against the issue time (its
    round trips left the latency term)."""
    launch = gpu.launch_us or 0.0
    overlapped, serialized = estimates(times, tail, gpu)
    needed = gpu.bytes_in_flight_needed
    tail_note = f" + tail {tail:.1f} us ({tail_note})" if tail else ""
    tensor_note = (f" + tensor {times['tensor']:.1f} us" if times["tensor"] else "") + (
        f" + special functions {times['sfu']:.1f} us" if times["sfu"] >= 0.05 else "")
    launch_note = f"launch {launch:.1f} us + " if gpu.launch_us is not None else "(launch cost not measured) "
    detail = (f"{100 * floor / serialized:.0f}-{100 * floor / overlapped:.0f}% of "
              f"{gpu.bandwidth_gbs:.0f} GB/s expected; {launch_note}bytes {times['bandwidth']:.1f} us + issue "
              f"{times['issue']:.1f} us + latency {times['latency']:.1f} us ({rounds:.1f} rounds a "
              f"warp){tail_note}{tensor_note}; {in_flight / 1024:.1f} KB in flight per SM vs {needed / 1024:.1f} KB "
              "needed")
    if times["tensor"] and times["tensor"] >= max(times.values()):
        return f"tensor-bound, its matrix work at {gpu.tensor_tflops:.0f} TFLOP/s: {detail}"
    if times["sfu"] and times["sfu"] >= max(times.values()):
        return f"special-function-bound, {SFU_RESULTS_PER_CYCLE} results a clock an SM: {detail}"
    if times["bandwidth"] >= 0.75 * serialized:
        return f"bandwidth-bound: {detail}"
    if launch >= sum(times.values()) + tail:
        return f"launch-bound, the fixed cost of a launch is most of the time: {detail}"
    if times["issue"] >= times["latency"] + (tail if declared_tail else 0.0):
        return f"issue-bound, instructions per byte add to the bytes' time: {detail}"
    if in_flight < needed:
        return f"latency-bound, too few bytes in flight: {detail}"
    return f"latency-bound, dependent load rounds add to the bytes' time: {detail}"


# --- SASS, offline (optional: the nvidia-cuda-nvdisasm wheel, extra "sass") -----------------------

_SASS_LINE = re.compile(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)(.*);", re.M)
_LABEL = re.compile(r"^(\.L_x_\d+):", re.M)


def nvdisasm() -> Path | None:
    """The nvdisasm binary of the nvidia-cuda-nvdisasm wheel, or None where it is not installed."""
    return wheel_binary("nvidia-cuda-nvdisasm", "nvdisasm")


def disassemble(cubin: bytes) -> str | None:
    """nvdisasm's listing of a cubin's SASS, or None where nvdisasm is not installed."""
    tool = nvdisasm()
    if tool is None:
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        return subprocess.run([str(tool), "-c", handle.name], capture_output=True, text=True, check=True).stdout


def sass_counts(cubin: bytes) -> dict | None:
    """Static SASS instructions of a cubin (padding NOPs left out), the body sizes of its loops
    (a branch back to an earlier label), the local-memory accesses (spills and refills, LDL / STL)
    and the copies from vector to uniform registers (R2UR: a value, such as a wgmma's descriptor,
    that ptxas could not keep uniform and copies over each iteration) inside any of them, and per
    loop (as loop_bodies) its wgmmas (HGMMA), R2URs and memory barriers (MEMBAR: a fence, a
    fence.proxy.async among them, waits for the warp's memory operations), or None without
    nvdisasm."""
    text = disassemble(cubin)
    if text is None:
        return None
    instructions = [(m.start(), m.group(1), m.group(2)) for m in _SASS_LINE.finditer(text) if m.group(1) != "NOP"]
    labels = {m.group(1): m.start() for m in _LABEL.finditer(text)}

    def within(start: int, end: int, prefix: str = "") -> int:
        return sum(start < at <= end and opcode.startswith(prefix) for at, opcode, _ in instructions)

    branches = [(labels[target.group(1)], at) for at, opcode, rest in instructions
                if opcode.startswith("BRA") and (target := re.search(r"\(\s*(\.L_x_\d+)\s*\)", rest))]
    # a branch back to an earlier label; one to itself is the trap ptxas puts after the last EXIT
    spans = [(start, end) for start, end in branches if within(start, end) > 1]

    def in_loops(prefixes: tuple[str, ...]) -> int:
        return sum(opcode.startswith(prefixes) and any(start < at <= end for start, end in spans)
                   for at, opcode, _ in instructions)

    return {"instructions": len(instructions), "loop_bodies": [within(*span) for span in spans],
            "loop_spills": in_loops(("LDL", "STL")), "loop_uniform_copies": in_loops(("R2UR",)),
            "wgmmas_per_loop": [within(*span, "HGMMA") for span in spans],
            "uniform_copies_per_loop": [within(*span, "R2UR") for span in spans],
            "membars_per_loop": [within(*span, "MEMBAR") for span in spans]}


def ptx_loop_bodies(ptx: str, entry: str) -> list[int]:
    """PTX instructions in each loop body (from a label to the branch back to it), for
    comparison with `sass_counts`."""
    code = parse(ptx, entry).instructions
    return [ins.index - ins.target + 1 for ins in code if ins.base == "bra" and ins.target <= ins.index]
