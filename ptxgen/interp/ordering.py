"""Global-memory ordering of one launch: which CTA and thread wrote each global byte, which of
its CTA's releases cover that write, and which releases each thread has acquired. A simplified
release/acquire happens-before of the PTX memory consistency model (PTX ISA chapter 8): a
release is cumulative over the writes that precede it in causality order (the releasing
thread's own, and other threads' writes that a bar.sync put before it) and over what the
releasing threads acquired; an acquisition belongs to the threads that made it until a barrier
passes it on; only .gpu/.sys scope operations order across CTAs.

Rules
- Epoch: each CTA counts its events: releases, and completed bar.syncs after which some write
  (or recorded read, below) of the CTA came before it (a bar.sync with no global access since
  the last event needs no epoch of its own). Every global write is stamped with (CTA, epoch, strong?, instruction),
  and the writing thread (when the program releases at all).
- Release: fence.sc / fence.acq_rel / fence.release / membar.gl|sys at .gpu or .sys scope, or a
  st/atom/red with .release or .acq_rel, by some threads of the CTA: its epoch goes up by one;
  the release covers the releasing threads' own earlier writes (each thread's first release
  after a write of its own is kept) and every thread's writes before the CTA's last bar.sync
  (all its threads' writes when every thread of the CTA releases in that one step). Its clock
  (per CTA, the newest release that the releasing threads acquired and the epoch below which
  that release covers every thread's writes; its own new release and cover) becomes its
  released clock.
- Publication (a release pattern's write, ISA 8.8): a strong write at .gpu/.sys scope
  (st.relaxed|release|volatile, atom, red) attaches the writer's released clock to the
  location. An atomic joins it to the clock the location carries (read-modify-writes continue
  the chain that observation follows, ISA 8.9.2); a strong store replaces it; a weak store
  erases it.
- Observation (an acquire pattern's read): a strong read at .gpu/.sys scope (ld.relaxed|acquire|
  volatile, atom; not red, whose read forms no acquire pattern) takes the location's clock;
  with .acquire/.acq_rel the reading thread acquires it at once, otherwise its CTA keeps it and
  each later fence.sc/acq_rel/acquire acquires it for the fencing threads.
- Acquisition (an acquire pattern orders its own thread's later accesses, ISA 8.8): a thread
  has acquired its CTA's clock joined with its own (a row shared by threads that acquired the
  same; kept only for threads that acquired more than their CTA). A bar.sync / barrier.sync
  that all the CTA's threads wait at makes their acquisitions the CTA's; one of part of the
  CTA (a named barrier with a count) passes its participants' (waiters', and those that came
  with bar.arrive) to its waiters; a bar.warp.sync passes each lane's to the lanes of its
  member mask. Nothing else passes one on: not a shfl.sync, vote or reconvergence (running in
  lockstep orders no memory), not an mbarrier, not a fence of another thread.
- A read of bytes that thread t of CTA w wrote at epoch e, by a thread of another CTA r, is
  ordered iff that thread acquired a release of w, newest at epoch K, with a bar.sync of w
  between the write and that release (e below its cover), or with a release by t itself after
  the write at an epoch up to K. Unordered it is a finding, unless both accesses are strong
  (morally strong: no data race). A .nc / ldu read (non-coherent path) of any byte written in
  this launch is a finding, and so is a write (by any CTA or thread) to bytes a .nc / ldu load
  read earlier in the launch (.nc needs them read-only for the whole kernel; the finding names
  both instructions); so is a weak write over bytes another CTA wrote weakly (unordered) and an
  atomic on bytes another CTA wrote weakly (unordered).
- Write after read (sanitizer on): a write (weak or strong, any CTA) over bytes that thread t of
  another CTA r read weakly earlier in the launch is ordered iff the writing thread acquired a
  release of r, newest at epoch K, with a bar.sync of r between the read and that release, or a
  release by t itself after the read at an epoch up to K: the rule above with the roles swapped.
  Unordered it is a finding naming both instructions and threads (on a GPU the write may land
  first and the read see its value). Reads are recorded from the launch's start in the arrays
  the launch says the kernel may write (launch's `written`: outputs, in-out arrays such as a
  residual or a KV cache, workspaces; every array when it is not told), and in any other array
  from its first write in the launch; never in arrays only read (weights, inputs), and an
  array's records are made at its first recorded read, so one only written, or only accessed
  by strong reads and atomics (counters, flags), has none. Each byte keeps its newest weak read
  (a ld with no memory-order qualifier) and the newest weak read by a CTA other than that one's
  (an access whose bytes had different newest reads is kept byte by byte); a recorded read
  counts as its thread's access for the thread's next release, as a write does.
- Coherence of strong accesses (no race, but an order a kernel may wrongly rely on): every
  strong access at .gpu/.sys scope gets a sequence number; each location keeps, per CTA, its
  newest strong write and its newest strong read, and a strong read (ld, atom; not red) lets
  its CTA observe the location's writes: per CTA w, the newest strong write of w seen so far. A
  strong access (read, atomic or store) by CTA r to a location, where w's newest strong write M
  of it is newer than r's last strong read of it (that read's value was not M's or later) and
  the newest strong write of w that r observed (through any location) came after M in the
  program order of M's thread (a later instruction of that thread), relies on M coming first in
  coherence order, which only happens-before (ISA 8.9.3) guarantees: it is a finding unless a
  release of w that r acquired covers M (as for a read above, but what any thread of r
  acquired). This is the message-passing pattern on atomics: argmax's atom.max of the key, then
  atom.add of the count with no membar.gl between; the CTA completing the count need not see
  the key.
- Findings name why: a publishing atomic not preceded by a release of the data it publishes
  (a flag or counter) names the atomic; an acquired release that does not cover the write (no
  bar.sync between another thread's write and it) names the release and both threads; an
  acquisition that another thread of the reader's CTA made but no barrier passed on says so;
  a write after an unordered read names the read's instruction and thread, and the reader's
  release that does not cover it, or that the reader never released or the writer never
  acquired.

Values: an unordered weak or .nc read sees the bytes as they were before that write (the
writer's store still in flight, or a stale line of the non-coherent cache), so with the
sanitizer off an ordering bug gives a wrong answer rather than only a finding. The same
coverage decides, so a store no release covers reads as stale even when lockstep scheduling
ran it before the release. A write after an unordered read changes no value (lockstep ran the
read first, and the value a GPU's read might see is the write's own): only the sanitizer
reports it.

Limits: only the newest acquired release of each CTA is kept, so a release of thread t at an
epoch up to it counts even if the reader acquired only a later release of another thread; a
relaxed read's observation counts for its whole CTA (the model wants the read and the fence in
one thread; kept per CTA so that a count-in, thread 0's relaxed atomic, a bar.sync, then a
fence by every thread, passes); a named barrier's bar.arrive threads pass on what they acquired
by the time it completes; mbarrier waits order no global writes and pass on no acquisition
(only bar.sync does, and bar.warp.sync for acquisitions). A read-then-write (write-after-read)
is tracked across CTAs only, with the sanitizer on (values do not change: the read ran first),
and not for reads, before its first write in the launch, of an array the launch was told the
kernel only reads (a kernel that writes an "in" array), older readers than a byte's two kept
ones (a third CTA's read that two others' later reads replaced), reads with a memory-order
qualifier at any scope (ld.relaxed/acquire/volatile, and .cta ones, which poll a flag: a write
after one is not checked; a poll at the wrong scope is the read-after-write check's finding on
what it guards) or an atomic's read; inside one CTA it is not tracked, except a write after a
.nc / ldu read (by any CTA); .cluster
scope counts as .cta (the interpreter launches no clusters). Coherence: only each CTA's newest
strong write and read of a location count (locations are byte offsets where accesses start; a
word accessed at two sizes is two), the observed write must be the newest of its CTA that the
observer saw and be by M's thread (program order; one that a bar.sync put after M in another
thread is not taken as later), observation is not transitive (r sees what w wrote to the
locations r reads, not what w had observed), a failing atom.cas counts as a write, and the
check needs the sanitizer (values do not change: strong accesses land as the scheduler runs
them; launch's hold_back makes the orders that show such a bug happen). Each location's record
costs 32 bytes per CTA of the grid, for every location a strong write reaches: fine for
counters and flags, not for atomics spread over large arrays with large grids. Read records cost
20 bytes per byte of each array that is weakly read and may be written (write records 8, or 10
with threads, per byte of each array written): a KV cache is the largest.

Inside one CTA (sanitizer on): a read or write of bytes another warp of the CTA wrote since
the CTA's last synchronisation after a write is a race unless both accesses are strong (any
scope); so are two warps storing to the same bytes in one instruction. Synchronisation here is
any bar.sync or named barrier, mbarrier arrive or completed wait, fence, or release/acquire of
any scope, whoever did it: a race across one of those is missed. Lanes of one warp count as
ordered (they run in lockstep here).
"""
from typing import NamedTuple

import numpy as np

from ..errors import InterpError
from .findings import Finding
from .state import item

# A byte's record: strong bit | CTA + 1 (0 = not written in this launch) | epoch | instruction.
STRONG = np.uint64(1 << 63)
CTA_SHIFT, CTA_BITS = 39, 24
EPOCH_SHIFT, EPOCH_BITS = 19, 20
PC_BITS = 19
KEY_MASK = np.uint64((1 << (CTA_BITS + EPOCH_BITS)) - 1)     # (CTA, epoch) after >> EPOCH_SHIFT
# A release by a thread that wrote since its previous release, as a sorted int64 key:
# CTA | thread in its CTA (a CTA has at most 1024) | epoch of the release.
OWN_THREAD_SHIFT, OWN_CTA_SHIFT = EPOCH_BITS, EPOCH_BITS + 10
# A strong access's sequence number (_coherence): its step << STEP_SHIFT | its place in the serial
# order of its location's accesses in that step (a step has fewer than 2^18 threads).
STEP_SHIFT = 20
_SCOPES = ("cta", "cluster", "gpu", "sys")
_VERBS = {"read": "reads", "write": "overwrites", "atomic": "atomically updates"}   # findings' wording
_SEMANTICS = ("relaxed", "acquire", "release", "acq_rel", "volatile", "mmio", "sc")


class Access(NamedTuple):
    """How an instruction accesses global memory, for the ordering rules."""
    strong: bool = False      # strong at .gpu/.sys scope: morally strong with other CTAs' strong ops
    acquire: bool = False
    release: bool = False
    observes: bool = False    # a strong read that can form an acquire pattern
    nc: bool = False          # the non-coherent read-only path (.nc, ldu)
    orders: bool = False      # .release/.acquire/.acq_rel at any scope (a CTA's own synchronisation)
    qualified: bool = False   # a memory-order qualifier at any scope (strong among its CTA's threads)


WEAK = Access()


def access_of(base, mods):
    """The Access of a ld/ldu/st/atom/red/cp with these modifiers."""
    scope = next((m for m in mods if m in _SCOPES), None)
    sem = next((m for m in mods if m in _SEMANTICS), None)
    if base in ("atom", "red"):
        sem = sem or "relaxed"            # atomics default to .relaxed.gpu
    strong = sem is not None and scope not in ("cta", "cluster")
    return Access(strong=strong,
                  acquire=strong and sem in ("acquire", "acq_rel"),
                  release=strong and sem in ("release", "acq_rel"),
                  observes=strong and base in ("ld", "atom"),
                  nc=base == "ldu" or "nc" in mods,
                  orders=sem in ("release", "acquire", "acq_rel"),
                  qualified=sem is not None)


def fence_of(base, mods):
    """(acquire, release) of a membar/fence across CTAs, or None (CTA scope, proxy fences)."""
    if base == "membar":
        return (True, True) if ("gl" in mods or "sys" in mods) else None
    if any(m.startswith(("proxy", "mbarrier_init")) for m in mods):
        return None
    if next((m for m in mods if m in _SCOPES), "gpu") in ("cta", "cluster"):
        return None
    if "acquire" in mods:
        return True, False
    if "release" in mods:
        return False, True
    return True, True                        # .sc and .acq_rel


def synchronises(ins):
    """Whether an instruction orders or publishes global memory across CTAs: a global (or
    generic) atomic, a .gpu/.sys fence, a strong global load or store."""
    if "shared" in ins.mods or "shared::cta" in ins.mods:
        return False
    if ins.base in ("atom", "red"):
        return True
    if ins.base in ("ld", "st"):
        return access_of(ins.base, ins.mods).strong
    return ins.base in ("fence", "membar") and fence_of(ins.base, ins.mods) is not None


def _strong_in_cta(ins):
    """Whether an access is strong among the threads of one CTA: an atomic, or a ld/st with a
    memory-order qualifier (any scope covers the CTA)."""
    return ins.base in ("atom", "red") or any(m in _SEMANTICS for m in ins.mods)


def _stamp(ctas, epochs, strong, pc):
    rec = ((ctas.astype(np.uint64) + np.uint64(1)) << np.uint64(CTA_SHIFT)) | (
        epochs.astype(np.uint64) << np.uint64(EPOCH_SHIFT)) | np.uint64(pc)
    return rec | STRONG if strong else rec


def _releases(program):
    """Whether any instruction of the program releases at .gpu/.sys scope."""
    for ins in program.instructions:
        if ins.base in ("fence", "membar"):
            effect = fence_of(ins.base, ins.mods)
            if effect is not None and effect[1]:
                return True
        elif ins.base in ("st", "atom", "red") and access_of(ins.base, ins.mods).release:
            return True
    return False


class Ordering:
    """The ordering state of one launch; WaveState calls it for every global access, launch
    at every completed CTA barrier."""

    def __init__(self, memory, grid, program, sanitize, written=None):
        num_ctas = grid[0] * grid[1] * grid[2]
        if num_ctas >= 1 << CTA_BITS or len(program.instructions) >= 1 << PC_BITS:
            raise InterpError(f"the memory-ordering model handles < 2^{CTA_BITS} CTAs and < 2^{PC_BITS} "
                              f"instructions (grid {grid}, {len(program.instructions)} instructions)")
        self.memory, self.grid, self.program, self.sanitize = memory, grid, program, sanitize
        self.num_ctas = num_ctas
        self.epoch = np.zeros(num_ctas, np.int64)          # events (releases, barriers) per CTA
        self.wrote = np.zeros(num_ctas, bool)              # a global write since the last event
        self.read = np.zeros(num_ctas, bool)               # a tracked read (_note_read) since then
        self.barrier_at = np.zeros(num_ctas, np.int64)     # writes at epochs below: before a bar.sync
        self.release_at = np.zeros(num_ctas, np.int64)     # epoch of each CTA's last release
        self.cover_at = np.zeros(num_ctas, np.int64)       # what it covers of all threads' writes
        self.dirty = np.full(num_ctas, -1, np.int64)       # epoch of each CTA's last weak write
        self.signals = {}          # CTA -> (pc, release_at, epoch): a strong write, unreleased weak ones
        self.releases = {}         # (CTA, epoch) -> (pc, thread in CTA) of a release (sanitizer)
        # Releases by threads that wrote since their previous one (sorted keys), and each
        # written byte's thread: only kept when the program releases at all.
        self.by_thread = _releases(program)
        self.stamp_threads = self.by_thread or sanitize    # keep each byte's writing thread
        self.own = np.zeros(0, np.int64)
        self.threads = {}          # region -> uint16 thread in its CTA per byte
        self.records = {}          # region -> uint64 record per byte (allocated at first write)
        # Weak reads (sanitizer) of the regions the kernel may write (`written`, array names; None:
        # every array) and of any other region from its first write on: region -> per byte, a
        # read's record (as a write's) and its reading thread, for the newest read and for the
        # newest read by a CTA other than the newest's (_note_read, _check_war). Made at the
        # region's first weak read: arrays only read (weights, inputs) and those only accessed
        # strongly (counters, flags) get none.
        self.tracked = {region for region, name in enumerate(memory.names) if written is None or name in written}
        self.reads = {}
        self.before = {}           # region -> each byte's value before its record's write
        self.clocks = {}           # region -> {byte offset: int32 clock, [released | covered]}
        self.released = {}         # CTA -> clock at its last release by threads that acquired something
        self.nc_read = {}          # region -> uint16 per byte: the mark of a .nc load of it (sanitizer)
        nc = [pc for pc, ins in enumerate(program.instructions)
              if ins.base in ("ld", "ldu") and access_of(ins.base, ins.mods).nc]
        self.nc_marks = {pc: k for k, pc in enumerate(nc, 1)}    # each .nc / ldu load's mark in nc_read
        if len(self.nc_marks) >= 1 << 16:
            raise InterpError(f"the memory-ordering model handles < 2^16 non-coherent loads ({len(self.nc_marks)})")
        # Coherence of strong accesses (sanitizer, _coherence), in sequence numbers (step, position):
        # region -> {byte offset: per CTA, its newest strong write of the location (sequence number,
        # record, thread) and its newest strong read of it}; per wave CTA, per CTA the newest
        # strong write of it that the wave CTA observed (sequence number, record, thread).
        self.modified, self.seen, self.sequence = {}, {}, 0
        self.writes = 0            # global writes so far (the scheduler's spin detection)
        self.last_read = None      # where and what the last strong load read (the same)
        self._views = {}

    def start_wave(self, st, first_cta):
        self.st, self.first = st, first_cta
        self.row_of = np.full(st.num_ctas, -1, np.int64)     # wave CTA -> row of `rows`
        self.rows = np.zeros((0, 2 * self.num_ctas), np.int32)   # acquired clock per CTA
        self.used = 0
        # What single threads acquired beyond their CTA's row: wave thread -> row of own_rows (-1:
        # nothing), made at the first such acquisition; rows are shared and never changed.
        self.own_of, self.own_used = None, 0
        self.own_rows = np.zeros((0, 2 * self.num_ctas), np.int32)
        self.observed = {}         # CTA -> clocks its relaxed reads observed, for its fences
        self.thread_wrote = np.zeros(st.n, bool)              # (or read a recorded array) since its last release
        self.seen = {}                                        # (CTAs of earlier waves are done)

    # -- clocks: per CTA w, the epoch of the newest release of w acquired, then (at w + num_ctas)
    # the epoch below which that release covers every thread's writes of w (a bar.sync before it)
    def _row(self, cta):
        local = cta - self.first
        if self.row_of[local] < 0:
            if self.used == len(self.rows):
                grown = np.zeros((max(4, 2 * len(self.rows)), 2 * self.num_ctas), np.int32)
                grown[: self.used] = self.rows[: self.used]
                self.rows = grown
            self.row_of[local] = self.used
            self.used += 1
        return self.rows[self.row_of[local]]

    def _acquire(self, threads, clock):
        """These wave threads, all of one CTA, acquire a clock: into the CTA's row when they are
        all its threads, else into each one's own row."""
        if len(threads) == self.st.cta_threads:
            row = self._row(int(self.st.cta_global[threads[0]]))
            np.maximum(row, clock, out=row)
            return
        if self.own_of is None:
            self.own_of = np.full(self.st.n, -1, np.int64)
        old = self.own_of[threads]
        for r in np.unique(old).tolist():
            group = threads[old == r]
            now = int(self.own_of[group[0]])       # (_own_row may have renumbered the rows)
            if now < 0:
                self.own_of[group] = self._own_row(clock)
            elif (clock > self.own_rows[now]).any():
                self.own_of[group] = self._own_row(np.maximum(self.own_rows[now], clock))

    def _own_row(self, values):
        """A new row of own_rows holding values; when the table is full, the rows no thread holds
        any more go."""
        if self.own_used == len(self.own_rows):
            held = self.own_of >= 0
            live, self.own_of[held] = np.unique(self.own_of[held], return_inverse=True)
            table = np.zeros((max(4, 2 * len(live)), 2 * self.num_ctas), np.int32)
            table[: len(live)] = self.own_rows[live]
            self.own_rows, self.own_used = table, len(live)
        self.own_rows[self.own_used] = values
        self.own_used += 1
        return self.own_used - 1

    def _own_joined(self, threads):
        """The join of these wave threads' own rows, or None when none holds one."""
        if self.own_of is None:
            return None
        rows = self.own_of[threads]
        rows = np.unique(rows[rows >= 0])
        return self.own_rows[rows].max(axis=0) if len(rows) else None

    def _bump(self, ctas):
        if (self.epoch[ctas] + 1 >= 1 << EPOCH_BITS).any():
            cta = int(ctas[np.argmax(self.epoch[ctas])])
            raise InterpError(f"CTA {self.where_cta(cta)} passed more than 2^{EPOCH_BITS} releases "
                              "and barriers after global writes")
        self.epoch[ctas] += 1
        self.wrote[ctas] = False
        self.read[ctas] = False

    def barrier(self, ctas, waiters, senders):
        """A bar.sync completed in these CTAs: it orders every thread's earlier writes before
        each thread's later releases. A new epoch only where the CTA wrote since the last one.
        The waiters (wave threads) learn what the participants (waiters, and senders that
        arrived with bar.arrive) acquired: all of a CTA's threads waiting, it becomes the CTA's."""
        self._bump(ctas[self.wrote[ctas] | self.read[ctas]])
        self.barrier_at[ctas] = self.epoch[ctas]
        if self.own_of is None:
            return
        st = self.st
        part = np.concatenate([waiters, senders])
        holders = part[self.own_of[part] >= 0]
        whole = np.bincount(st.cta[waiters], minlength=st.num_ctas) == st.cta_threads
        for slot in np.unique(st.cta[holders]).tolist():
            joined = self._own_joined(holders[st.cta[holders] == slot])
            mine = waiters[st.cta[waiters] == slot]
            if whole[slot]:
                row = self._row(int(st.cta_ids[slot]))
                np.maximum(row, joined, out=row)
                self.own_of[mine] = -1
            else:
                self.own_of[mine] = self._own_row(joined)

    def warp_barrier(self, threads, mask):
        """bar.warp.sync by these wave threads with their member masks: the lanes of one warp
        and mask learn what each of them acquired."""
        if self.own_of is None or (self.own_of[threads] < 0).all():
            return
        group = (self.st.warp[threads].astype(np.int64) << 32) | np.broadcast_to(
            np.asarray(mask, np.int64), threads.shape)
        for g in np.unique(group[self.own_of[threads] >= 0]).tolist():
            lanes = threads[group == g]
            if len(np.unique(self.own_of[lanes])) > 1:
                self.own_of[lanes] = self._own_row(self._own_joined(lanes))

    def cta_event(self, threads):
        """A synchronisation inside the CTAs of these threads that bar.sync epochs do not see (an
        mbarrier arrive or completed wait, a CTA-scope fence, release or acquire): a new epoch
        where the CTA wrote since the last one, so the in-CTA race check (_check_in_cta) takes
        what came before as ordered (it cannot tell whom such an event orders)."""
        ctas = np.unique(self.st.cta_global[threads])
        self._bump(ctas[self.wrote[ctas]])

    def _release(self, threads):
        """A release by these wave threads: each CTA's new epoch covers the releasing threads'
        own earlier writes, and all its threads' writes before its last bar.sync (all of them
        when every thread of the CTA releases at once)."""
        st = self.st
        ctas, lead, count = np.unique(st.cta_global[threads], return_index=True, return_counts=True)
        self._bump(ctas)
        whole = count == st.cta_threads
        self.release_at[ctas] = self.epoch[ctas]
        self.cover_at[ctas] = np.where(whole, self.epoch[ctas], self.barrier_at[ctas])
        if self.by_thread:
            mine = threads[self.thread_wrote[threads]]
            self.thread_wrote[mine] = False
            if whole.any():
                mine = mine[~np.isin(st.cta_global[mine], ctas[whole])]
            if len(mine):
                cta = st.cta_global[mine]
                keys = np.sort((cta << OWN_CTA_SHIFT) | (st.lin[mine] << OWN_THREAD_SHIFT) | self.epoch[cta])
                self.own = np.insert(self.own, np.searchsorted(self.own, keys), keys)
        # What the releasing threads acquired: their CTA's row and their own rows.
        known = {cta: self._row(cta).copy() for cta in ctas[self.row_of[ctas - self.first] >= 0].tolist()}
        if self.own_of is not None:
            holders = threads[self.own_of[threads] >= 0]
            for cta in np.unique(st.cta_global[holders]).tolist():
                joined = self._own_joined(holders[st.cta_global[holders] == cta])
                known[cta] = np.maximum(known[cta], joined) if cta in known else joined
        n = self.num_ctas
        for cta, clock in known.items():
            clock[cta], clock[n + cta] = self.release_at[cta], self.cover_at[cta]
            self.released[cta] = clock
        if self.sanitize:
            for cta, t in zip(ctas.tolist(), st.lin[threads[lead]].tolist()):
                self.releases[(cta, int(self.epoch[cta]))] = (st.pc, t)

    def _publish(self, clock, cta):
        """Join CTA cta's released clock into a location's clock."""
        if cta in self.released:
            np.maximum(clock, self.released[cta], out=clock)
        n = self.num_ctas
        clock[cta] = max(clock[cta], self.release_at[cta])
        clock[n + cta] = max(clock[n + cta], self.cover_at[cta])

    def _observe(self, thread, clock, now):
        """A strong read by one wave thread saw a location's clock: acquired at once by an acquire
        read, else observed by its CTA (for its fences)."""
        if now:
            self._acquire(np.array([thread]), clock)
            return
        cta = int(self.st.cta_global[thread])
        if cta in self.observed:
            np.maximum(self.observed[cta], clock, out=self.observed[cta])
        else:
            self.observed[cta] = clock.copy()

    def fence(self, threads, acquire, release):
        self.cta_event(threads)
        if acquire and self.observed:
            ctas = self.st.cta_global[threads]
            order = np.argsort(ctas, kind="stable")
            found, start, count = np.unique(ctas[order], return_index=True, return_counts=True)
            for cta, first, many in zip(found.tolist(), start.tolist(), count.tolist()):
                if cta in self.observed:
                    self._acquire(threads[order[first:first + many]], self.observed[cta])
        if release:
            self._release(threads)

    def _acquired(self, writer, threads):
        """Per access: the (release, cover) epochs of the writing CTA that the accessing wave
        thread acquired (its CTA's row, joined with its own)."""
        if self.used == 0:
            release, cover = np.zeros(len(writer), np.int64), np.zeros(len(writer), np.int64)
        else:
            row = self.row_of[self.st.cta_global[threads] - self.first]
            row, seen = np.maximum(row, 0), row >= 0
            release = np.where(seen, self.rows[row, writer], 0)
            cover = np.where(seen, self.rows[row, writer + self.num_ctas], 0)
        if self.own_of is not None:
            own = self.own_of[threads]
            k = np.flatnonzero(own >= 0)
            if len(k):
                release[k] = np.maximum(release[k], self.own_rows[own[k], writer[k]])
                cover[k] = np.maximum(cover[k], self.own_rows[own[k], writer[k] + self.num_ctas])
        return release, cover

    def _covered(self, writer, epoch, threads, release, cover):
        """Whether a release of CTA writer at epoch `release`, covering every thread's writes
        below epoch `cover`, orders a write at `epoch`: the write precedes a bar.sync before the
        release, or its thread released after it. threads(k): the writing threads of writes k,
        [len(k), bytes] (a write's bytes may have several)."""
        ok = epoch < cover
        maybe = np.flatnonzero(~ok & (epoch < release))
        if len(maybe) and self.by_thread and len(self.own):
            base = (writer[maybe, None] << OWN_CTA_SHIFT) | (threads(maybe) << OWN_THREAD_SHIFT)
            at = np.searchsorted(self.own, base + epoch[maybe, None] + 1)
            found = self.own[np.minimum(at, len(self.own) - 1)]
            ok[maybe] = ((at < len(self.own)) & (found <= base + release[maybe, None])).all(axis=1)
        return ok

    # -- records
    def _records(self, region, off, size, threads):
        """The records of the accessed bytes and the accessing wave thread of each: one per
        access where all its bytes share one (the usual case), else one per byte; and that
        count `per`."""
        key = (region, size)
        if key not in self._views:
            self._views[key] = self.records[region].view(item(8 * size))
        old = np.take(self._views[key], off // size).view(np.uint64).reshape(-1, size)
        if size == 1 or (old == old[:, :1]).all():
            return old[:, 0], threads, 1
        return old.reshape(-1), np.repeat(threads, size), size

    def _region(self, region):
        if region not in self.records:
            size = -(-self.memory.sizes[region] // 64) * 64       # every view size divides it
            self.records[region] = np.zeros(size, np.uint64)
            if self.stamp_threads:
                self.threads[region] = np.zeros(size, np.uint16)
            if not self.sanitize:
                self.before[region] = np.zeros(self.memory.sizes[region], np.uint8)
            self.tracked.add(region)          # (an array the launch was not told it writes)
        return self.records[region]

    def _threads_of(self, region, off, per, size):
        """threads(k): the writing threads of records k's bytes, [len(k), bytes]."""
        def threads(k):
            stamps = self.threads[region]
            if per == 1:            # one record for the access's bytes, maybe several writers
                return stamps[off[k][:, None] + np.arange(size)].astype(np.int64)
            return stamps[off[k // per] + k % per][:, None].astype(np.int64)
        return threads

    def _unordered(self, rec, actors, readers, threads):
        """Which records (CTA w wrote weakly, at epoch e) no acquire by the accessing thread
        (actors: wave threads; readers: their CTAs) orders before its access: the reader is
        another CTA and the thread has acquired no release of w covering it."""
        writer = rec >> np.uint64(CTA_SHIFT)       # the strong bit lands above the CTA field
        foreign = (writer != 0) & (writer < np.uint64(1 << CTA_BITS)) & (
            writer != readers.astype(np.uint64) + np.uint64(1))
        if not foreign.any():
            return foreign
        k = np.flatnonzero(foreign)
        epoch = ((rec[k] >> np.uint64(EPOCH_SHIFT)) & np.uint64((1 << EPOCH_BITS) - 1)).astype(np.int64)
        writer = writer[k].astype(np.int64) - 1
        release, cover = self._acquired(writer, actors[k])
        foreign[k] = ~self._covered(writer, epoch, lambda j: threads(k[j]), release, cover)
        return foreign

    def _check_in_cta(self, what, region, off, per, rec, actors, threads_of, threads):
        """A data race inside one CTA: bytes another warp of the acting CTA wrote in the CTA's
        current epoch (no barrier or other synchronisation of the CTA since, cta_event), unless
        both accesses are strong at some scope (atomics; ld/st with .relaxed/.acquire/.release/
        .volatile). Lanes of one warp are taken as ordered (the interpreter runs a warp in
        lockstep)."""
        writer = (rec >> np.uint64(CTA_SHIFT)) & np.uint64((1 << CTA_BITS) - 1)
        epoch = ((rec >> np.uint64(EPOCH_SHIFT)) & np.uint64((1 << EPOCH_BITS) - 1)).astype(np.int64)
        mine = (writer == actors.astype(np.uint64) + np.uint64(1)) & (epoch == self.epoch[actors])
        if not mine.any() or _strong_in_cta(self.program.instructions[self.st.pc]) and all(
                _strong_in_cta(self.program.instructions[pc]) for pc in np.unique(rec[mine] & np.uint64(
                    (1 << PC_BITS) - 1)).tolist()):
            return
        k = np.flatnonzero(mine)
        wrote_by = threads_of(k)                       # [len(k), bytes]
        acting = self.st.lin[threads[k // per]].astype(np.int64)
        other = (wrote_by >> 5) != (acting >> 5)[:, None]
        racing = other.any(axis=1)
        if not racing.any():
            return
        first = int(np.flatnonzero(racing)[0])
        index, byte = int(k[first]) // per, int(k[first]) % per
        place = self.memory.describe_byte(region, int(off[index]) + byte)
        pc = int(rec[k[first]]) & ((1 << PC_BITS) - 1)
        raise Finding(f"global-memory race: {_VERBS[what]} {place}, which thread "
                      f"{self._thread(int(wrote_by[first][np.argmax(other[first])]))} of this CTA wrote "
                      f"({self._instruction(pc)}) with no bar.sync in between", threads[index])

    @staticmethod
    def _bytes(mask, per, size):
        """A mask over records ([accesses * per]) as a mask over the accessed bytes [accesses, size]."""
        return np.repeat(mask, size).reshape(-1, size) if per == 1 else mask.reshape(-1, size)

    # -- accesses
    def load(self, region, off, size, threads, access, raw):
        """A global read of size bytes at byte offsets off of region by wave threads; raw are
        the loaded items (patched to stale bytes where the read is unordered)."""
        access = access or WEAK
        ctas = self.st.cta_global[threads]
        if access.orders:
            self.cta_event(threads)
        if access.strong:
            self.last_read = (region, hash(off.tobytes()), hash(np.asarray(raw).tobytes()))
        if access.nc and self.sanitize:
            self._mark_nc(region, off, size)
        if access.observes and self.clocks.get(region):
            self._chain(region, off, threads, np.arange(len(off)), observe=True, publish=False,
                        now=access.acquire)
        if access.observes and self.sanitize:
            self._coherence("read", region, off, threads, np.arange(len(off)), reads=True, writes=False)
        if self.sanitize and not access.qualified and not access.nc and region in self.tracked:
            self._note_read(region, off, size, ctas, threads)
        if region not in self.records:
            return raw
        rec, actors, per = self._records(region, off, size, threads)
        readers = ctas if per == 1 else self.st.cta_global[actors]
        threads_of = self._threads_of(region, off, per, size)
        if self.sanitize:
            self._check_in_cta("read", region, off, per, rec, readers, threads_of, threads)
        bad = rec != 0 if access.nc else self._unordered(rec, actors, readers, threads_of)
        if not bad.any():
            return raw
        if self.sanitize:
            self._report("nc" if access.nc else "read", region, off, per, rec, bad, threads)
        if not access.strong:
            stale = self.before[region][off[:, None] + np.arange(size)]
            raw = np.ascontiguousarray(raw)
            view = raw.view(np.uint8).reshape(len(off), size)
            bad = self._bytes(bad, per, size)
            view[bad] = stale[bad]
        return raw

    def _read_views(self, region, size):
        """A region's read records (0, 2) and their threads (1, 3), one item per size bytes."""
        key = ("reads", region, size)
        if key not in self._views:
            self._views[key] = tuple(array.view(item(array.itemsize * size)) for array in self.reads[region])
        return self._views[key]

    def _note_read(self, region, off, size, ctas, threads):
        """A weak read (by wave threads) of a tracked region, for _check_war: it becomes its
        bytes' newest read, and the read it replaces, if another CTA's, the newest by a CTA other
        than the newest's; as does a read of this step that another CTA's read of the same bytes
        replaced. An access whose bytes had different newest reads is noted byte by byte."""
        if region not in self.reads:
            bytes_ = -(-self.memory.sizes[region] // 64) * 64       # every view size divides it
            self.reads[region] = (np.zeros(bytes_, np.uint64), np.zeros(bytes_, np.uint16),
                                  np.zeros(bytes_, np.uint64), np.zeros(bytes_, np.uint16))
        newest, newest_by, other, other_by = self._read_views(region, size)
        at = off // size
        old = np.take(newest, at).view(np.uint64).reshape(-1, size)
        if size > 1 and not (old == old[:, :1]).all():
            self._note_read(region, (off[:, None] + np.arange(size)).reshape(-1), 1, np.repeat(ctas, size),
                            np.repeat(threads, size))
            return
        old = old[:, 0]
        new = _stamp(ctas, self.epoch[ctas], False, self.st.pc)
        lin = self.st.lin[threads].astype(np.uint16)
        shift = np.uint64(CTA_SHIFT)
        moved = np.flatnonzero((old >> shift) != (new >> shift)) if old.any() else ()
        if len(moved):
            moved = moved[old[moved] != 0]
            old_by = np.take(newest_by, at[moved]).view(np.uint16).reshape(-1, size)[:, 0]
            np.put(other, at[moved], np.repeat(old[moved], size).view(other.dtype))
            np.put(other_by, at[moved], np.repeat(old_by, size).view(other_by.dtype))
        np.put(newest, at, np.repeat(new, size).view(newest.dtype))
        np.put(newest_by, at, np.repeat(lin, size).view(newest_by.dtype))
        if len(ctas) and ctas[0] != ctas[-1]:      # several CTAs in this step (wave threads are in CTA order)
            kept = np.take(newest, at).view(np.uint64).reshape(-1, size)[:, 0]
            lost = np.flatnonzero((kept >> shift) != (new >> shift))
            if len(lost):
                np.put(other, at[lost], np.repeat(new[lost], size).view(other.dtype))
                np.put(other_by, at[lost], np.repeat(lin[lost], size).view(other_by.dtype))
        self.read[ctas] = True
        if self.by_thread:
            self.thread_wrote[threads] = True

    def _check_war(self, what, region, off, size, threads):
        """A write (by wave threads) over bytes another CTA r read weakly earlier in this launch
        (the newest read of each byte, and the newest by a CTA other than its): ordered only if
        the writing thread acquired a release of r that covers the read (r's reading thread
        released after it, or a bar.sync of r came between the read and the release); else a
        GPU may land the write first, and the read see the new value."""
        if region not in self.reads:
            return
        views = self._read_views(region, size)
        for slot in (0, 2):
            old = np.take(views[slot], off // size).view(np.uint64).reshape(-1, size)
            if not old.any():
                break                   # (a byte has a second kept read only if it has a first)
            per = 1 if size == 1 or (old == old[:, :1]).all() else size
            rec = old[:, 0] if per == 1 else old.reshape(-1)
            actors = threads if per == 1 else np.repeat(threads, size)
            reader = (rec >> np.uint64(CTA_SHIFT)).astype(np.int64) - 1
            foreign = (reader >= 0) & (reader != self.st.cta_global[actors])
            if not foreign.any():
                continue
            k = np.flatnonzero(foreign)
            epoch = ((rec[k] >> np.uint64(EPOCH_SHIFT)) & np.uint64((1 << EPOCH_BITS) - 1)).astype(np.int64)
            by = self.reads[region][slot + 1]

            def threads_of(j, k=k, by=by, per=per):
                if per == 1:
                    return by[off[k[j]][:, None] + np.arange(size)].astype(np.int64)
                return by[off[k[j] // per] + k[j] % per][:, None].astype(np.int64)
            release, cover = self._acquired(reader[k], actors[k])
            bad = ~self._covered(reader[k], epoch, threads_of, release, cover)
            if bad.any():
                j = int(np.flatnonzero(bad)[0])
                self._report_war(what, region, off, per, int(k[j]), int(rec[k[j]]), threads_of(np.array([j]))[0],
                                 int(release[j]), int(cover[j]), threads)

    def _report_war(self, what, region, off, per, k, rec, read_by, release, cover, threads):
        i, byte = k // per, k % per
        reader = (rec >> CTA_SHIFT) - 1
        epoch = rec >> EPOCH_SHIFT & ((1 << EPOCH_BITS) - 1)
        readers = np.array([reader])

        def covered(release, cover, by=read_by):
            return self._covered(readers, np.array([epoch]), lambda _: np.asarray(by)[None, :], release, cover)[0]

        late = [t for t in read_by.tolist() if not covered(np.array([release]), np.array([cover]), [t])]
        thread = late[0] if late else int(read_by[0])
        by = (f"CTA {self.where_cta(reader)} read ({self._instruction(rec & ((1 << PC_BITS) - 1))} by thread "
              f"{self._thread(thread)}) earlier in this launch")
        if release > epoch:
            at, by_thread = self.releases[(reader, release)]
            why = (f"the release of CTA {self.where_cta(reader)} it acquired ({self._instruction(at)} by thread "
                   f"{self._thread(by_thread)}) does not cover that read: a release covers its own thread's "
                   "earlier reads and those a bar.sync ordered before it (a bar.sync between the read and the "
                   "release is missing)")
        elif covered(self.release_at[readers], self.cover_at[readers]):
            why = ("the reader released after its read, but this thread never acquired that release (an acquire "
                   "by this thread, or one a bar.sync passed on, before the write is missing)")
        else:
            why = ("the reader has not released since its read (no fence.acq_rel.gpu / membar.gl / .release "
                   "after it, then an acquire before this write, as a grid barrier's arrive and wait give)")
        raise Finding(f"global-memory race: {_VERBS[what]} {self.memory.describe_byte(region, int(off[i]) + byte)}, "
                      f"which {by}, with nothing ordering that read before this write (on a GPU the write may "
                      f"land first and the read see its value): {why}", threads[i])

    def _mark_nc(self, region, off, size):
        """Bytes read through the non-coherent path: a later write to them in this launch is a
        finding (_write), as a .nc read after the write is (load)."""
        if region not in self.nc_read:
            self.nc_read[region] = np.zeros(-(-self.memory.sizes[region] // 64) * 64, np.uint16)
        rows = self.nc_read[region].view(item(2 * size))
        np.put(rows, off // size, np.full(len(off) * size, self.nc_marks[self.st.pc], np.uint16).view(rows.dtype))

    def store(self, region, off, size, threads, access):
        """A global st of size bytes per thread (before memory changes)."""
        access = access or WEAK
        ctas = self.st.cta_global[threads]
        if access.orders:
            self.cta_event(threads)
        if access.release:
            self._release(threads)
        if access.strong and self.sanitize:
            self._coherence("write", region, off, threads, np.arange(len(off)), reads=False, writes=True)
        self._write(region, off, size, ctas, threads, access, "write")
        clocks = self.clocks.get(region)
        if access.strong:
            if clocks:               # a strong store starts the location's chain afresh
                for o in np.unique(off).tolist():
                    clocks.pop(o, None)
            self._chain(region, off, threads, np.arange(len(off)), observe=False, publish=True)
        elif clocks:
            for o in np.unique(off[np.isin(off, list(clocks))]).tolist():
                del clocks[o]

    def atomic(self, region, off, size, threads, access, order):
        """An atom (or red) by threads, serialised in `order` (positions into off)."""
        ctas = self.st.cta_global[threads]
        if access.orders:
            self.cta_event(threads)
        if access.release:
            self._release(threads)
        self._chain(region, off, threads, order, observe=access.observes, publish=access.strong,
                    now=access.acquire)
        if access.strong and self.sanitize:
            self._coherence("atomic", region, off, threads, order, reads=access.observes, writes=True)
        self._write(region, off, size, ctas, threads, access, "atomic")

    def _coherence(self, what, region, off, threads, order, reads, writes):
        """Strong accesses (at .gpu/.sys scope) to each location, in serial order: an access by
        CTA r after r observed (by a strong read of another location, or of this one since) a
        strong write that the thread of CTA w that made w's newest strong write M of this
        location made later, and with no strong read of this location by r since M, relies on M
        coming before it in coherence order, which only happens-before guarantees: a finding
        unless a release of w that r acquired covers M. (A CTA that counted in on one word need
        not see another CTA's atomic on a second word that no release put before that CTA's
        count.) Then reads observe the location's writes as they were before this step, and
        writes become its newest."""
        ctas = self.st.cta_global[threads]
        base = self.sequence << STEP_SHIFT
        self.sequence += 1
        locations = self.modified.setdefault(region, {})
        if not writes:
            order = order[np.isin(off[order], list(locations))]
        for o in np.unique(off[order]).tolist():
            here = order[off[order] == o]
            who = ctas[here]
            if o not in locations:
                locations[o] = np.full((4, self.num_ctas), -1, np.int64)   # seq, record, thread, looked
            seq, rec, by, looked = locations[o]
            if self.seen:
                self._check_coherence(what, region, o, locations[o], who, threads[here])
            if reads:
                for cta in np.unique(who).tolist():
                    row = self.seen.setdefault(cta, np.full((3, self.num_ctas), -1, np.int64))
                    newer = seq > row[0]
                    row[:, newer] = seq[newer], rec[newer], by[newer]
                looked[who] = base + np.arange(len(here))
            if writes:      # (a CTA's accesses of this step: the last in serial order stays)
                seq[who] = base + np.arange(len(here))
                rec[who] = _stamp(who, self.epoch[who], False, self.st.pc).astype(np.int64)
                by[who] = self.st.lin[threads[here]]

    def _check_coherence(self, what, region, o, location, readers, threads):
        """_coherence's finding: the first access (in serial order) by a CTA r of a location whose
        newest strong write M by thread t of another CTA w is newer than r's last strong read of
        it and from an earlier step than the newest strong write of w that r observed, made by t
        too (program order; one instruction's accesses to several locations are not ordered, nor
        are two threads' accesses), where no release that r acquired covers M."""
        seq, rec, by, looked = location
        known = np.array([cta in self.seen for cta in readers.tolist()])
        if not known.any():
            return
        k = np.flatnonzero(known)
        seen = np.stack([self.seen[cta] for cta in readers[k].tolist()])     # [reader, seq | record | thread, CTA]
        relied = ((seq > looked[readers[k]][:, None]) & (seq >> STEP_SHIFT < seen[:, 0] >> STEP_SHIFT)
                  & (by == seen[:, 2]))
        relied[np.arange(len(k)), readers[k]] = False
        if not relied.any():
            return
        i, w = np.nonzero(relied)
        epoch = (rec[w] >> EPOCH_SHIFT) & ((1 << EPOCH_BITS) - 1)
        release, cover = self._cta_acquired(w, readers[k[i]])     # (observation, seen, is per CTA too)
        bad = ~self._covered(w, epoch, lambda j: by[w[j]][:, None], release, cover)
        if not bad.any():
            return
        j = int(np.flatnonzero(bad)[0])
        writer, pcs = int(w[j]), (1 << PC_BITS) - 1
        later = int(seen[i[j], 1, writer]) & pcs
        raise Finding(f"global-memory ordering: {_VERBS[what]} {self.memory.describe_byte(region, o)}, relying on CTA "
                      f"{self.where_cta(writer)}'s update of it ({self._instruction(int(rec[writer]) & pcs)} by thread "
                      f"{self._thread(int(by[writer]))}) coming first, as this CTA observed a later write of that "
                      f"thread ({self._instruction(later)}); but no release that this CTA acquired orders the update "
                      "before this access, so in coherence order it may come after (a fence.acq_rel.gpu / membar.gl "
                      "or .release between the two writes is missing)", threads[k[i[j]]])

    def failed_cas(self, region, off, old):
        """An atom.cas of which every compare failed, just after its _write: for the
        scheduler's spin detection it is a strong read (of `old`) that wrote nothing."""
        self.writes -= 1
        self.last_read = (region, hash(off.tobytes()), hash(np.asarray(old).tobytes()))

    def _write(self, region, off, size, ctas, threads, access, what):
        self.writes += 1
        self._region(region)
        rec, actors, per = self._records(region, off, size, threads)
        if self.sanitize:
            writers = ctas if per == 1 else self.st.cta_global[actors]
            threads_of = self._threads_of(region, off, per, size)
            self._check_in_cta(what, region, off, per, rec, writers, threads_of, threads)
            bad = self._unordered(rec, actors, writers, threads_of)
            if bad.any():
                self._report(what, region, off, per, rec, bad, threads)
            self._check_war(what, region, off, size, threads)
            marks = self.nc_read.get(region)
            if marks is not None:
                read = marks[off[:, None] + np.arange(size)]
                if read.any():
                    i, j = np.argwhere(read)[0]
                    pc = next(pc for pc, mark in self.nc_marks.items() if mark == read[i, j])
                    raise Finding(f"write to {self.memory.describe_byte(region, int(off[i]) + int(j))}, which a "
                                  f"non-coherent load ({self._instruction(pc)}) read earlier in this launch: .nc / "
                                  "ldu needs bytes that stay read-only for the whole kernel; load them with "
                                  "ld.global or ld.global.cg", threads[i])
        new = _stamp(ctas, self.epoch[ctas], access.strong, self.st.pc)
        if not self.sanitize:
            key = np.uint64(EPOCH_SHIFT)
            fresh = (rec >> key & KEY_MASK) != (np.repeat(new, per) >> key & KEY_MASK)
            if fresh.any():
                idx = (off[:, None] + np.arange(size))[self._bytes(fresh, per, size)]
                self.before[region][idx] = self.memory.bytes[region][idx]
        rows = self._views[(region, size)]
        np.put(rows, off // size, np.repeat(new, size).view(rows.dtype))
        self.wrote[ctas] = True
        if self.by_thread:
            self.thread_wrote[threads] = True
        if self.stamp_threads:
            key = ("threads", region, size)
            if key not in self._views:
                self._views[key] = self.threads[region].view(item(2 * size))
            stamps = self._views[key]
            np.put(stamps, off // size, np.repeat(self.st.lin[threads].astype(np.uint16), size).view(stamps.dtype))
        if self.sanitize and not access.strong:       # several CTAs writing a row in this step
            kept = np.take(rows, off // size).view(np.uint64).reshape(-1, size)[:, 0]
            lost = (kept >> np.uint64(CTA_SHIFT)) != (new >> np.uint64(CTA_SHIFT))
            if lost.any():
                self._report(what, region, off, 1, kept, lost, threads)
            if not _strong_in_cta(self.program.instructions[self.st.pc]):   # ... or several warps of a CTA
                kept_by = np.take(stamps, off // size).view(np.uint16).reshape(-1, size)[:, 0].astype(np.int64)
                lin = self.st.lin[threads].astype(np.int64)
                clash = np.flatnonzero((kept_by >> 5) != (lin >> 5))
                if len(clash):
                    place = self.memory.describe_byte(region, int(off[clash[0]]))
                    raise Finding(f"global-memory race: overwrites {place}, which thread {self._thread(int(kept_by[clash[0]]))}"
                                  f" of this CTA writes in the same instruction (two warps store to the same bytes)",
                                  threads[clash[0]])
        if access.strong:            # a signal after weak writes that no release followed
            signal = self.dirty[ctas] >= self.release_at[ctas]
            if signal.any():
                for cta in np.unique(ctas[signal]).tolist():
                    self.signals[cta] = (self.st.pc, int(self.release_at[cta]), int(self.epoch[cta]))
        else:
            self.dirty[ctas] = self.epoch[ctas]

    def _chain(self, region, off, threads, order, observe, publish, now=False):
        """Walk the accesses (by wave threads) to each location in serial order: each observes
        the location's clock as left by those before it, then publishes its CTA's released clock
        to it."""
        ctas = self.st.cta_global[threads]
        clocks = self.clocks.setdefault(region, {})
        if publish and not (self.release_at[ctas] > 0).any():
            publish = False                  # nothing released yet: nothing to publish
        if not publish:                      # only accesses to locations with a clock matter
            if not clocks:
                return
            order = order[np.isin(off[order], list(clocks))]
        for k in order.tolist():
            o = int(off[k])
            clock = clocks.get(o)
            if observe and clock is not None:
                self._observe(int(threads[k]), clock, now)
            if publish:
                if clock is None:
                    clock = clocks[o] = np.zeros(2 * self.num_ctas, np.int32)
                self._publish(clock, int(ctas[k]))

    # -- findings
    def where_cta(self, cta):
        gx, gy, _ = self.grid
        return f"({cta % gx},{cta // gx % gy},{cta // (gx * gy)})"

    def _thread(self, lin):
        bx, by, _ = self.st.block
        return f"({lin % bx},{lin // bx % by},{lin // (bx * by)})"

    def _instruction(self, pc):
        ins = self.program.instructions[pc]
        return f"line {ins.line} `{ins.text}`"

    def _cta_acquired(self, writers, ctas):
        """Per pair: the (release, cover) epochs of CTA writers[j] that some thread of CTA ctas[j]
        (of this wave) acquired."""
        release, cover = np.zeros(len(ctas), np.int64), np.zeros(len(ctas), np.int64)
        for cta in np.unique(ctas).tolist():
            known = [np.zeros(2 * self.num_ctas, np.int32)]
            if self.row_of[cta - self.first] >= 0:
                known.append(self.rows[self.row_of[cta - self.first]])
            own = self._own_joined(np.flatnonzero(self.st.cta_global == cta))
            if own is not None:
                known.append(own)
            known = np.max(known, axis=0)
            j = ctas == cta
            release[j], cover[j] = known[writers[j]], known[writers[j] + self.num_ctas]
        return release, cover

    def _report(self, what, region, off, per, records, bad, threads):
        k = int(np.flatnonzero(bad)[0])
        i, j = k // per, k % per
        rec = int(records[k])
        writer = (rec >> CTA_SHIFT & ((1 << CTA_BITS) - 1)) - 1
        epoch = rec >> EPOCH_SHIFT & ((1 << EPOCH_BITS) - 1)
        pc = rec & ((1 << PC_BITS) - 1)
        place = self.memory.describe_byte(region, int(off[i]) + j)
        by = f"CTA {self.where_cta(writer)} wrote ({self._instruction(pc)})"
        if what == "nc":
            raise Finding(f"non-coherent load (.nc / ldu) of {place}, which {by} in this launch: the "
                          "read-only path may return a stale value; load it with ld.global or "
                          "ld.global.cg", threads[i])
        signal = self.signals.get(writer)
        wrote_by = int(self.threads[region][int(off[i]) + j]) if self.stamp_threads else 0
        writers, epochs = np.array([writer]), np.array([epoch])

        def covered(release, cover):
            return self._covered(writers, epochs, lambda _: np.array([[wrote_by]]), release, cover)[0]

        release, cover = (int(x[0]) for x in self._acquired(writers, threads[i:i + 1]))
        if signal is not None and signal[1] <= epoch <= signal[2]:
            why = (f"CTA {self.where_cta(writer)} signalled with {self._instruction(signal[0])} without "
                   "releasing that write first (a flag or counter atomic needs fence.acq_rel.gpu / "
                   "membar.gl before it, or .release)")
        elif release > epoch:
            at, by_thread = self.releases[(writer, release)]
            why = (f"the release of CTA {self.where_cta(writer)} it acquired ({self._instruction(at)} by "
                   f"thread {self._thread(by_thread)}) does not cover that write by thread "
                   f"{self._thread(wrote_by)}: a release covers its own thread's earlier writes and "
                   "those a bar.sync ordered before it (a bar.sync between the write and the release "
                   "is missing)")
        elif covered(self.release_at[writers], self.cover_at[writers]) and covered(
                *self._cta_acquired(writers, self.st.cta_global[threads[i:i + 1]])):
            why = ("another thread of this CTA acquired a release of it, but not this thread: an acquire "
                   "orders its own thread's later reads, and a bar.sync, or a bar.warp.sync among the lanes "
                   "of its mask, passes it to the others (a shfl.sync or reconvergence does not)")
        elif covered(self.release_at[writers], self.cover_at[writers]):
            why = ("this CTA never acquired a release of it (a fence.acq_rel.gpu / membar.gl after the "
                   "atomic or ld.relaxed that observed the writer, or an .acquire, is missing)")
        else:
            why = "the writer has not released it (no fence.acq_rel.gpu / membar.gl / .release after the write)"
        raise Finding(f"global-memory race: {_VERBS[what]} {place}, which {by} in this launch, with "
                      f"nothing ordering the two: {why}", threads[i])
