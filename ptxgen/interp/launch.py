"""launch(): run one entry of a PTX module on the CPU over a whole grid.

Threads are grouped by program counter; each step runs the group with the lowest PC
(lowest-PC-first reconvergence), so diverged threads rejoin where their paths meet.
Threads whose mbarrier wait finds its phase incomplete, or whose setmaxnreg.inc finds too few
registers free, park until nothing else can run, then retry (so a spinning consumer cannot
starve its producer); if none can proceed, a deadlock.
The grid runs in waves of whole CTAs (in CTA order) to bound memory; each wave is one
vectorised machine.

Interleaving: a wave runs in lockstep until it first executes an instruction that synchronises
across CTAs (a global atomic, a .gpu/.sys fence, a strong global load or store); from there on
it runs as two cohorts drawn from the launch seed: a random set of whole CTAs, and often one
CTA split between the cohorts at a random warp (a lone CTA is always split). The scheduler runs
one cohort for a random number of steps (lowest PC first inside it, so warps still reconverge),
then picks a cohort again; threads that re-read with a strong load what they read last time,
nothing having been written since (a spin-wait), wait until something is written. So CTAs and
warps run ahead of each other by varying amounts. Atomics that contend land in a seeded order
of their threads. At a global atomic that threads of several CTAs reach together, the CTA
landing last (in an order drawn afresh) is held back until nothing else in the wave can run
(_Cohorts.hold_back): CTAs in lockstep would otherwise always reach a counter together, every
one's earlier writes done. Before the first synchronising instruction the order cannot
matter: without synchronisation every cross-CTA read of data written in the launch is a finding whatever the
order (ordering.py), and the shared-memory race checks do not depend on the order either.
The wave's CTAs sit in slot order cohort by cohort, so a cohort is a contiguous range of threads
(a slice: cheap to index)."""
import hashlib
import zlib
from dataclasses import dataclass

import numpy as np

from ..errors import InterpError, LaunchError, SanitizerError
from . import contraction
from .approx import Approx
from .ops import compile_program
from .ordering import Ordering, synchronises
from .hopper import TensorMapRecord
from .parser import TENSOR_MAP, TYPES, parse
from .sanitizer import FloatAtomics
from .findings import Finding
from .state import FULL, GlobalMemory, WaveState

MAX_WAVE_THREADS = 1 << 18
MAX_TRACKED_SHARED = 1 << 24    # shared bytes per wave when race tracking is on (21 bytes of records
                                # each: 336 MB; a 132-CTA grid of up to 127 KB a CTA in one wave)
MAX_STEPS = 10_000_000          # per wave; a spin-wait on another wave never ends
MEAN_QUANTUM = 32               # steps a cohort runs before the scheduler picks again (mean)
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


def _program(ptx, entry, contract=False):
    key = (hashlib.sha256(ptx.encode()).hexdigest(), entry, contract)
    if key not in _CACHE:
        if len(_CACHE) >= _CACHE_LIMIT:
            _CACHE.pop(next(iter(_CACHE)))
        prog = parse(ptx, entry)
        if contract:
            contraction.contract(prog)
        sync_points = [synchronises(ins) for ins in prog.instructions]
        # where the scheduler may hold a CTA back (_Cohorts.hold_back): global (or generic) atomics
        holds = [sync and ins.base in ("atom", "red") for sync, ins in zip(sync_points, prog.instructions)]
        _CACHE[key] = (prog, compile_program(prog), sync_points, holds)
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


def _tensor_maps(entry, prog, maps, args, params):
    """The interpreter's record of each tensor-map parameter (hopper.TensorMapRecord)."""
    wanted = [name for name, t in prog.params if t == TENSOR_MAP]
    given = {m.name: m for m in maps}
    if sorted(wanted) != sorted(given):
        raise LaunchError(f"{entry} takes tensor maps {wanted}, given {sorted(given)}")
    records = {}
    for name in wanted:
        m = given[name]
        array = args.get(m.array)
        if not isinstance(array, np.ndarray) or array.ndim != len(m.box):
            raise LaunchError(f"{entry}: tensor map {name} needs an array {m.array} of rank {len(m.box)}")
        records[name] = TensorMapRecord(int(params[m.array]), array.itemsize, tuple(reversed(array.shape)),
                                        m.box, m.swizzle)
    return records


def launch(ptx: str, entry: str, grid: tuple[int, int, int], block: tuple[int, int, int],
           args: list, *, dynamic_shared: int = 0, sanitize: bool = True,
           kernel_name: str | None = None, seed: int = 0, approx: str = "pessimistic",
           deterministic: bool = False, max_ctas: int | None = None,
           stable: frozenset[str] = frozenset(), tensor_maps: tuple = (), contract: bool = False,
           written: frozenset[str] | None = None) -> LaunchStats:
    """Execute `entry` over grid x block threads; arrays in args are updated in place.
    With `max_ctas`, only CTAs 0 .. max_ctas-1 (in x, y, z order) run: for counting
    instructions of a large grid whose CTAs repeat each other's work.

    seed: draws the interleaving of CTAs and warps (mixed with the entry, grid and scalar
    arguments, so launches vary) and the errors of approximate instructions (not mixed: like
    the hardware's, they are a fixed function of the inputs). approx: "pessimistic" moves
    every .approx / div.full / mma.sync result within the error the H100 was measured to make;
    "exact" rounds the exact result once. deterministic: also report float atomic additions
    whose result depends on the order they land in. stable: the array parameters that are the
    same in every launch of a step (a model's weights): with the sanitizer on, a kernel that
    executes griddepcontrol.wait (programmatic dependent launch) may touch only these before it,
    and every thread must execute it before it ends. tensor_maps: an abi.TensorMap for each
    tensor-map parameter of the entry (args hold the other parameters), over an array in args.
    contract: run each mul and add/sub that ptxas may contract (a mul/add or mul/sub pair without
    rounding modifiers, its default --fmad=true) as one fma, rounded once (contraction.py).
    written: the array parameters the kernel may write (outputs, in-out arrays, workspaces; None:
    any): with the sanitizer on, their weak reads are recorded from the launch's start, so a
    write by another CTA after a read it is not ordered after is a finding (ordering.py's write
    after read); other arrays' reads only from their first write in the launch."""
    prog, code, sync_points, holds = _program(ptx, entry, contract)
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
    plain = [(name, t) for name, t in prog.params if t != TENSOR_MAP]
    if len(args) != len(plain):
        raise LaunchError(f"{entry} takes {len(plain)} arguments, got {len(args)}")
    if dynamic_shared and prog.dynamic_shared is None:
        raise LaunchError(f"{entry} declares no .extern .shared array for dynamic_shared")
    memory = GlobalMemory()
    params = {name: _param_value(name, t, a, memory) for (name, t), a in zip(plain, args)}
    params.update(_tensor_maps(entry, prog, tensor_maps, dict(zip((name for name, _ in plain), args)), params))
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
    scalars = [a for a in args if not isinstance(a, np.ndarray)]
    rng = np.random.default_rng([seed & 0xFFFFFFFF, zlib.crc32(repr((entry, grid, block, scalars)).encode())])
    ordering = Ordering(memory, grid, prog, sanitize, written)
    waits = any(ins.base == "griddepcontrol" and ins.mods == ["wait"] for ins in prog.instructions)
    approximations = Approx(approx, seed)
    float_atomics = FloatAtomics() if deterministic else None
    with np.errstate(all="ignore"):
        for first in range(0, num_ctas, per_wave):
            ids = np.arange(first, min(first + per_wave, num_ctas))
            warps = -(-cta_threads // 32)
            ids, cut = _cohorts(ids, warps, rng) if any(sync_points) else (ids, 0)
            st = WaveState(prog, grid, block, ids, memory, params, sanitize, shared)
            st.ordering, st.approx, st.float_atomics, st.stats = ordering, approximations, float_atomics, stats
            if sanitize and waits:
                st.watch_dependent_launch(frozenset(i for i, name in enumerate(memory.names) if name in stable))
            st.rank = rng.permutation(st.n)
            ordering.start_wave(st, first)
            cut = min(cut * 32, st.n)
            members = [st.all[:cut], st.all[cut:]] if 0 < cut < st.n else [st.all]
            _run_wave(st, code, sync_points, holds, stats, name, rng, members)
            stats.waves += 1
    return stats


def _cohorts(ids, warps, rng):
    """A wave's CTAs in slot order for two cohorts, and the first warp slot of the second:
    a random set of whole CTAs, then (always for a lone CTA, else half the time) one CTA split
    at a random warp, then the other CTAs."""
    rng.shuffle(ids)
    split = warps > 1 and (len(ids) == 1 or rng.random() < 0.5)
    whole = len(ids) - split
    first = int(rng.integers(1, whole)) if whole > 1 else whole
    return ids, first * warps + (int(rng.integers(1, warps)) if split else 0)


def _report(finding, ins, st, name):
    """Turn a Finding into the error naming kernel, line, CTA and thread."""
    t = finding.thread
    cta = int(st.cta_global[t])
    gx, gy, _ = (int(st.special[f"%nctaid.{c}"][0]) for c in "xyz")
    where = (f"{name}: line {ins.line}: `{ins.text}`: {finding.what} "
             f"[CTA ({cta % gx},{cta // gx % gy},{cta // (gx * gy)}), "
             f"thread ({st.special['%tid.x'][t]},{st.special['%tid.y'][t]},{st.special['%tid.z'][t]})]")
    return SanitizerError(where) if finding.sanitizer else InterpError(where)


def _union(st, *parts):
    """Sorted union of disjoint thread sets (a mask pass is cheaper than sorting)."""
    if sum(len(p) for p in parts) == st.n:
        return st.all
    mask = np.zeros(st.n, bool)
    for p in parts:
        mask[p] = True
    return np.flatnonzero(mask)


def _distinct(sorted_ids):
    return int(np.count_nonzero(sorted_ids[1:] != sorted_ids[:-1])) + 1 if len(sorted_ids) else 0


def _merge(st, groups, pc, threads):
    other = groups.get(pc)
    groups[pc] = threads if other is None else _union(st, other, threads)


class _Cohorts:
    """Per cohort, its thread groups by PC; picks which cohort runs next. Threads that spin
    (re-read with a strong load what they read last time, nothing having been written since)
    are parked until some global write happens: lowest-PC-first would otherwise keep running
    a spin loop whose PC is below the code another CTA must run to end it."""

    def __init__(self, st, rng, members):
        self.st, self.rng = st, rng
        self.members = members                  # the cohorts' threads, once split
        self.groups = [{0: st.all}]             # lockstep until the first synchronising step
        self.current, self.budget = 0, np.inf
        self.reads = [{}]                       # per cohort: strong-load PC -> what it last read
        self.parked, self.parked_at = [], None  # [(cohort, pc, threads)], global writes then
        self.held = []                          # [(pc, threads)] held back at an atomic (hold_back)
        self.cohort_of = np.zeros(st.n, np.int64)
        for k, m in enumerate(members):
            self.cohort_of[m] = k

    def split(self, pc, threads):
        """Before the first synchronising step (threads at pc): from now on, cohorts."""
        if len(self.members) == 1 or len(self.groups) > 1:
            return False
        lockstep = self.groups[0]
        _merge(self.st, lockstep, pc, threads)
        self.groups = [{} for _ in self.members]
        self.reads = [{} for _ in self.members]
        for at, group in lockstep.items():
            self.release(at, group)
        self.budget = 0
        return True

    def _quantum(self):
        return int(self.rng.geometric(1.0 / MEAN_QUANTUM))

    def next(self, writes):
        """The group of threads to run next and its PC; None when no thread can run; or
        "spinning" when every thread that could run spins on memory nothing writes."""
        if self.parked and writes != self.parked_at:
            for k, pc, threads in self.parked:
                _merge(self.st, self.groups[k], pc, threads)
            self.parked = []
        groups = self.groups[self.current]
        if not groups or self.budget <= 0:
            live = [k for k, g in enumerate(self.groups) if g]
            if not live and self.held:           # only now does a CTA held back go on (hold_back)
                self.release(*self.held.pop(0))
                live = [k for k, g in enumerate(self.groups) if g]
            if not live:
                return "spinning" if self.parked else None
            self.current = live[int(self.rng.integers(len(live)))]
            self.budget = self._quantum()
            groups = self.groups[self.current]
        self.budget -= 1
        pc = min(groups)
        return pc, groups.pop(pc)

    def spun(self, pc, read, writes, threads):
        """After a strong global load at pc that read `read` (what and where): park the
        threads (to redo the load) if it read the same last time with no write since."""
        seen = self.reads[self.current]
        if seen.get(pc) != (read, writes):
            seen[pc] = (read, writes)
            return False
        self.parked.append((self.current, pc, threads))
        self.parked_at = writes
        self.budget = 0
        return True

    def may_hold(self, pc):
        """Whether no CTA is held at pc already (hold_back)."""
        return all(at != pc for at, _ in self.held)

    def hold_back(self, pc, threads, active, rest):
        """Before a global atomic that active threads of several CTAs execute together: a fresh
        landing order (st.rank XOR a random number), and the CTA whose threads land last in it
        does not execute the atomic now, but waits at it (with its threads of this group that the
        guard turns off) until nothing else in the wave can run. Held CTAs go on one at a time, in
        the order they were held (stragglers released together would run in lockstep again), and
        an instruction holds one CTA at a time (so a loop of atomics does not leave most CTAs to
        run alone). CTAs in lockstep would otherwise do everything before the atomic at once, so
        a CTA that acts on what the atomic counts would always find every other CTA's earlier
        writes done ("the last CTA to count in merges" with an off-by-one passed), and with one
        order for every atomic the CTA counting last had always landed last on the word it
        merges (so ordering.py never saw it rely on a later atomic of another CTA). Deferring a
        CTA is a legal interleaving, and a spin-wait on it parks (spun) until the wave is idle,
        so nothing deadlocks. Returns threads, active and rest without the held CTA."""
        st = self.st
        st.rank ^= self.rng.integers(1 << (st.n - 1).bit_length())
        late = st.cta[active[np.argmax(st.rank[active])]]
        mine = st.cta[threads] == late
        self.held.append((pc, threads[mine]))
        if rest is not None:
            rest = rest[st.cta[rest] != late]
        return threads[~mine], active[st.cta[active] != late], rest

    def merge(self, pc, threads):
        """threads (all of the running cohort) continue at pc."""
        _merge(self.st, self.groups[self.current], pc, threads)

    def release(self, pc, threads):
        """threads (of any cohorts) continue at pc."""
        if len(self.groups) == 1:
            return _merge(self.st, self.groups[0], pc, threads)
        owner = self.cohort_of[threads]
        for k, groups in enumerate(self.groups):
            mine = threads[owner == k]
            if len(mine):
                _merge(self.st, groups, pc, mine)


def _run_wave(st, code, sync_points, holds, stats, name, rng, members):
    n, end = st.n, len(code)
    cohorts = _Cohorts(st, rng, members)
    barriers = _CtaBarriers(st)
    parked, stalled = {}, False                    # pc -> threads at an incomplete mbarrier wait or setmaxnreg.inc
    steps = 0
    while True:
        picked = cohorts.next(st.ordering.writes)
        if (picked is None or picked == "spinning") and parked:
            if stalled:                            # a whole retry round parked again
                pc = min(parked)
                raise _report(Finding(f"deadlock: threads wait on {code[pc].target} and no other thread can run",
                                      parked[pc][0]), code[pc].ins, st, name)
            for pc, threads in parked.items():
                cohorts.release(pc, threads)
            parked, stalled = {}, True
            continue
        if picked is None:
            break
        if picked == "spinning":
            k, pc, threads = cohorts.parked[0]
            raise _report(Finding("deadlock: every thread that can still run spin-waits on global "
                                  "memory that no running thread writes any more", threads[0]),
                          code[pc].ins, st, name)
        pc, threads = picked
        if pc >= end:
            raise InterpError(f"{name}: execution ran past the last instruction (missing ret/exit)")
        ex = code[pc]
        if sync_points[pc] and cohorts.split(pc, threads):
            continue
        ins = ex.ins
        st.pc = pc
        steps += 1
        if steps > MAX_STEPS:
            raise InterpError(f"{name}: more than {MAX_STEPS} steps (an endless loop, or a "
                              f"spin-wait on another CTA) at line {ins.line}: `{ins.text}`")
        if len(threads) == n:
            sel = FULL
        elif threads[-1] - threads[0] + 1 == len(threads):
            sel = slice(int(threads[0]), int(threads[-1]) + 1)
        else:
            sel = threads
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
            several = len(active) > 1 and st.cta[active[0]] != st.cta[active[-1]]    # (sorted: CTA order)
            if holds[pc] and several and cohorts.may_hold(pc):
                threads, active, rest = cohorts.hold_back(pc, threads, active, rest)
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
                    if ex.strong_read and cohorts.spun(pc, st.ordering.last_read, st.ordering.writes, threads):
                        continue
                cohorts.merge(pc + 1, threads)
                continue
            if rest is not None and len(rest):
                cohorts.merge(pc + 1, rest)
            if not len(active):
                continue
            if kind == "wait":
                blocked = ex.run(st, sel)
                if blocked.any():
                    _merge(st, parked, pc, active[blocked])
                if not blocked.all():
                    stalled = False
                    cohorts.merge(pc + 1, active[~blocked])
            elif kind == "bra":
                if ex.run is not None and rest is not None and len(rest) and st.sanitize:
                    ex.run(st, active, rest)
                cohorts.merge(ex.target, active)
            elif kind == "exit":
                if st.before_wait is not None and st.before_wait[active].any():
                    raise Finding("thread ends without griddepcontrol.wait: under a programmatic dependent launch a "
                                  "grid whose threads all end without waiting can complete before the kernel it "
                                  "depends on, and the next kernel would not wait for that one",
                                  active[np.flatnonzero(st.before_wait[active])[0]])
                stuck, bpc = barriers.exit(active)
                if stuck.any():
                    raise Finding(f"thread exits while other threads of its CTA wait at "
                                  f"bar.sync on line {code[bpc].ins.line}: that barrier can never "
                                  "complete (divergent barrier)", active[np.flatnonzero(stuck)[0]])
                if st.sanitize:
                    _check_ended(st, barriers, active)
            else:
                barriers.arrive(ex, pc, active, sel, cohorts, code)
        except Finding as finding:
            raise _report(finding, ins, st, name) from None
    if barriers.waiting:
        pc, threads, _ = barriers.waiting[0]
        raise _report(Finding("deadlock: threads wait at this barrier but no thread of the "
                              "launch can run", threads[0]), code[pc].ins, st, name)


def _check_ended(st, barriers, threads):
    """The CTAs whose last threads these are may leave no async copy in flight."""
    ctas = np.unique(st.cta[threads])
    ended = ctas[barriers.exited_per_cta[ctas] == st.cta_threads]
    if len(ended):
        st.races.check_ended(ended)
        if st.async_state is not None:
            st.async_state.check_ended(set(ended.tolist()), threads)


class _CtaBarriers:
    """The CTA barriers (ids 0..15) of a wave: bar.sync / barrier.sync id{, count} wait, and
    bar.arrive / barrier.arrive id, count arrive without waiting; a barrier completes when as
    many threads of the CTA arrived as its count says (all the CTA's threads by default). The
    aligned forms (bar.*, barrier.*.aligned) must be waited at by one instruction per barrier.
    Book-keeping is per barrier id over the wave's CTAs (bincounts, no sorting): a bar.sync of
    whole CTAs is most of what kernels execute."""

    IDS = 16

    def __init__(self, st):
        self.st = st
        shape = (self.IDS, st.num_ctas)
        self.arrived = np.zeros(shape, np.int64)
        self.expected = np.zeros(shape, np.int64)       # 0: nothing arrived in this phase yet
        self.at = np.full(shape, -1, np.int64)            # where its aligned waiters wait
        self.waiting = []                                 # [(pc, threads, id)] parked at a barrier
        self.arrivers = []                                # [(threads, id)] that arrived without waiting
        self.exited = np.zeros(st.n, bool)
        self.exited_per_cta = np.zeros(st.num_ctas, np.int64)

    def _arrived_only(self, bid):
        """Per wave thread: it arrived at barrier `bid`'s current phase without waiting."""
        came = np.zeros(self.st.n, bool)
        for threads, at in self.arrivers:
            if at == bid:
                came[threads] = True
        return came

    def exit(self, threads):
        """These threads exit. Returns which of them leave a barrier that needs every thread of
        their CTA, and that others wait at, without having arrived there, and the pc those wait
        at (-1: none)."""
        st = self.st
        self.exited[threads] = True
        self.exited_per_cta += np.bincount(st.cta[threads], minlength=st.num_ctas)
        stuck, where = np.zeros(len(threads), bool), -1
        for pc, waiting, bid in self.waiting:
            full = np.zeros(st.num_ctas, bool)
            full[st.cta[waiting]] = self.expected[bid][st.cta[waiting]] == st.cta_threads
            hit = full[st.cta[threads]] & ~self._arrived_only(bid)[threads]
            if hit.any() and where < 0:
                where = pc
            stuck |= hit
        return stuck, where

    def arrive(self, ex, pc, active, sel, cohorts, code):
        st = self.st
        ids, counts = ex.run(st, sel)
        wait, aligned = ex.target
        if not wait:
            cohorts.merge(pc + 1, active)
        if np.ndim(ids) == 0:
            self._arrive_at(int(ids), pc, active, counts, wait, aligned, cohorts, code)
            return
        ids = np.asarray(ids, np.int64)
        for bid in np.unique(ids).tolist():
            mine = ids == bid
            self._arrive_at(bid, pc, active[mine], counts if np.ndim(counts) == 0 else np.asarray(counts)[mine],
                            wait, aligned, cohorts, code)

    def _arrive_at(self, bid, pc, active, counts, wait, aligned, cohorts, code):
        st = self.st
        if not 0 <= bid < self.IDS:
            raise Finding(f"barrier id {bid}: expected 0..{self.IDS - 1}", active[0])
        ctas = st.cta[active]
        count = np.full(st.num_ctas, st.cta_threads, np.int64)     # each CTA's count in this step
        if counts is not None:
            counts = np.broadcast_to(np.asarray(counts, np.int64), active.shape)
            count[ctas] = counts
            bad = (counts > st.cta_threads) | (counts < 1) | ((counts % 32 != 0) & (counts != st.cta_threads))
            if bad.any():
                raise Finding(f"barrier thread count {int(counts[bad][0])}: expected a multiple of 32 up to the "
                              f"CTA's {st.cta_threads} threads", active[np.argmax(bad)])
            mixed = counts != count[ctas]
            if mixed.any():
                k = int(np.argmax(mixed))
                raise Finding(f"barrier {bid}: threads arrive with thread count {int(counts[k])}, others with "
                              f"{int(count[ctas[k]])}", active[k])
        tally = np.bincount(ctas, minlength=st.num_ctas)
        touched = tally > 0
        arrived, expected, at = self.arrived[bid], self.expected[bid], self.at[bid]
        clash = touched & (arrived > 0) & (expected != count)
        if clash.any():
            k = int(np.argmax(clash[ctas]))
            raise Finding(f"barrier {bid}: threads arrive with thread count {int(count[ctas[k]])}, others with "
                          f"{int(expected[ctas[k]])}", active[k])
        if wait and aligned and counts is None:   # (with a count, code meets one at several call sites)
            other = touched & (at >= 0) & (at != pc)
            if other.any():
                k = int(np.argmax(other[ctas]))
                raise Finding(f"divergent barrier: other threads of this CTA wait at the bar.sync on "
                              f"line {code[int(at[ctas[k]])].ins.line}", active[k])
            at[touched] = pc
        exited = self.exited_per_cta
        gone = touched & (count == st.cta_threads) & (exited > 0)
        if gone.any():    # unless the threads that exited had arrived at this barrier first
            left = np.flatnonzero(self._arrived_only(bid) & self.exited)
            gone &= exited > np.bincount(st.cta[left], minlength=st.num_ctas)
        if gone.any():
            k = int(np.argmax(gone[ctas]))
            raise Finding(f"divergent barrier: {int(exited[ctas[k]])} threads of this CTA already "
                          "exited, so this bar.sync can never complete", active[k])
        if (arrived + tally <= count)[touched].all():
            self._take(bid, pc, active, touched, tally, count, wait, cohorts)
            return
        # More arrive at once than a barrier still expects: in warp order, the first ones complete
        # its phase and the others start the next (bar.sync 0, 32 by every warp: one phase a warp).
        for cta in np.flatnonzero(touched).tolist():
            group = active[ctas == cta]
            while len(group):
                room = int(count[cta]) - int(arrived[cta])
                now, group = group[:room], group[room:]
                one = np.zeros(st.num_ctas, bool)
                one[cta] = True
                self._take(bid, pc, now, one, np.where(one, len(now), 0), count, wait, cohorts)

    def _take(self, bid, pc, threads, touched, tally, count, wait, cohorts):
        """These threads arrive (none beyond the barrier's count); complete what they fill."""
        self.expected[bid][touched] = count[touched]
        self.arrived[bid] += tally
        if wait:
            self.waiting.append((pc, threads, bid))
        else:
            self.arrivers.append((threads, bid))
            if self.st.races is not None:
                self.st.races.arrived(threads)
        done = touched & (self.arrived[bid] == self.expected[bid])
        if done.any():
            self._complete(bid, done, cohorts)

    def _complete(self, bid, done, cohorts):
        """Release the waiters of barrier `bid` in the CTAs `done` (a mask); the sanitizer orders
        those waiters (and, for a barrier of the whole CTA, the global-memory ordering its CTAs)."""
        st = self.st
        released, still = [], []
        for pc, threads, at in self.waiting:
            go = done[st.cta[threads]] if at == bid else None
            if go is None or not go.any():
                still.append((pc, threads, at))
                continue
            released.append((pc, threads[go]))
            if not go.all():
                still.append((pc, threads[~go], at))
        senders, kept = [], []
        for threads, at in self.arrivers:
            go = done[st.cta[threads]] if at == bid else None
            if go is None or not go.any():
                kept.append((threads, at))
                continue
            senders.append(threads[go])
            if not go.all():
                kept.append((threads[~go], at))
        self.waiting, self.arrivers = still, kept
        self.arrived[bid][done] = 0
        self.expected[bid][done] = 0
        self.at[bid][done] = -1
        waiters = _union(st, *(t for _, t in released)) if released else np.zeros(0, np.int64)
        senders = _union(st, *senders) if senders else np.zeros(0, np.int64)
        # For the global-memory ordering's writes a barrier of part of a CTA counts as one of all
        # of it (a release after it covers its writes): otherwise a correct publication after a
        # named barrier would read stale (a race between a thread outside it and one inside is
        # missed). Acquisitions pass only to its waiters.
        st.ordering.barrier(st.cta_ids[np.flatnonzero(done)], waiters, senders)
        if st.races is not None:
            st.races.barrier(waiters, senders)
        if st.async_state is not None and st.async_state.ordering is not None:   # (sanitizer on)
            st.async_state.ordering.barrier(waiters, senders)
        for pc, threads in released:
            cohorts.release(pc + 1, threads)
