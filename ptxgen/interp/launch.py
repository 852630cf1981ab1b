"""launch(): run one entry of a PTX module on the CPU over a whole grid.

Threads are grouped by program counter; each step runs the group with the lowest PC
(lowest-PC-first reconvergence), so diverged threads rejoin where their paths meet.
Threads whose mbarrier wait finds its phase incomplete park until nothing else can run, then
retry (so a spinning consumer cannot starve its producer); if none can proceed, a deadlock.
The grid runs in waves of whole CTAs (in CTA order) to bound memory; each wave is one
vectorised machine."""
import hashlib
from dataclasses import dataclass

import numpy as np

from ..errors import InterpError, LaunchError, SanitizerError
from .ops import compile_program
from .parser import TYPES, parse
from .state import FULL, Finding, GlobalMemory, WaveState

MAX_WAVE_THREADS = 1 << 18
MAX_TRACKED_SHARED = 1 << 23    # shared bytes per wave when race tracking is on
MAX_STEPS = 10_000_000          # per wave; a spin-wait on another wave never ends
_CACHE = {}
# A compiled program holds ~30 objects per instruction, which every full garbage collection
# walks; launches nearly always repeat the last PTX, so a few programs are enough.
_CACHE_LIMIT = 8


@dataclass
class LaunchStats:
    instructions: int = 0          # issued steps: one per group of threads run together
    thread_instructions: int = 0   # sum over steps of the threads that executed
    waves: int = 0
    # Per instruction index: warps that reached it (a warp issues an instruction once however
    # many of its lanes run it or are predicated off, so a partial warp counts whole).
    warps_at: np.ndarray | None = None

    @property
    def warp_instructions(self) -> int:
        return int(self.warps_at.sum())


def _program(ptx, entry):
    key = (hashlib.sha256(ptx.encode()).hexdigest(), entry)
    if key not in _CACHE:
        if len(_CACHE) >= _CACHE_LIMIT:
            _CACHE.pop(next(iter(_CACHE)))
        prog = parse(ptx, entry)
        _CACHE[key] = (prog, compile_program(prog))
    return _CACHE[key]


def _param_value(name, type_, arg, memory):
    size, kind = TYPES[type_]
    if isinstance(arg, np.ndarray):
        if size != 8:
            raise LaunchError(f"parameter {name} (.{type_}) cannot take an array")
        return np.uint64(memory.map(arg, name))
    if kind == "f":
        return np.array(arg, f"f{size}").view(f"u{size}")[()]
    if isinstance(arg, (bool, float)) or not isinstance(arg, (int, np.integer)):
        raise LaunchError(f"parameter {name} (.{type_}) needs an int, got {type(arg).__name__}")
    lo, hi = (-(1 << (8 * size - 1)), (1 << 8 * size) - 1) if kind != "u" else (0, (1 << 8 * size) - 1)
    if not lo <= int(arg) <= hi:
        raise LaunchError(f"parameter {name} (.{type_}) value {arg} is out of range")
    return np.array(int(arg) & ((1 << 8 * size) - 1), f"u{size}")[()]


def launch(ptx: str, entry: str, grid: tuple[int, int, int], block: tuple[int, int, int],
           args: list, *, dynamic_shared: int = 0, sanitize: bool = True,
           kernel_name: str | None = None, max_ctas: int | None = None) -> LaunchStats:
    """Execute `entry` over grid x block threads; arrays in args are updated in place.
    With `max_ctas`, only CTAs 0 .. max_ctas-1 (in x, y, z order) run: for counting
    instructions of a large grid whose CTAs repeat each other's work."""
    prog, code = _program(ptx, entry)
    grid, block = tuple(int(v) for v in grid), tuple(int(v) for v in block)
    if len(grid) != 3 or len(block) != 3 or min(grid + block) < 1:
        raise LaunchError(f"grid {grid} and block {block} need three positive sizes")
    cta_threads = block[0] * block[1] * block[2]
    if cta_threads > 1024:
        raise LaunchError(f"block {block} has more than 1024 threads")
    if prog.reqntid and prog.reqntid != block:
        raise LaunchError(f"{entry} requires block {prog.reqntid} (.reqntid), got {block}")
    if prog.maxntid and cta_threads > np.prod(prog.maxntid):
        raise LaunchError(f"{entry} allows at most {prog.maxntid} threads (.maxntid), got {block}")
    if len(args) != len(prog.params):
        raise LaunchError(f"{entry} takes {len(prog.params)} arguments, got {len(args)}")
    if dynamic_shared and prog.dynamic_shared is None:
        raise LaunchError(f"{entry} declares no .extern .shared array for dynamic_shared")
    memory = GlobalMemory()
    params = {name: _param_value(name, t, a, memory) for (name, t), a in zip(prog.params, args)}
    shared = prog.shared_size
    if prog.dynamic_shared is not None:
        shared = prog.dynamic_shared.offset + int(dynamic_shared)
    num_ctas = grid[0] * grid[1] * grid[2]
    if max_ctas is not None:
        num_ctas = min(num_ctas, max_ctas)
    per_wave = max(1, min(num_ctas, MAX_WAVE_THREADS // cta_threads))
    if sanitize and shared:
        per_wave = max(1, min(per_wave, MAX_TRACKED_SHARED // shared))
    stats = LaunchStats(warps_at=np.zeros(len(code), np.int64))
    name = kernel_name or entry
    with np.errstate(all="ignore"):
        for first in range(0, num_ctas, per_wave):
            st = WaveState(prog, grid, block, first, min(per_wave, num_ctas - first), memory,
                           params, sanitize, shared)
            _run_wave(st, code, stats, name, first)
            stats.waves += 1
    return stats


def _report(finding, ins, st, name, first_cta):
    """Turn a Finding into the error naming kernel, line, CTA and thread."""
    t = finding.thread
    cta = first_cta + int(st.cta[t])
    gx, gy, _ = (int(st.special[f"%nctaid.{c}"][0]) for c in "xyz")
    where = (f"{name}: line {ins.line}: `{ins.text}`: {finding.what} "
             f"[CTA ({cta % gx},{cta // gx % gy},{cta // (gx * gy)}), "
             f"thread ({st.special['%tid.x'][t]},{st.special['%tid.y'][t]},{st.special['%tid.z'][t]})]")
    return SanitizerError(where) if finding.sanitizer else InterpError(where)


def _distinct(sorted_ids):
    return int(np.count_nonzero(sorted_ids[1:] != sorted_ids[:-1])) + 1 if len(sorted_ids) else 0


def _union(st, *parts):
    """Sorted union of disjoint thread sets (a mask pass is cheaper than sorting)."""
    if sum(len(p) for p in parts) == st.n:
        return st.all
    mask = np.zeros(st.n, bool)
    for p in parts:
        mask[p] = True
    return np.flatnonzero(mask)


def _merge(st, groups, pc, threads):
    other = groups.get(pc)
    groups[pc] = threads if other is None else _union(st, other, threads)


def _run_wave(st, code, stats, name, first_cta):
    n, end = st.n, len(code)
    groups = {0: st.all}
    waiting = {}                                   # barrier pc -> [thread arrays]
    arrived = np.zeros(st.num_ctas, np.int64)      # threads waiting at a barrier, per CTA
    waiting_pc = np.full(st.num_ctas, -1)          # the barrier they wait at
    exited = np.zeros(st.num_ctas, np.int64)
    parked, stalled = {}, False                    # pc -> threads at an incomplete mbarrier wait
    steps = 0
    while groups or parked:
        if not groups:
            if stalled:                            # a whole retry round parked again
                pc = min(parked)
                raise _report(Finding("deadlock: threads wait on an mbarrier phase that never "
                                      "completes and no other thread can run", parked[pc][0]),
                              code[pc].ins, st, name, first_cta)
            groups, parked, stalled = parked, {}, True
        pc = min(groups)
        threads = groups.pop(pc)
        if pc >= end:
            raise InterpError(f"{name}: execution ran past the last instruction (missing ret/exit)")
        ex = code[pc]
        ins = ex.ins
        steps += 1
        if steps > MAX_STEPS:
            raise InterpError(f"{name}: more than {MAX_STEPS} steps (an endless loop, or a "
                              f"spin-wait on another CTA) at line {ins.line}: `{ins.text}`")
        sel = FULL if len(threads) == n else threads
        try:
            active, rest = threads, None
            if ins.guard is not None:
                rid, negate = ins.guard
                pred = st.read(rid, sel)
                if negate:
                    pred = ~pred
                if not pred.all():
                    active, rest = threads[pred], threads[~pred]
                    sel = active
            stats.instructions += 1
            stats.thread_instructions += len(active)
            stats.warps_at[pc] += (st.num_ctas * st.warps_per_cta if len(threads) == n
                                   else _distinct(st.warp[threads]))
            kind = ex.kind
            stalled = stalled and kind == "wait"
            if kind == "alu":
                if len(active):
                    ex.run(st, sel)
                _merge(st, groups, pc + 1, threads)
                continue
            if rest is not None and len(rest):
                _merge(st, groups, pc + 1, rest)
            if not len(active):
                continue
            if kind == "wait":
                blocked = ex.run(st, sel)
                if blocked.any():
                    _merge(st, parked, pc, active[blocked])
                if not blocked.all():
                    stalled = False
                    _merge(st, groups, pc + 1, active[~blocked])
            elif kind == "bra":
                _merge(st, groups, ex.target, active)
            elif kind == "exit":
                ctas = st.cta[active]
                exited += np.bincount(ctas, minlength=st.num_ctas)
                stuck = arrived[ctas] > 0
                if stuck.any():
                    bpc = int(waiting_pc[ctas[stuck][0]])
                    raise Finding(f"thread exits while other threads of its CTA wait at "
                                  f"bar.sync on line {code[bpc].ins.line}: that barrier can never "
                                  "complete (divergent barrier)", active[np.flatnonzero(stuck)[0]])
            else:
                _barrier(st, ex, pc, active, sel, groups, waiting, arrived, waiting_pc, exited, code)
        except Finding as finding:
            raise _report(finding, ins, st, name, first_cta) from None
    if waiting:
        pc = min(waiting)
        t = waiting[pc][0][0]
        raise _report(Finding("deadlock: threads wait at this barrier but no thread of the "
                              "launch can run", t), code[pc].ins, st, name, first_cta)


def _barrier(st, ex, pc, active, sel, groups, waiting, arrived, waiting_pc, exited, code):
    """bar.sync: park the arriving threads; release each CTA once all its threads arrived."""
    if ex.run is not None:
        count = np.asarray(ex.run(st, sel))
        if (count != st.cta_threads).any():
            raise Finding(f"bar.sync with a thread count other than the CTA size "
                          f"({st.cta_threads}) is not supported", active[0], sanitizer=False)
    ctas = st.cta[active]
    other = (waiting_pc[ctas] >= 0) & (waiting_pc[ctas] != pc)
    if other.any():
        i = np.flatnonzero(other)[0]
        raise Finding(f"divergent barrier: other threads of this CTA wait at the bar.sync on "
                      f"line {code[int(waiting_pc[ctas[i]])].ins.line}", active[i])
    gone = exited[ctas] > 0
    if gone.any():
        i = np.flatnonzero(gone)[0]
        raise Finding(f"divergent barrier: {int(exited[ctas[i]])} threads of this CTA already "
                      "exited, so this bar.sync can never complete", active[i])
    arrived += np.bincount(ctas, minlength=st.num_ctas)
    waiting_pc[ctas] = pc
    waiting.setdefault(pc, []).append(active)
    done = arrived == st.cta_threads
    if not done.any():
        return
    parked = waiting.pop(pc)
    go = [done[st.cta[p]] for p in parked]
    if not all(g.all() for g in go):
        waiting[pc] = [p[~g] for p, g in zip(parked, go) if not g.all()]
    released = np.flatnonzero(done)
    arrived[released] = 0
    waiting_pc[released] = -1
    if st.races is not None:
        st.races.barrier(released)
        if st.async_state is not None:
            st.async_state.ordering.barrier(released)
    _merge(st, groups, pc + 1, _union(st, *(p[g] for p, g in zip(parked, go))))
