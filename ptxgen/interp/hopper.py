"""The asynchronous sm_90a instructions: wgmma (warpgroup MMA on shared-memory matrix
descriptors), mbarrier phases with transaction counts, cp.async.bulk global->shared,
cp.async.mbarrier.arrive, fence.proxy.async, setmaxnreg and elect.sync.

Execution. Results are computed at issue and land when the PTX ISA says they may be used:
a wgmma's accumulators reach its registers when a wgmma.wait_group retires its group (until
then its register operands are off limits to ordinary instructions, which the sanitizer reports
as reads of unwritten registers); bytes written by a bulk copy, or by cp.asyncs handed to an
mbarrier with cp.async.mbarrier.arrive, stay pending until the mbarrier phase tracking them
completes. Async copies are in flight until a thread that a try_wait/test_wait on their
mbarrier in that CTA parked is retried, or an arrival needs the phase complete (more arrivals
than it expects): only then is a bulk copy's complete_tx applied, and the arrive-on of a
cp.async.mbarrier.arrive made. A thread whose mbarrier try_wait/test_wait finds its phase
incomplete gets false once and goes on (so a kernel that ignores the answer reads early, a
finding); asked again at the same instruction it parks: launch runs every other thread first,
then retries it. So the first wait after a copy always finds the phase incomplete however far
the producer ran ahead, and while a consumer waits for its copies every other thread runs as
far as it can (a producer that refills a stage without waiting for it to be freed overwrites
what the consumer has yet to read); producer and consumer warpgroups spinning on each other
cannot starve; a wrong expect_tx count leaves the phase incomplete forever; if no parked wait
can succeed and nothing else can run, launch reports the deadlock.

Sanitizer. bar.sync epochs (sanitizer.SharedRaces) cannot see orderings made by mbarriers, so
the accesses they order are tracked here with vector clocks over the agents of a CTA: its
threads (own clocks advance when they release), its warpgroups' tensor cores (a clock per
retired wgmma.wait_group) and its mbarriers (a clock per completed phase that delivered async
writes). An mbarrier arrive releases the arriving thread's clocks into the phase; a successful
wait acquires every completed phase; bar.sync joins the whole CTA. Shared memory is tracked in
16-byte granules: the last write (its agent and clock, whether it is still in flight, and whether
it went through the generic proxy) and the last reader of each warpgroup (ordinary or wgmma). A
read must have acquired the write it reads; a write must have acquired every read and write
before it; the async proxy (wgmma) may read what ordinary stores or cp.async wrote only after a
fence.proxy.async by the writer or by the reading threads. Granules written by async copies
are owned here (the epoch tracker's records of them are dropped); ordinary accesses to ordinary
data remain the epoch tracker's, so ordinary stores read by other threads still need a bar.sync.
"""
import re
from collections import defaultdict
from typing import NamedTuple

import numpy as np

from ..errors import InterpError
from .ops import COMPILERS, Exec, _halves_to_f64, opcode
from .parser import SHARED_BASE, TENSOR_MAP, Imm, Pair, Reg, TensorAddr, Vec, tensor_map_address
from .sanitizer import NOBODY, W_THREAD, full_warps, warp_members
from .findings import Finding

WARPGROUP = 128
MAX_BARRIERS = 64                  # mbarrier objects per program the sanitizer can tell apart
TX_LIMIT = (1 << 20) - 1           # an mbarrier's tx-count range is [-(2^20-1), 2^20-1]
COUNT_LIMIT = (1 << 20) - 1        # and its expected arrival count [1, 2^20-1]
SHARED_SPACES = ("shared", "shared::cta", "shared::cluster")
PLAIN, PENDING, ASYNC = 0, 1, 2    # a granule's last write: ordinary, async in flight, async done
ORDINARY, TENSOR = 0, 1            # reader kinds: ld.shared, wgmma
DECLINED, PARKED = 1, 2            # a wait answered a thread false once; then parked it


def _fragment_maps():
    """Per warpgroup thread q (warp w = q / 32, g = lane / 4, t = lane % 4), the matrix element
    of each register (PTX ISA, wgmma register fragments): accumulator register i holds
    D[16w + g + 8 ((i / 2) % 2)][8 (i / 4) + 2t + i % 2]; half h of A register j holds
    A[16w + g + 8 (j % 2)][2t + h + 8 (j / 2)]."""
    q = np.arange(WARPGROUP)[:, None]
    w, g, t = q // 32, q % 32 // 4, q % 4
    i = np.arange(128)[None, :]
    d_row = 16 * w + g + 8 * (i // 2 % 2)
    d_col = 8 * (i // 4) + 2 * t + i % 2
    h = np.arange(8)[None, :]                      # A half index 2j + h
    a_row = 16 * w + g + 8 * (h // 2 % 2)
    a_col = 2 * t + h % 2 + 8 * (h // 4)
    return d_row, d_col, a_row, a_col


D_ROW, D_COL, A_ROW, A_COL = _fragment_maps()
SWIZZLE_BYTES = np.array([0, 128, 64, 32])         # descriptor bits 62-63


def decode_descriptor(desc):
    """Matrix descriptor fields (PTX ISA, Matrix Descriptor Format), each [warpgroups, 1, 1]:
    start address, leading and stride dimension byte offsets (encoded >> 4), base offset,
    swizzle width in bytes (0: none)."""
    desc = desc.astype(np.uint64)[:, None, None]

    def field(shift, bits):
        return ((desc >> np.uint64(shift)) & np.uint64((1 << bits) - 1)).astype(np.int64)
    return (field(0, 14) << 4, field(16, 14) << 4, field(32, 14) << 4, field(49, 3),
            SWIZZLE_BYTES[field(62, 2)])


def operand_addresses(start, lbo, sbo, width, rows, mn_major):
    """Shared byte address of element (r, k) of a rows x 16 operand of 16-bit elements, as
    [warpgroups, rows, 16], by the canonical layouts of the PTX ISA (T = 8 elements = 16 bytes):
      K-major,  no swizzle: ((8,m),(T,2)):((1T,SBO),(1,LBO))
      K-major,  swizzle W:  ((8,m),(T,2)):((W/16 T,SBO),(1,T))
      MN-major, no swizzle: ((T,1,m),(8,2)):((1,T,SBO),(1T,LBO))
      MN-major, swizzle W:  ((T,W/16,m),(8,2)):((1,T,LBO),(W/16 T,SBO))
    then Swizzle<log2(W/16),4,3> on the address: bits [4, 4+b) ^= bits [7, 7+b)."""
    r = np.arange(rows)[None, :, None]
    k = np.arange(16)[None, None, :]
    swizzled = width > 0
    if not mn_major:
        addr = (start + r % 8 * np.where(swizzled, width, 16) + r // 8 * sbo
                + k // 8 * np.where(swizzled, 16, lbo) + k % 8 * 2)
    else:
        chunks = np.maximum(width // 16, 1)               # 16-byte chunks along MN per row
        along = np.where(swizzled, r // 8 % chunks * 16 + r // (8 * chunks) * lbo, r // 8 * sbo)
        addr = (start + r % 8 * 2 + along + k % 8 * np.where(swizzled, width, 16)
                + k // 8 * np.where(swizzled, sbo, lbo))
    mask = np.maximum(width // 16, 1) - 1
    return addr ^ ((addr >> 7) & mask) << 4


def warpgroups(st, threads, what):
    """threads as [warpgroups, 128] after checking that every warpgroup they touch executes
    this .sync.aligned instruction with all four of its warps converged."""
    full_warps(st, threads, what)
    wg = st.lin[threads] // WARPGROUP
    key = st.cta[threads] * (st.cta_threads // WARPGROUP + 1) + wg
    counts = np.bincount(key)
    short = counts[key] != WARPGROUP
    if short.any():
        i = int(np.flatnonzero(short)[0])
        raise Finding(f"{what}: warpgroup {int(wg[i])} (warps {4 * int(wg[i])}..{4 * int(wg[i]) + 3}) "
                      f"executes it with {int(counts[key[i]])} of its {WARPGROUP} threads "
                      "(diverged, exited, or a CTA that is not whole warpgroups)", threads[i])
    return threads.reshape(-1, WARPGROUP)


def uniform(values, groups, what):
    """values [warpgroups, 128] must agree within each warpgroup; returns one per group."""
    bad = (values != values[:, :1]).any(axis=1)
    if bad.any():
        wg = int(np.flatnonzero(bad)[0])
        raise Finding(f"{what} differs between the threads of a warpgroup", groups[wg][0])
    return values[:, 0]


# ---- per-wave state ----------------------------------------------------------------------
class PendingWrites(NamedTuple):
    """Async writes (16-byte granules) delivered by one phase of an mbarrier in one CTA."""
    cta: int
    phase: int
    granules: np.ndarray


class Barrier:
    """One mbarrier offset in every CTA of the wave."""

    def __init__(self, offset, slot, num_ctas, columns, cta_threads):
        self.offset, self.slot = offset, slot
        self.ready = np.zeros(num_ctas, bool)
        self.expected, self.pending, self.tx, self.phase = (np.zeros(num_ctas, np.int64) for _ in range(4))
        self.flying = np.zeros(num_ctas, np.int64)   # bulk-copy bytes issued whose complete_tx is to come
        self.deferred = np.zeros(num_ctas, np.int64)  # cp.async.mbarrier.arrive arrivals still to come
        self.tracked = []
        if columns:
            self.clocks_now = np.zeros((num_ctas, columns), np.int32)    # released this phase
            self.clocks_done = np.zeros((num_ctas, columns), np.int32)   # by completed phases
            self.stamp = np.zeros(num_ctas, np.int32)
            self.init_agent = np.zeros(num_ctas, np.int64)
            self.init_clock = np.zeros(num_ctas, np.int32)
            self.touched = np.zeros((num_ctas, cta_threads), np.int32)   # each thread's clock at its last use


class Wgmma(NamedTuple):
    """An issued wgmma of one warpgroup: its results land when its group retires."""
    threads: np.ndarray            # the warpgroup's 128 wave thread indices
    d_regs: tuple
    values: np.ndarray             # [128, len(d_regs)] float32 results
    a_regs: tuple                  # A-fragment registers (register form)
    read_id: int                   # the sanitizer's record of its shared-memory reads (0: none)


class Ordering:
    """The vector-clock sanitizer described in the module docstring (sanitize=True only)."""

    def __init__(self, st, groups_per_cta):
        self.st = st
        self.T = st.cta_threads
        self.barrier_column = self.T + groups_per_cta      # column of mbarrier slot 0
        self.columns = self.barrier_column + MAX_BARRIERS
        self.vc = np.zeros((st.n, self.columns), np.int32)
        self.vc[st.all, st.lin] = 1                # own clocks start at 1: 0 means never seen
        self.wg_local = st.lin // WARPGROUP
        granules = st.shared.size // 16
        self.kind = np.zeros(granules, np.uint8)
        self.w_agent = np.full(granules, -1, np.int32)   # -1: no recorded write
        self.w_clock = np.zeros(granules, np.int32)
        self.w_step = np.zeros(granules, np.int64)
        self.w_thread = np.zeros(granules, np.int64)     # writer or issuer (wave index)
        self.w_line = np.zeros(granules, np.int32)       # line of an async write
        self.w_generic = np.zeros(granules, bool)        # written through the generic proxy
        self.r_agent = np.full((granules, groups_per_cta, 2), -1, np.int32)
        self.r_clock = np.zeros((granules, groups_per_cta, 2), np.int32)   # < 0: wgmma in flight
        self.fence = np.full(st.n, -1, np.int64)          # last fence.proxy.async per thread
        self.wg_stamp = np.zeros(st.num_ctas * groups_per_cta, np.int32)
        self.tensor_reads = {}                            # in-flight read id -> (line, granules)
        self.read_ids = 0
        self.barrier_words = set()                        # CTA-relative offsets / 8
        self.now = 0

    def tick(self):
        self.now += 1
        return self.now

    # -- synchronisation
    def barrier(self, waiters, senders):
        """A barrier released `waiters` (threads that waited at it) and took `senders` (threads
        that arrived without waiting): each waiter knows what any of them knew (for a barrier of
        whole CTAs: every thread of them, what any knew), and every one's own clock moves on."""
        st, T = self.st, self.T
        ctas = np.unique(st.cta[waiters])
        if not len(senders) and len(waiters) == len(ctas) * T:     # whole CTAs: one vectorised join
            vc = self.vc.reshape(st.num_ctas, T, -1)
            vc[ctas] = vc[ctas].max(axis=1, keepdims=True)
            rows = (ctas[:, None] * T + np.arange(T)).ravel()
            self.vc[rows, np.tile(np.arange(T), len(ctas))] += 1
            return
        for cta in ctas.tolist():
            mine = waiters[st.cta[waiters] == cta]
            told = np.concatenate([mine, senders[st.cta[senders] == cta]])
            self.vc[mine] = self.vc[told].max(axis=0)
            self.vc[told, st.lin[told]] += 1

    def release(self, threads, bar):
        np.maximum.at(bar.clocks_now, self.st.cta[threads], self.vc[threads])
        self.vc[threads, self.st.lin[threads]] += 1

    def acquire(self, threads, bar):
        self.vc[threads] = np.maximum(self.vc[threads], bar.clocks_done[self.st.cta[threads]])

    def phase_completed(self, bar, cta, delivered):
        bar.clocks_done[cta] = np.maximum(bar.clocks_done[cta], bar.clocks_now[cta])
        bar.clocks_now[cta] = 0
        bar.stamp[cta] += 1
        agent = self.barrier_column + bar.slot
        bar.clocks_done[cta, agent] = bar.stamp[cta]
        for granules in delivered:
            self.kind[granules] = ASYNC
            self.w_agent[granules] = agent
            self.w_clock[granules] = bar.stamp[cta]
            self.w_step[granules] = self.tick()

    def initialised(self, threads, bar):
        ctas = self.st.cta[threads]
        bar.init_agent[ctas] = self.st.lin[threads]
        bar.init_clock[ctas] = self.vc[threads, self.st.lin[threads]]
        self.barrier_words.add(bar.offset // 8)

    def check_initialised(self, threads, bar):
        ctas = self.st.cta[threads]
        ok = self.vc[threads, bar.init_agent[ctas]] >= bar.init_clock[ctas]
        if not ok.all():
            i = int(np.flatnonzero(~ok)[0])
            raise Finding(f"uses the mbarrier at {self.where_byte(bar.offset)} initialised by thread "
                          f"{self.xyz(bar.init_agent[ctas[i]])} with no bar.sync in between",
                          threads[i])

    def check_rewrite(self, threads, bar, what):
        """mbarrier.init and mbarrier.inval write the object non-atomically: one thread of a CTA
        at a time, ordered after every earlier use of it (a second init can wipe arrivals
        already made; the usual form: one thread initialises, then a bar.sync)."""
        ctas = self.st.cta[threads]
        makers = np.bincount(ctas)[ctas]
        if (makers > 1).any():
            i = int(np.flatnonzero(makers > 1)[0])
            raise Finding(f"{what} of the mbarrier at {self.where_byte(bar.offset)} by "
                          f"{int(makers[i])} threads of one CTA at once (a plain write of "
                          "the object: one thread makes it, the others wait at a bar.sync)", threads[i])
        unseen = self.vc[threads, :self.T] < bar.touched[ctas]
        if unseen.any():
            i, user = (int(x[0]) for x in np.nonzero(unseen))
            raise Finding(f"{what} of the mbarrier at {self.where_byte(bar.offset)}, which thread "
                          f"{self.xyz(user)} used with no bar.sync in between (it may wipe or "
                          "race that use)", threads[i])

    def touch(self, threads, bar):
        lin = self.st.lin[threads]
        bar.touched[self.st.cta[threads], lin] = self.vc[threads, lin]

    # -- shared memory accesses
    def where_byte(self, offset):
        return self.st.races.where(offset)

    def where(self, granule):
        return self.st.races.where(int(granule) * 16)

    def xyz(self, lin):
        return self.st.races.thread_xyz(lin)

    def _granules(self, off, size, threads):
        if size <= 16:
            return off // 16, threads
        per = size // 16
        return (off[:, None] // 16 + np.arange(per)).ravel(), np.repeat(threads, per)

    def _barrier_words(self, off, size, threads, what):
        if not self.barrier_words:
            return
        words = off % self.st.shared_stride // 8
        hit = np.zeros(len(words), bool)
        for extra in range(max(size // 8, 1)):
            hit |= np.isin(words + extra, list(self.barrier_words))
        if hit.any():
            i = int(np.flatnonzero(hit)[0])
            raise Finding(f"{what} the mbarrier object at {self.where_byte(int(off[i]))}: only mbarrier "
                          "instructions may access it", threads[i])

    def _writer(self, g):
        if self.kind[g] != PLAIN:
            return f"the async copy on line {int(self.w_line[g])}"
        return f"thread {self.xyz(self.st.lin[self.w_thread[g]])}"

    def _check_written(self, g, who, verb):
        """The writes of granules g are complete and acquired by the threads who."""
        kind = self.kind[g]
        if not kind.any():
            return
        pending = kind == PENDING
        if pending.any():
            i = int(np.flatnonzero(pending)[0])
            raise Finding(f"{verb} {self.where(g[i])} while the async copy on line {int(self.w_line[g[i]])} "
                          "writing it is in flight (its mbarrier phase has not completed)", who[i])
        bad = (kind == ASYNC) & (self.vc[who, np.maximum(self.w_agent[g], 0)] < self.w_clock[g])
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise Finding(f"{verb} {self.where(g[i])}, written by the async copy on line "
                          f"{int(self.w_line[g[i]])}, without waiting on the mbarrier phase that "
                          "completes it", who[i])

    def _check_readers(self, g, who, verb):
        """Every earlier read of granules g is ordered before a write by the threads who."""
        clock = self.r_clock[g]
        if not clock.any():
            return
        busy = clock < 0
        if busy.any():
            i, w, _ = (int(x[0]) for x in np.nonzero(busy))
            line = self.tensor_reads[-int(clock[i, w, TENSOR])][0]
            raise Finding(f"{verb} {self.where(g[i])} which the wgmma.mma_async on line {line} of "
                          f"warpgroup {w} may still be reading (no wgmma.wait_group and mbarrier "
                          "release in between)", who[i])
        agent = self.r_agent[g]
        seen = self.vc[who[:, None, None], np.maximum(agent, 0)] >= clock
        if not seen.all():
            i, w, kind = (int(x[0]) for x in np.nonzero(~seen))
            reader = (f"the wgmma.mma_async of warpgroup {w}" if kind == TENSOR
                      else f"thread {self.xyz(agent[i, w, kind])}")
            raise Finding(f"{verb} {self.where(g[i])} which {reader} read with no mbarrier or "
                          "bar.sync ordering that read before this write (write-after-read)", who[i])

    def shared_read(self, off, size, threads):
        """An ordinary load (checked before the epoch tracker records it)."""
        self._barrier_words(off, size, threads, "ordinary load of")
        g, who = self._granules(off, size, threads)
        kind = self.kind[g]
        if not kind.any():
            return
        self._check_written(g, who, "reads")
        done = kind == ASYNC
        lin = self.st.lin[who[done]]
        self.r_agent[g[done], lin // WARPGROUP, ORDINARY] = lin
        self.r_clock[g[done], lin // WARPGROUP, ORDINARY] = self.vc[who[done], lin]

    def shared_write(self, off, size, threads, copy_line=None):
        """An ordinary store or a cp.async issue (checked before the epoch tracker's check)."""
        self._barrier_words(off, size, threads, "ordinary store to")
        g, who = self._granules(off, size, threads)
        self._check_written(g, who, "overwrites")
        self._check_readers(g, who, "overwrites")
        owned = g[self.kind[g] != PLAIN]
        if len(owned):                 # ordered by mbarriers: the epoch tracker cannot judge it
            self.st.races.forget(owned)
        lin = self.st.lin[who]
        self.kind[g] = PLAIN
        self.w_agent[g] = lin
        self.w_clock[g] = self.vc[who, lin]
        self.w_step[g] = self.tick()
        self.w_thread[g] = who
        self.w_line[g] = copy_line or 0
        self.w_generic[g] = True
        self.r_clock[g] = 0

    def async_write(self, g, issuer, line, generic):
        """Granules g become pending: a bulk copy issued by thread issuer, or cp.asyncs handed
        to an mbarrier (generic; already checked at their issue)."""
        if not generic:
            who = np.full(len(g), issuer)
            self._barrier_words(g * 16, 16, who, "async copy to")
            self._check_written(g, who, "async copy overwrites")
            self._check_readers(g, who, "async copy overwrites")
            plain = g[self.kind[g] == PLAIN]
            if len(plain):             # ordinary accesses before it: the epoch tracker's to judge
                self.st.races.write(plain * 16, 16, np.full(len(plain), issuer))
        self.st.races.forget(g)
        self.kind[g] = PENDING
        self.w_thread[g] = issuer
        self.w_line[g] = line
        self.w_generic[g] = generic
        self.r_clock[g] = 0

    def tensor_read(self, g, threads, line):
        """A wgmma of the warpgroup `threads` reads granules g; returns the read's id."""
        self._barrier_words(g * 16, 16, np.full(len(g), threads[0]), "wgmma.mma_async reads")
        kind = self.kind[g]
        pending = np.flatnonzero(kind == PENDING)
        if len(pending):
            i = pending[0]
            raise Finding(f"wgmma.mma_async reads {self.where(g[i])} while the async copy on line "
                          f"{int(self.w_line[g[i]])} writing it is in flight", threads[0])
        unwritten = self.st.races.writes[g[:, None] * 16 + np.arange(16), W_THREAD] == NOBODY
        never = np.flatnonzero((self.w_agent[g] < 0) & (kind == PLAIN) & unwritten.all(axis=1))
        if len(never):
            raise Finding(f"wgmma.mma_async reads {self.where(g[never[0]])}, which no thread of this CTA has "
                          "written (shared memory starts undefined)", threads[0])
        known = np.flatnonzero(self.w_agent[g] >= 0)
        if len(known):
            gk = g[known]
            seen = self.vc[threads][:, self.w_agent[gk]] >= self.w_clock[gk]
            if not seen.all():
                t, i = (int(x[0]) for x in np.nonzero(~seen))
                raise Finding(f"wgmma.mma_async reads {self.where(gk[i])}, written by {self._writer(gk[i])}, "
                              "with no mbarrier wait or bar.sync ordering that write before it", threads[t])
            generic = gk[self.w_generic[gk]]
            fenced = (self.fence[self.w_thread[generic]] > self.w_step[generic]) | (
                self.fence[threads].min() > self.w_step[generic])
            if not fenced.all():
                i = int(np.flatnonzero(~fenced)[0])
                raise Finding(f"wgmma.mma_async reads {self.where(generic[i])}, written through the "
                              f"generic proxy by {self._writer(generic[i])}, with no fence.proxy.async "
                              "in between", threads[0])
        self.read_ids += 1
        read_id = self.read_ids
        self.tensor_reads[read_id] = (line, g)
        w = int(self.wg_local[threads[0]])
        self.r_agent[g, w, TENSOR] = self.T + w
        self.r_clock[g, w, TENSOR] = -read_id
        return read_id

    def tensor_retired(self, read_id, threads, warpgroup):
        w = int(self.wg_local[threads[0]])
        _, g = self.tensor_reads.pop(read_id)
        self.wg_stamp[warpgroup] += 1
        stamp = self.wg_stamp[warpgroup]
        mine = g[self.r_clock[g, w, TENSOR] == -read_id]
        self.r_clock[mine, w, TENSOR] = stamp
        self.vc[threads, self.T + w] = np.maximum(self.vc[threads, self.T + w], stamp)


class AsyncState:
    """Per-wave state of the asynchronous instructions: mbarriers, wgmma groups, registers."""

    def __init__(self, st):
        self.st = st
        self.groups_per_cta = -(-st.cta_threads // WARPGROUP)
        self.barriers = {}                        # CTA-relative shared offset -> Barrier
        self.uncommitted = defaultdict(list)      # wave warpgroup -> [Wgmma]
        self.committed = defaultdict(list)        # wave warpgroup -> [[Wgmma]], oldest first
        self.inflight = {}                        # register id -> wgmmas using it, per thread
        self.inflight_line = {}
        self.accumulated = {}                     # register id -> latest in-flight value
        self.max_registers = {}                   # wave warpgroup -> setmaxnreg count
        # Registers per thread at launch: at most what .maxnreg and the SM's 65536 allow the CTA
        # (.minnctapersm of them), in whole warps, a multiple of 8; setmaxnreg moves them between
        # the CTA's warpgroups, whose pool it is.
        warps = -(-st.cta_threads // 32)
        by_file = 65536 // (st.program.minnctapersm * warps * 32) // 8 * 8
        self.launch_registers = min(st.program.maxnreg or 255, by_file) // 8 * 8
        self.register_pool = self.launch_registers * self.groups_per_cta * WARPGROUP
        self.asked = {}        # wait pc -> per thread: 0, or DECLINED / PARKED since its last true
        self.ordering = Ordering(st, self.groups_per_cta) if st.sanitize else None
        self.written_at = {}                      # register id -> last ordinary write, per thread
        self.read_at = {}                         # register id -> last ordinary read, per thread
        self.operand_reads = False                # a wgmma is reading its own operands
        self.fenced_at = np.full(st.n, -1, np.int64)   # last wgmma.fence, per thread

    def registers_of(self, wg):
        """Registers per thread warpgroup wg holds: its last setmaxnreg, else the launch's."""
        return self.max_registers.get(wg, self.launch_registers)

    def registers_held(self, wg):
        """Registers the warpgroups of wg's CTA hold together."""
        first = wg - wg % self.groups_per_cta
        return sum(self.registers_of(first + w) * WARPGROUP for w in range(self.groups_per_cta))

    def warpgroup_of(self, threads):
        return self.st.cta[threads] * self.groups_per_cta + self.st.lin[threads] // WARPGROUP

    # -- registers (sanitizer)
    def register_written(self, rid, sel):
        """Hook of WaveState.write for registers that are wgmma operands."""
        threads = self.st.indices(sel)
        count = self.inflight.get(rid)
        if count is not None and count[threads].any():
            raise Finding(f"writes {self.st.program.regs[rid].name}, a register operand of the "
                          f"wgmma.mma_async on line {self.inflight_line[rid]} that is still in flight "
                          "(no wgmma.wait_group since)", threads[int(np.flatnonzero(count[threads])[0])])
        clock = self.written_at.setdefault(rid, np.full(self.st.n, -1, np.int64))
        clock[threads] = self.ordering.tick()

    def register_read(self, rid, sel):
        """Hook of WaveState.read for registers that are wgmma operands: an ordinary read, like a
        write, must be ordered before a later wgmma that uses the register by a wgmma.fence (PTX ISA,
        wgmma.fence: "a register access"); the wgmma's own operand reads are not ordinary."""
        if self.operand_reads:
            return
        clock = self.read_at.setdefault(rid, np.full(self.st.n, -1, np.int64))
        clock[self.st.indices(sel)] = self.ordering.tick()

    def lend(self, rid, threads, line):
        """Register rid of these threads is an operand of an issued wgmma."""
        st = self.st
        count = self.inflight.setdefault(rid, np.zeros(st.n, np.int16))
        count[threads] += 1
        self.inflight_line[rid] = line
        if st.regs[rid] is None:
            st.regs[rid] = np.zeros(st.n, st.storage[rid])
            if st.sanitize:
                st.written[rid] = np.zeros(st.n, bool)
        if st.sanitize:
            if rid in st.fully_written:
                st.written[rid][:] = True
                st.fully_written.discard(rid)
            st.written[rid][threads] = False
            st.unwritten_note[rid] = (f"while the wgmma.mma_async on line {line} that uses it is in "
                                      "flight (no wgmma.wait_group since)")

    def give_back(self, rid, threads, values=None):
        st = self.st
        self.inflight[rid][threads] -= 1
        if values is not None:
            st.regs[rid][threads] = values.view(st.storage[rid])
        if st.sanitize:
            settled = self.inflight[rid][threads] == 0
            st.written[rid][threads[settled]] = True

    # -- wgmma groups
    def retire(self, warpgroup, keep):
        """wgmma.wait_group keep: all but the newest `keep` committed groups complete."""
        groups = self.committed[warpgroup]
        while len(groups) > keep:
            for op in groups.pop(0):
                for col, rid in enumerate(op.d_regs):
                    self.give_back(rid, op.threads, op.values[:, col])
                for rid in op.a_regs:
                    self.give_back(rid, op.threads)
                if op.read_id:
                    self.ordering.tensor_retired(op.read_id, op.threads, warpgroup)

    # -- mbarriers
    def barriers_at(self, addr, threads, what):
        """[(Barrier, positions)] of the mbarriers the threads address (CTA-relative)."""
        self.st.segments("shared", addr, 8, threads)       # alignment and bounds
        out = []
        for offset in np.unique(addr):
            pos = np.flatnonzero(addr == offset)
            bar = self.barriers.get(int(offset))
            if bar is None:
                if what != "mbarrier.init":
                    raise Finding(f"{what} on shared byte {int(offset)}, where no mbarrier was "
                                  "initialised", threads[pos[0]])
                if len(self.barriers) == MAX_BARRIERS:
                    raise InterpError(f"more than {MAX_BARRIERS} mbarrier objects")
                columns = self.ordering.columns if self.ordering else 0
                bar = self.barriers[int(offset)] = Barrier(int(offset), len(self.barriers),
                                                           self.st.num_ctas, columns, self.st.cta_threads)
            elif what != "mbarrier.init":
                ctas = self.st.cta[threads[pos]]
                if not bar.ready[ctas].all():
                    i = pos[int(np.flatnonzero(~bar.ready[ctas])[0])]
                    raise Finding(f"{what} on the mbarrier at shared byte {int(offset)} before its "
                                  "mbarrier.init (or after mbarrier.inval)", threads[i])
                if self.ordering:
                    self.ordering.check_initialised(threads[pos], bar)
            if self.ordering:
                if what in ("mbarrier.init", "mbarrier.inval"):
                    self.ordering.check_rewrite(threads[pos], bar, what)
                self.ordering.touch(threads[pos], bar)
            out.append((bar, pos))
        return out

    def init(self, bar, threads, count):
        bad = (count < 1) | (count > COUNT_LIMIT)
        if bad.any():
            raise Finding(f"mbarrier.init with arrival count {int(count[bad][0])} (allowed 1..{COUNT_LIMIT})",
                          threads[int(np.flatnonzero(bad)[0])])
        ctas = self.st.cta[threads]
        bar.ready[ctas] = True
        bar.expected[ctas] = bar.pending[ctas] = count
        bar.tx[ctas] = bar.phase[ctas] = bar.flying[ctas] = bar.deferred[ctas] = 0
        bar.tracked = [p for p in bar.tracked if p.cta not in set(ctas.tolist())]
        if self.ordering:
            bar.clocks_now[ctas] = bar.clocks_done[ctas] = 0
            self.ordering.initialised(threads, bar)

    def arrive(self, bar, threads, count, tx=None, drop=False, release=True):
        """Arrive-on (after an optional expect-tx); returns each thread's phase (its state).
        `drop` (arrive_drop): the arrivals also leave the count every later phase expects;
        release=False (.relaxed): the arrival orders nothing before it."""
        ctas = self.st.cta[threads]
        arriving = np.bincount(ctas, np.broadcast_to(count, ctas.shape), minlength=len(bar.pending))
        # More arrivals than the phase still expects belong to the next one: in a correct kernel the
        # phase has completed by then, so the copies it waits for have landed.
        self.land(bar, np.flatnonzero(arriving > bar.pending), threads)
        state = bar.phase[ctas].copy()
        if tx is not None:
            np.add.at(bar.tx, ctas, tx)
        np.subtract.at(bar.pending, ctas, count)
        if release:
            self.st.ordering.cta_event(threads)
        if drop:
            np.subtract.at(bar.expected, ctas, count)
            gone = bar.expected[ctas] < 1
            if gone.any():
                raise Finding(f"arrive_drop leaves the mbarrier at shared byte {bar.offset} expecting no arrivals",
                              threads[int(np.flatnonzero(gone)[0])])
        _check_arrivals(bar, ctas, bar.pending[ctas] < 0, threads)
        if self.ordering and release:
            self.ordering.release(threads, bar)
        self.settle(bar, ctas, threads)
        return state

    def settle(self, bar, ctas, threads):
        """Complete the phase of every CTA whose arrivals and transactions are all in."""
        outside = np.abs(bar.tx[ctas]) > TX_LIMIT
        if outside.any():
            raise Finding(f"tx-count {int(bar.tx[ctas[outside][0]])} of the mbarrier at shared byte "
                          f"{bar.offset} is outside +-{TX_LIMIT}", threads[int(np.flatnonzero(outside)[0])])
        for cta in np.unique(ctas):
            if not (bar.ready[cta] and bar.pending[cta] == 0 and bar.tx[cta] == 0):
                continue
            done = int(bar.phase[cta])
            bar.phase[cta] += 1
            bar.pending[cta] = bar.expected[cta]
            delivered = [p.granules for p in bar.tracked if p.cta == cta and p.phase == done]
            bar.tracked = [p for p in bar.tracked if not (p.cta == cta and p.phase == done)]
            if self.ordering:
                self.ordering.phase_completed(bar, cta, delivered)

    def defer(self, bar, threads, increment):
        """cp.async.mbarrier.arrive by these threads: the arrive-on comes when their copies land
        (land), the pending count first rising by one each unless .noinc. Their clocks are
        released now, as of the instruction."""
        ctas = self.st.cta[threads]
        per = np.bincount(ctas, minlength=len(bar.pending))
        # As for plain arrivals: a batch the phase cannot take beside the copies still in flight
        # belongs to the next phase, so those have landed and completed this one.
        self.land(bar, np.flatnonzero(bar.deferred + per > bar.pending + increment * per), threads)
        bar.pending += increment * per
        bar.deferred += per
        _check_arrivals(bar, ctas, bar.deferred[ctas] > bar.pending[ctas], threads)
        self.st.ordering.cta_event(threads)
        if self.ordering:
            self.ordering.release(threads, bar)

    def land(self, bar, ctas, threads):
        """The async copies in flight to bar in these CTAs land: the bulk copies' complete_tx
        and the arrivals cp.async.mbarrier.arrive deferred."""
        ctas = np.unique(ctas[(bar.flying[ctas] != 0) | (bar.deferred[ctas] != 0)])
        if len(ctas):
            bar.tx[ctas] -= bar.flying[ctas]
            bar.pending[ctas] -= bar.deferred[ctas]
            bar.flying[ctas] = bar.deferred[ctas] = 0
            _check_arrivals(bar, ctas, bar.pending[ctas] < 0, threads[:1].repeat(len(ctas)))
            self.settle(bar, ctas, threads)

    def check_ended(self, ctas, threads):
        """The last threads of these CTAs exit (`threads`, those exiting now): no async copy into
        their shared memory may be in flight (the PTX ISA gives a CTA's shared memory no life
        beyond its threads)."""
        for bar in self.barriers.values():
            left = [p.cta for p in bar.tracked if p.cta in ctas] + [
                int(c) for c in ctas if bar.flying[c] or bar.deferred[c]]
            if left:
                raise Finding(f"the CTA ends while async copies that the mbarrier at shared byte {bar.offset} "
                              "tracks are in flight: no thread waited for the phase that completes them",
                              threads[self.st.cta[threads] == left[0]][0])

    def track(self, bar, cta, granules, issuer, line, generic):
        """Async writes to granules complete with the current phase of bar in this CTA."""
        bar.tracked.append(PendingWrites(int(cta), int(bar.phase[cta]), granules))
        if self.ordering:
            self.ordering.async_write(granules, issuer, line, generic)


def _check_arrivals(bar, ctas, over, threads):
    """over[i]: CTA ctas[i] had more arrivals than its phase expects (threads[i] the one to name)."""
    if over.any():
        i = int(np.flatnonzero(over)[0])
        raise Finding(f"more arrivals on the mbarrier at shared byte {bar.offset} than its phase "
                      f"expects ({int(bar.expected[ctas[i]])})", threads[i])


def _shared_space(c):
    if not any(m in SHARED_SPACES for m in c.mods):
        c.fail(f"{c.ins.base} needs an explicit .shared::cta (or .shared) state space here")


def _imm(c, op, what):
    if not isinstance(op, Imm) or op.kind != "int":
        c.fail(f"{what} must be an integer immediate")
    return op.value


def _uses_async(c):
    c.prog.async_model = AsyncState


# ---- wgmma --------------------------------------------------------------------------------
@opcode("wgmma")
def _wgmma(c):
    _uses_async(c)
    if "sync" not in c.mods or "aligned" not in c.mods:
        c.fail("wgmma instructions need .sync.aligned")
    action = c.mods[0]
    if action == "fence":
        c.need(0)

        def fence(st, sel):
            s, threads = st.async_state, st.indices(sel)
            warpgroups(st, threads, "wgmma.fence")
            if s.ordering:
                s.fenced_at[threads] = s.ordering.tick()
        return c.alu(fence)
    if action == "commit_group":
        c.need(0)

        def commit(st, sel):
            s = st.async_state
            for group in warpgroups(st, st.indices(sel), "wgmma.commit_group"):
                wg = int(s.warpgroup_of(group[:1])[0])
                s.committed[wg].append(s.uncommitted.pop(wg, []))
        return c.alu(commit)
    if action == "wait_group":
        c.need(1)
        keep = _imm(c, c.ops[0], "wgmma.wait_group's count")

        def wait(st, sel):
            s = st.async_state
            for group in warpgroups(st, st.indices(sel), "wgmma.wait_group"):
                s.retire(int(s.warpgroup_of(group[:1])[0]), keep)
        return c.alu(wait)
    if action == "mma_async":
        return _mma_async(c)
    c.fail(f"unsupported wgmma.{action}")


def _check_fenced(s, groups, regs):
    """wgmma.fence must order every ordinary write of a register operand before the wgmma."""
    threads = groups.ravel()
    never = s.fenced_at[threads] < 0
    if never.any():
        raise Finding("wgmma.mma_async with no wgmma.fence before it in this warpgroup",
                      threads[int(np.flatnonzero(never)[0])])
    for rid in regs:
        for verb, clocks in (("written", s.written_at), ("read", s.read_at)):
            clock = clocks.get(rid)
            if clock is None:
                continue
            late = clock[threads] > s.fenced_at[threads]
            if late.any():
                raise Finding(f"wgmma.mma_async uses {s.st.program.regs[rid].name}, {verb} by an ordinary "
                              "instruction after this warpgroup's last wgmma.fence",
                              threads[int(np.flatnonzero(late)[0])])


def _register(st, s, rid, reader, threads):
    """An operand register; one lent to an in-flight wgmma is read as the async proxy sees it:
    the value the latest wgmma will leave (accumulators chain in issue order)."""
    count = s.inflight.get(rid)
    if count is not None and count[threads].any():
        pending = s.accumulated.get(rid)
        return (pending[threads] if pending is not None else st.regs[rid][threads].view(np.float32))
    return reader(st, threads)


def _shared_operand(st, s, groups, desc, rows, mn_major, kind, what):
    """[warpgroups, rows, 16] float64 elements of a shared-memory operand, and the 16-byte
    granules each warpgroup reads."""
    desc = uniform(np.asarray(desc).reshape(groups.shape), groups, f"the {what} matrix descriptor")
    start, lbo, sbo, base, width = decode_descriptor(desc)
    if base.any():
        raise Finding("matrix descriptors with a non-zero base offset are not supported",
                      groups[int(np.flatnonzero(base.ravel())[0])][0], sanitizer=False)
    addr = operand_addresses(start, lbo, sbo, width, rows, mn_major)
    bad = ((addr < SHARED_BASE) | (addr + 2 > st.shared_size)).any(axis=(1, 2))
    if bad.any():
        wg = int(np.flatnonzero(bad)[0])
        raise Finding(f"the {what} operand of wgmma.mma_async reaches shared bytes [{int(addr[wg].min()):#x}, "
                      f"{int(addr[wg].max()) + 2:#x}), outside the CTA's shared memory [{SHARED_BASE:#x}, "
                      f"{st.shared_size:#x})", groups[wg][0])
    wave = addr + (st.cta[groups[:, 0]] * st.shared_stride)[:, None, None]
    granules = [np.unique(w // 16) for w in wave] if s.ordering else None
    return _halves_to_f64(np.take(st.shared.view(np.uint16), wave // 2), kind), granules


def _mma_async(c):
    shape = next((m for m in c.mods if m.startswith("m64n") and m.endswith("k16")), "")
    n = int(shape[4:-3]) if shape[4:-3].isdigit() else 0
    if not (8 <= n <= 256 and n % 8 == 0) or len(c.types) != 3 or c.types[0] != "f32" \
            or c.types[1] != c.types[2] or c.types[1] not in ("f16", "bf16"):
        c.fail("only wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}.{f16,bf16} is supported")
    kind = c.types[1]
    d, a = c.ops[0], c.ops[1]
    registers_a = isinstance(a, Vec)
    c.need(7 if registers_a else 8)
    if not isinstance(d, Vec) or len(d.items) != n // 2:
        c.fail(f"m64n{n}k16 with f32 accumulators takes {n // 2} registers in d")
    if registers_a and len(a.items) != 4:
        c.fail("A in registers takes four .b32 registers")
    if not isinstance(c.ops[2], Reg) or not (registers_a or isinstance(a, Reg)):
        c.fail("matrix descriptors must be .b64 registers")
    scale_a, scale_b = (_imm(c, op, "imm-scale-a/b") for op in c.ops[4:6])
    trans = [_imm(c, op, "imm-trans-a/b") for op in c.ops[6:]]
    if {scale_a, scale_b} - {1, -1} or set(trans) - {0, 1}:
        c.fail("imm-scale-a/b must be 1 or -1 and imm-trans-a/b 0 or 1")
    trans_a, trans_b = (0, trans[0]) if registers_a else trans
    d_regs = tuple(x.id for x in d.items)
    a_regs = tuple(x.id for x in a.items) if registers_a else ()
    c.prog.async_registers.update(d_regs + a_regs)
    read_d = [c.read(x, "f32") for x in d.items]
    read_a = [c.read(x, "b32") for x in a.items] if registers_a else c.read(a, "b64")
    read_b, read_scale_d = c.read(c.ops[2], "b64"), c.read(c.ops[3], "pred")
    line, sign = c.ins.line, float(scale_a * scale_b)

    def _operands(st, s, groups, threads):
        """A [warpgroups, 64, 16], B [warpgroups, n, 16], scale-d, the accumulators' values
        [warpgroups, 64, n] and the shared-memory granules read."""
        nw, reads = len(groups), []
        if registers_a:
            words = np.stack([np.asarray(_register(st, s, rid, r, threads)).view(np.uint32)
                              for rid, r in zip(a_regs, read_a)], 1)
            matrix_a = np.zeros((nw, 64, 16))
            matrix_a[:, A_ROW, A_COL] = _halves_to_f64(words, kind).reshape(nw, WARPGROUP, 8)
        else:
            matrix_a, granules = _shared_operand(st, s, groups, read_a(st, threads), 64, trans_a, kind, "A")
            reads.append(granules)
        matrix_b, granules = _shared_operand(st, s, groups, read_b(st, threads), n, trans_b, kind, "B")
        reads.append(granules)
        scale_d = uniform(np.broadcast_to(read_scale_d(st, threads), threads.shape).reshape(nw, -1),
                          groups, "scale-d")
        acc = np.zeros((nw, 64, n))
        if scale_d.any():
            for i, (rid, r) in enumerate(zip(d_regs, read_d)):
                values = np.asarray(_register(st, s, rid, r, threads), np.float64).reshape(nw, WARPGROUP)
                acc[:, D_ROW[:, i], D_COL[:, i]] = np.where(scale_d[:, None], values, 0.0)
        return matrix_a, matrix_b, scale_d, acc, reads

    def run(st, sel):
        s = st.async_state
        groups = warpgroups(st, st.indices(sel), "wgmma.mma_async")
        threads = groups.ravel()
        if s.ordering:
            _check_fenced(s, groups, d_regs + a_regs)
        s.operand_reads = True
        try:
            matrix_a, matrix_b, scale_d, acc, reads = _operands(st, s, groups, threads)
        finally:
            s.operand_reads = False
        product = sign * np.matmul(matrix_a, matrix_b.transpose(0, 2, 1)) + acc
        out = product[:, D_ROW[:, :n // 2], D_COL[:, :n // 2]].astype(np.float32)   # one rounding
        for i, group in enumerate(groups):
            read_id = 0
            if s.ordering:
                read_id = s.ordering.tensor_read(np.unique(np.concatenate([r[i] for r in reads])), group, line)
            wg = int(s.warpgroup_of(group[:1])[0])
            for col, rid in enumerate(d_regs):
                s.accumulated.setdefault(rid, np.zeros(st.n, np.float32))[group] = out[i, :, col]
                s.lend(rid, group, line)
            for rid in a_regs:
                s.lend(rid, group, line)
            s.uncommitted[wg].append(Wgmma(group, d_regs, out[i], a_regs, read_id))
    return c.alu(run)


# ---- mbarrier -----------------------------------------------------------------------------
@opcode("mbarrier")
def _mbarrier(c):
    _uses_async(c)
    _shared_space(c)
    action = c.mods[0]
    name = f"mbarrier.{action}"
    relaxed = "relaxed" in c.mods       # .relaxed: an arrive releases nothing, a wait acquires nothing
    address = c.address(c.ops[1] if action in ("arrive", "arrive_drop", "test_wait", "try_wait") else c.ops[0],
                        "shared")
    if action in ("init", "expect_tx"):
        c.need(2)
        value = c.read(1, "u32")

        def run(st, sel):
            s = st.async_state
            threads = st.indices(sel)
            amount = np.broadcast_to(np.asarray(value(st, sel)).astype(np.int64), threads.shape)
            for bar, pos in s.barriers_at(address(st, sel), threads, name):
                if action == "init":
                    s.init(bar, threads[pos], amount[pos])
                else:
                    ctas = st.cta[threads[pos]]
                    np.add.at(bar.tx, ctas, amount[pos])
                    s.settle(bar, ctas, threads[pos])
        return c.alu(run)
    if action == "inval":
        c.need(1)

        def inval(st, sel):
            s = st.async_state
            threads = st.indices(sel)
            for bar, pos in s.barriers_at(address(st, sel), threads, name):
                bar.ready[st.cta[threads[pos]]] = False
        return c.alu(inval)
    if action in ("arrive", "arrive_drop"):
        expect, drop = "expect_tx" in c.mods, action == "arrive_drop"
        if len(c.ops) not in (2, 3) or (expect and len(c.ops) != 3):
            c.fail("expected state, [mbarrier] and an optional count (the tx count with .expect_tx)")
        state = c.write(0, "b64")
        amount = c.read(2, "u32") if len(c.ops) == 3 else (lambda st, sel: 1)

        def arrive(st, sel):
            s = st.async_state
            threads = st.indices(sel)
            value = np.broadcast_to(np.asarray(amount(st, sel)).astype(np.int64), threads.shape)
            phases = np.zeros(len(threads), np.uint64)
            for bar, pos in s.barriers_at(address(st, sel), threads, name):
                if expect:
                    phases[pos] = s.arrive(bar, threads[pos], 1, tx=value[pos], drop=drop, release=not relaxed)
                else:
                    phases[pos] = s.arrive(bar, threads[pos], value[pos], drop=drop, release=not relaxed)
            state(st, sel, phases)
        return c.alu(arrive)
    if action in ("test_wait", "try_wait"):
        parity = "parity" in c.mods
        if len(c.ops) not in (3, 4):
            c.fail("expected waitComplete, [mbarrier], state or phaseParity{, suspendTimeHint}")
        done_w, target = c.write(0, "pred"), c.read(2, "u32" if parity else "b64")

        def wait(st, sel):
            """Returns the threads that must park: their phase has not completed, and this
            instruction already answered them false (a first answer false lets a kernel that
            ignores it read early, where the sanitizer sees it; hardware may time out too).
            Copies in flight land only for a thread that parked here and is retried, once
            nothing else could run: a thread polling in a loop lets every other one go first,
            as a producer may run ahead while the copies are on their way."""
            s = st.async_state
            threads = st.indices(sel)
            want = np.broadcast_to(np.asarray(target(st, sel)).astype(np.int64), threads.shape)
            blocked = np.zeros(len(threads), bool)
            asked = s.asked.setdefault(st.pc, np.zeros(st.n, np.int8))
            for bar, pos in s.barriers_at(address(st, sel), threads, name):
                retried = threads[pos][asked[threads[pos]] == PARKED]
                if len(retried):
                    s.land(bar, st.cta[retried], retried)
                phase = bar.phase[st.cta[threads[pos]]]
                done = phase % 2 != want[pos] % 2 if parity else phase > want[pos]
                blocked[pos[~done]] = True
                if done.any() and not relaxed:
                    st.ordering.cta_event(threads[pos[done]])
                    if s.ordering:
                        s.ordering.acquire(threads[pos[done]], bar)
            first = blocked & (asked[threads] == 0)
            asked[threads[blocked]] = np.where(first[blocked], DECLINED, PARKED)
            asked[threads[~blocked]] = 0
            if first.any():
                done_w(st, threads[first], np.False_)
            if not blocked.all():
                done_w(st, threads[~blocked], np.True_)
            return blocked & ~first
        return Exec(c.ins, "wait", wait, target="an mbarrier phase that never completes")
    c.fail(f"unsupported {name}")


# ---- asynchronous copies ------------------------------------------------------------------
_PLAIN_CP = COMPILERS["cp"]


@opcode("cp")
def _cp(c):
    if c.mods[:3] == ["async", "bulk", "tensor"]:
        return _tensor_copy(c)
    if c.mods[:2] == ["async", "bulk"]:
        return _bulk_copy(c)
    if c.mods[:2] == ["async", "mbarrier"]:
        return _copies_arrive(c)
    return _PLAIN_CP(c)


def _bulk_copy(c):
    _uses_async(c)
    if ("global" not in c.mods or not any(m in SHARED_SPACES for m in c.mods)
            or "mbarrier::complete_tx::bytes" not in c.mods or c.mods.index("global") < 2
            or any(m.startswith("multicast") for m in c.mods)):
        c.fail("only cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [src], "
               "size, [mbar] is supported (no tensor maps, multicast or bulk groups)")
    if len(c.ops) not in (4, 5):
        c.fail("expected [dst], [src], size, [mbar]{, cache-policy}")
    dst, src = c.address(c.ops[0], "shared"), c.address(c.ops[1], "global")
    size, mbar, line = c.read(2, "u32"), c.address(c.ops[3], "shared"), c.ins.line

    def run(st, sel):
        s = st.async_state
        threads = st.indices(sel)
        to, frm, where = dst(st, sel), src(st, sel), mbar(st, sel)
        nbytes = np.broadcast_to(np.asarray(size(st, sel)).astype(np.int64), threads.shape)
        bad = (nbytes <= 0) | (nbytes % 16 != 0) | (to % 16 != 0) | (frm % 16 != 0)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise Finding(f"cp.async.bulk of {int(nbytes[i])} bytes from {int(frm[i]):#x} to shared byte "
                          f"{int(to[i])}: size and both addresses must be multiples of 16", threads[i])
        for bar, pos in s.barriers_at(where, threads, "cp.async.bulk"):
            for i in pos:
                units, thread = int(nbytes[i]) // 16, threads[i]
                issuer = np.full(units, thread)
                data = st.load("global", frm[i] + 16 * np.arange(units), 1, 16, issuer)
                (_, offsets, _), = st.segments("shared", to[i] + 16 * np.arange(units), 16, issuer)
                cta = st.cta[thread]
                s.track(bar, cta, offsets // 16, thread, line, generic=False)
                view = st.view("shared", 16)
                np.put(view, offsets // 16, np.ascontiguousarray(data).view(view.dtype).ravel())
                bar.flying[cta] += int(nbytes[i])          # complete_tx once a wait is retried: s.land
    return c.alu(run)


class TensorMapRecord(NamedTuple):
    """The interpreter's tensor map (abi.TensorMap at one launch): the array's global address and
    element size, dims innermost first (the array's shape reversed, rows packed), the box, the
    swizzle span in bytes (0 or 128)."""
    address: int
    itemsize: int
    dims: tuple
    box: tuple
    swizzle: int


def _tensor_copy(c):
    """cp.async.bulk.tensor.Nd global -> shared, tile mode, on an mbarrier: the box at the
    coordinates (innermost first, signed), elements past the array's edges zero-filled, stored
    row-major in the box's order from dst on (128-byte aligned), with the map's 128-byte swizzle
    applied to the shared address bits (chunk bits 4-6 ^= row bits 7-9); the whole box's bytes
    complete_tx on the mbarrier, as for a bulk copy."""
    _uses_async(c)
    rank = next((int(m[0]) for m in c.mods if re.fullmatch(r"[1-5]d", m)), 0)
    known = {"async", "bulk", "tensor", f"{rank}d", "global", "tile", "mbarrier::complete_tx::bytes",
             *SHARED_SPACES}
    if not rank or "global" not in c.mods or not any(m in SHARED_SPACES for m in c.mods) or set(c.mods) - known:
        c.fail("only cp.async.bulk.tensor.Nd.shared::cluster.global{.tile}.mbarrier::complete_tx::bytes "
               "[dst], [tensorMap, {coordinates}], [mbar] is supported (no im2col, multicast or cache hints)")
    if len(c.ops) != 3 or not isinstance(c.ops[1], TensorAddr) or len(c.ops[1].coords.items) != rank:
        c.fail(f"expected [dst], [tensorMap, {{{rank} coordinates}}], [mbar]")
    dst, mbar, line = c.address(c.ops[0], "shared"), c.address(c.ops[2], "shared"), c.ins.line
    where = c.read(c.ops[1].base, "u64")
    coords = [c.read(item, "s32") for item in c.ops[1].coords.items]
    maps = {tensor_map_address(i): name for i, (name, kind) in enumerate(c.prog.params) if kind == TENSOR_MAP}

    def run(st, sel):
        s = st.async_state
        threads = st.indices(sel)
        to, bars = dst(st, sel), mbar(st, sel)
        at = np.broadcast_to(np.asarray(where(st, sel)).astype(np.int64), threads.shape)
        at_coords = [np.broadcast_to(np.asarray(read(st, sel)).astype(np.int64), threads.shape) for read in coords]
        for bar, pos in s.barriers_at(bars, threads, "cp.async.bulk.tensor"):
            for i in pos:
                thread, name = threads[i], maps.get(int(at[i]))
                if name is None:
                    raise Finding(f"cp.async.bulk.tensor: {int(at[i]):#x} is not the address of a tensor-map "
                                  "parameter", thread)
                record = st.params[name]
                if len(record.dims) != rank:
                    raise Finding(f"cp.async.bulk.tensor.{rank}d on tensor map {name} of rank "
                                  f"{len(record.dims)}", thread)
                if to[i] % 128:
                    raise Finding(f"cp.async.bulk.tensor to shared byte {int(to[i])}: the destination must "
                                  "be 128-byte aligned", thread)
                box = _box_bytes(st, record, [int(a[i]) for a in at_coords], thread)
                units = np.arange(box.size // 16)
                slots = int(to[i]) + 16 * units
                if record.swizzle:
                    slots ^= ((slots >> 7) & 7) << 4
                issuer = np.full(units.size, thread)
                (_, offsets, _), = st.segments("shared", slots, 16, issuer)
                cta = st.cta[thread]
                s.track(bar, cta, offsets // 16, thread, line, generic=False)
                view = st.view("shared", 16)
                np.put(view, offsets // 16, box.view(view.dtype))
                bar.flying[cta] += box.size
    return c.alu(run)


def _box_bytes(st, record, start, thread):
    """The bytes of the box at `start` (innermost first), read from global memory where every
    coordinate is within its dimension, zeros elsewhere."""
    grids = np.meshgrid(*[np.arange(b) + s for b, s in zip(reversed(record.box), reversed(start))], indexing="ij")
    index = [g.ravel() for g in reversed(grids)]            # innermost first, box order
    inside = np.logical_and.reduce([(x >= 0) & (x < d) for x, d in zip(index, record.dims)])
    flat = np.zeros(inside.size, np.int64)
    for x, d in zip(reversed(index), reversed(record.dims)):
        flat = flat * d + x
    size = record.itemsize
    out = np.zeros((inside.size, size), np.uint8)
    if inside.any():
        where = record.address + size * flat[inside]
        out[inside] = st.load("global", where, 1, size, np.full(where.size, thread))
    return out.reshape(-1)


def _copies_arrive(c):
    """cp.async.mbarrier.arrive{.noinc}: an arrive-on once this thread's earlier cp.asyncs land
    (AsyncState.defer); without .noinc the pending count first rises by one, so it is no net
    arrival."""
    _uses_async(c)
    _shared_space(c)
    c.need(1)
    address, increment = c.address(c.ops[0], "shared"), int("noinc" not in c.mods)

    def run(st, sel):
        s = st.async_state
        threads = st.indices(sel)
        for bar, pos in s.barriers_at(address(st, sel), threads, "cp.async.mbarrier.arrive"):
            mine = threads[pos]
            if st.races is not None:
                for copy in st.races.take_copies(mine):
                    granules = copy.rows * copy.size // 16
                    for cta in np.unique(st.cta[copy.threads]):
                        here = st.cta[copy.threads] == cta
                        s.track(bar, cta, granules[here], copy.threads[here], copy.line, generic=True)
            s.defer(bar, mine, increment)
    return c.alu(run)


# ---- fences, register budget, election --------------------------------------------------
_PLAIN_FENCE = COMPILERS["fence"]


@opcode("fence")
def _fence(c):
    if c.mods[:2] != ["proxy", "async"]:
        return _PLAIN_FENCE(c)
    _uses_async(c)
    space = c.mods[2:]
    if space not in ([], ["global"], ["shared::cta"], ["shared::cluster"]):
        c.fail("expected fence.proxy.async{.global, .shared::cta, .shared::cluster}")
    if space == ["global"]:             # orders global memory only: nothing the sanitizer tracks
        return c.alu(lambda st, sel: None)

    def run(st, sel):
        s = st.async_state
        if s.ordering:
            s.ordering.fence[st.indices(sel)] = s.ordering.tick()
    return c.alu(run)


@opcode("setmaxnreg")
def _setmaxnreg(c):
    _uses_async(c)
    action = c.pick(("inc", "dec"))
    if action is None or "sync" not in c.mods or "aligned" not in c.mods or c.type != "u32":
        c.fail("expected setmaxnreg.{inc,dec}.sync.aligned.u32 count")
    c.need(1)
    count = _imm(c, c.ops[0], "setmaxnreg's register count")
    if not (24 <= count <= 256 and count % 8 == 0):
        c.fail(f"setmaxnreg count {count}: it must be a multiple of 8 in 24..256")

    def run(st, sel):
        """Returns the threads that must park: an inc waits until the CTA's warpgroups have
        given back enough of the launch's registers (setmaxnreg.dec)."""
        s = st.async_state
        threads = st.indices(sel)
        blocked = np.zeros(len(threads), bool)
        for k, group in enumerate(warpgroups(st, threads, "setmaxnreg")):
            wg = int(s.warpgroup_of(group[:1])[0])
            before = s.registers_of(wg)
            if count < before if action == "inc" else count > before:
                raise Finding(f"setmaxnreg.{action} to {count} registers from {before}", group[0])
            if action == "inc" and s.registers_held(wg) + (count - before) * WARPGROUP > s.register_pool:
                blocked[k * WARPGROUP:(k + 1) * WARPGROUP] = True
                continue
            s.max_registers[wg] = count
        return blocked
    return Exec(c.ins, "wait", run, target="registers that no warpgroup of the CTA gives back (setmaxnreg.dec)")


@opcode("elect")
def _elect(c):
    if c.mods != ["sync"]:
        c.fail("only elect.sync is supported")
    c.need(2)
    d = c.ops[0]
    lane_op, pred_op = (d.first, d.second) if isinstance(d, Pair) else (d, None)
    lane_w, mask = c.write(lane_op, "b32"), c.read(1, "b32")
    pred_w = c.write(pred_op, "pred") if pred_op is not None else None

    def run(st, sel):
        threads = st.indices(sel)
        members = np.broadcast_to(np.asarray(mask(st, sel)).astype(np.uint64), threads.shape)
        members = members & warp_members(st, threads, members, "elect.sync")
        leader = np.log2((members & (~members + np.uint64(1))).astype(np.float64)).astype(np.uint32)
        lane_w(st, sel, leader)
        if pred_w:
            pred_w(st, sel, st.lane[threads] == leader)
    return c.alu(run)
