"""Checks that need bookkeeping beyond plain execution: shared-memory races and
warp-collective membership. Findings are raised as findings.Finding; launch formats them."""
from typing import NamedTuple

import numpy as np

from . import numerics as nm
from .findings import Finding

# A byte's read and write records are four uint16 fields; the epochs sit at the same places
# in both, so the accessing thread's "who" record doubles as its read and write record.
R_THREAD, R_WARP, EPOCH, WARP_EPOCH = range(4)    # reader(s) since the last barrier
W_THREAD, W_PENDING = 0, 1                        # last writer; its cp.async is pending
PENDING, ATOMIC = 1, 2                            # W_PENDING values (0: a plain write, done)
NOBODY, MANY = 0xFFFF, 0xFFFE                     # thread/warp field values
ASYNC = 0xFFFD  # written through an mbarrier-tracked async copy: hopper.Ordering judges its readers


class AsyncCopy(NamedTuple):
    """cp.asyncs of one step not yet waited for: per thread, its commit group and the
    size-byte row of shared memory it copies to."""
    threads: np.ndarray
    group: np.ndarray
    rows: np.ndarray
    size: int
    line: int


class SharedRaces:
    """Per byte of shared memory: the last writer and the reader(s) since the last barrier.

    Threads are recorded by linear id within their CTA (the byte says which CTA); several
    readers become MANY, and so does their warp if they are of different warps. An access
    conflicts with an earlier one by another thread of the same barrier interval (the number of
    the last barrier it passed) unless both threads are in one warp and that warp passed
    bar.warp.sync in between. Epochs are 16-bit and compared for equality; they wrap after 65536
    barriers.

    Barriers of part of a CTA (named barriers with a thread count, bar.arrive) order only the
    threads that take part, and only the waiters learn: each thread's epoch is the number of the
    last barrier it took part in (waiting, or arriving without waiting: its later accesses are
    not ordered before the waiters'), and from the first such barrier on each thread also
    knows, per warp of its CTA, the newest epoch of that warp's threads whose accesses are
    ordered before it (a vector clock over warps: the join, at a barrier, of what its
    participants knew and their own epochs; every thread of a CTA knows every epoch before its
    last bar.sync of all threads). Another warp's access is then also a conflict when its epoch
    is newer than what the accessing thread knows of that warp. Readers of several warps keep
    the newest of their epochs, checked against the warp the accessing thread knows newest
    (so a write after reads of two warps may be taken as ordered when it is ordered after one
    of them). Lanes of one warp that take part in different barriers count as one warp. Known
    epochs are compared modulo 2^16: a record more than 32767 barriers old can read as new.

    cp.async copies its data at issue, but its destination bytes stay pending until the
    issuing thread's cp.async.wait_group/wait_all completes the copy's commit group: any
    access to a pending byte is a finding, and the copy counts as that thread's write at the
    time of the wait (so other threads also need a barrier after the wait).

    Accesses are size-aligned (state.segments checks) and the shared stride is a multiple of
    every access size, so one access is one row of a [bytes / size, size] view."""

    def __init__(self, st):
        size = st.shared.size
        self.st = st
        self.lin = st.lin.astype(np.uint16)
        self.who = np.zeros((st.n, 4), np.uint16)     # per thread: its read/write record
        self.who[:, R_THREAD] = self.lin
        self.who[:, R_WARP] = self.lin >> 5
        self.events = np.zeros(st.num_ctas, np.uint16)    # barriers completed per CTA
        # The vector clock over warps (see the class doc), unwrapped: each thread's epoch, per CTA
        # the epoch below which its last bar.sync of all threads orders everything, and per
        # thread and warp of its CTA the newest epoch of that warp it is ordered after (made at
        # the first barrier of part of a CTA; until then equal epochs are the only conflicts).
        self.epoch = np.zeros(st.n, np.int64)
        self.clock = np.zeros(st.num_ctas, np.int64)
        self.base = np.full(st.num_ctas, -1, np.int64)
        self.known = None
        self.arrival = None        # per thread: its epoch as it last arrived with bar.arrive
        self.reads = np.zeros((size, 4), np.uint16)
        self.reads[:, R_THREAD] = NOBODY
        self.writes = np.zeros((size, 4), np.uint16)     # [W_THREAD, W_PENDING, EPOCH, WARP_EPOCH]
        self.writes[:, W_THREAD] = NOBODY
        self.row_reader = np.empty(size, np.int32)     # scratch: who read a row last
        self.copies = []                                # outstanding AsyncCopy records
        self.committed = np.zeros(st.n, np.int64)       # commit groups closed, per thread
        self.completed = np.zeros(st.n, np.int64)       # groups [0, completed) are done
        self._tables = {}

    def _table(self, records, size):
        """records as one item of `size` records per size-aligned row (take/put move whole
        rows, several times faster than fancy indexing of a 2-D view)."""
        key = (id(records), size)
        if key not in self._tables:
            self._tables[key] = records.view(np.uint64).reshape(-1).view(np.dtype((np.void, 8 * size)))
        return self._tables[key]

    def _gather(self, records, rows, size):
        """The accessed rows' records, [rows, size] uint64."""
        return np.take(self._table(records, size), rows).view(np.uint64).reshape(-1, size)

    def _scatter(self, records, rows, size, values):
        """Store [rows * n, 4] uint16 (or [rows, n] uint64) records, n being size, or 1 for
        one record per row."""
        table = self._table(records, size)
        values = values.view(np.uint64).reshape(-1)
        if len(values) != len(rows) * size:
            values = np.repeat(values, size)
        np.put(table, rows, values.view(table.dtype))

    @staticmethod
    def _fields(size, *gathered):
        """Each gathered [rows, size] array as [rows * n, 4] uint16 fields: n = 1 when every
        row's bytes hold one record (the usual case; each check then runs once per row, not
        once per byte), n = size otherwise."""
        fields = [g.view(np.uint16).reshape(len(g), -1) for g in gathered]
        if size > 1 and all((g == g[:, :1]).all() for g in gathered):
            return [f[:, :4] for f in fields]          # each row's first byte
        return [f.reshape(-1, 4) for f in fields]

    def _who(self, threads, per):
        """[thread, warp in the CTA, CTA epoch, warp epoch] of each thread, `per` times.
        Everything works on flat arrays like these: numpy is slow on short inner axes."""
        who = np.take(self.who.view(np.uint64), threads)
        return (np.repeat(who, per) if per > 1 else who).view(np.uint16).reshape(-1, 4)

    def barrier(self, threads, senders=None):
        """A barrier released these threads (all of a CTA's, or the part a named barrier with a
        count holds) and took `senders` (threads that arrived with bar.arrive and went on; their
        epoch moved on as they arrived, `arrived`): each waiter gets its CTA's next barrier number
        as its epoch, so the accesses of threads that took part are ordered after everything
        before it, and those of threads that did not stay unordered with what follows. The
        waiters learn what every participant knew and the participants' epochs as they arrived;
        the senders learn nothing."""
        st = self.st
        if senders is None:
            senders = np.zeros(0, np.int64)
        if len(threads) == st.n and not len(senders):    # every thread of the wave: the usual bar.sync
            self.events += np.uint16(1)
            self.clock += 1
            self.base[:] = self.clock - 1
            self.epoch[:] = np.repeat(self.clock, st.cta_threads)
            self.who[:, EPOCH] = np.repeat(self.events, st.cta_threads)
            self.who[:, WARP_EPOCH] += np.uint16(1)
            return
        ctas = st.cta[threads]
        touched = np.bincount(ctas, minlength=st.num_ctas) > 0
        whole = np.bincount(ctas, minlength=st.num_ctas) == st.cta_threads
        whole &= np.bincount(st.cta[senders], minlength=st.num_ctas) == 0
        partial = (touched | (np.bincount(st.cta[senders], minlength=st.num_ctas) > 0)) & ~whole
        if partial.any():
            self._join(threads, senders, partial)
        self._next_epoch(threads, touched)
        self.base[whole] = self.clock[whole] - 1

    def _next_epoch(self, threads, touched):
        """These threads (of the CTAs `touched`) start their CTA's next barrier interval."""
        ctas = self.st.cta[threads]
        self.events[touched] += np.uint16(1)
        self.clock[touched] += 1
        self.epoch[threads] = self.clock[ctas]
        self.who[threads, EPOCH] = self.events[ctas]
        self.who[threads, WARP_EPOCH] += np.uint16(1)

    def arrived(self, threads):
        """bar.arrive by these threads: their accesses so far are ordered before the waiters of
        the barrier's phase, their later ones are not: a new epoch for them at once (the epoch
        they arrive with is what the waiters learn)."""
        if self.arrival is None:
            self.arrival = np.zeros(self.st.n, np.int64)
        if self.known is None:     # epochs now differ between threads that no barrier ordered
            self.known = np.full((self.st.n, self.st.warps_per_cta), -1, np.int64)
        self.arrival[threads] = self.epoch[threads]
        self._next_epoch(threads, np.bincount(self.st.cta[threads], minlength=self.st.num_ctas) > 0)

    def _join(self, waiters, senders, partial):
        """The vector-clock join of a barrier of part of a CTA (in the CTAs `partial`): the
        waiters learn what the participants knew and their epochs (the waiters' before the new
        one, the senders' as they arrived)."""
        st = self.st
        warps = st.warps_per_cta
        if self.known is None:
            self.known = np.full((st.n, warps), -1, np.int64)
        waiters = waiters[partial[st.cta[waiters]]]
        senders = senders[partial[st.cta[senders]]]
        part = np.concatenate([waiters, senders])
        own = np.concatenate([self.epoch[waiters], self.arrival[senders] if len(senders) else senders])
        ctas = st.cta[part]
        joined = np.full((st.num_ctas, warps), -1, np.int64)
        np.maximum.at(joined, ctas, self.known[part])
        np.maximum.at(joined, (ctas, self.lin[part].astype(np.int64) >> 5), own)
        joined = np.maximum(joined, self.base[:, None])
        self.known[waiters] = np.maximum(self.known[waiters], joined[st.cta[waiters]])

    def _known(self, threads, warps):
        """Per access: the newest epoch of warp `warps` (local) that thread `threads` (wave index)
        is ordered after, unwrapped."""
        base = self.base[self.st.cta[threads]]
        return np.maximum(base, self.known[threads, warps])

    def _known_other(self, threads):
        """Per access: the newest epoch that its thread is ordered after, of any warp of its CTA
        but its own (for records of readers of several warps)."""
        known = np.maximum(self.known[threads], self.base[self.st.cta[threads]][:, None])
        own = self.lin[threads].astype(np.int64) >> 5
        known[np.arange(len(threads)), own] = -1
        return known.max(axis=1)

    @staticmethod
    def _newer(epoch16, known):
        """Whether 16-bit epochs are newer than unwrapped known epochs (modulo 2^16)."""
        return ((epoch16.astype(np.int64) - known) & 0xFFFF).astype(np.uint16).view(np.int16) > 0

    @staticmethod
    def _per_access(threads, per):
        """The accessing thread of each record an access covers (`per` records a thread)."""
        return np.repeat(threads, per) if per > 1 else threads

    def _unordered(self, other, other_warp, other_epoch, who, acc):
        """Records of other warps (by the vector clock over warps) that the accessing threads
        (`acc`, one a record) are not ordered after; all False until a barrier of part of a CTA
        made the clocks."""
        if self.known is None:
            return np.zeros(len(other), bool)
        warp = who[:, R_WARP]
        race = np.zeros(len(other), bool)
        single = (other != NOBODY) & (other != ASYNC) & (other_warp != MANY) & (other_warp != warp)
        if single.any():
            k = np.flatnonzero(single)
            race[k] = self._newer(other_epoch[k], self._known(acc[k], other_warp[k].astype(np.int64)))
        many = (other != NOBODY) & (other_warp == MANY)
        if many.any():
            k = np.flatnonzero(many)
            race[k] = self._newer(other_epoch[k], self._known_other(acc[k]))
        return race

    def warp_barrier(self, threads):
        """bar.warp.sync by these threads: the same for their warps."""
        synced = np.zeros(self.st.warp_lanes.size, bool)
        synced[self.st.warp[threads]] = True
        self.who[synced[self.st.warp], WARP_EPOCH] += np.uint16(1)

    @staticmethod
    def _location(k, rows, size, per):
        """(access index, shared byte) of record k of `per` records per row."""
        return k // per, rows[k // per] * size + k % per

    def read(self, off, size, threads):
        rows = off // size
        w, r = self._fields(size, self._gather(self.writes, rows, size),
                            self._gather(self.reads, rows, size))
        per = len(w) // len(rows)
        who = self._who(threads, per)
        lin, warp, epoch, wepoch = who.T
        if self.copies:
            self._check_pending(w[:, W_PENDING], rows, size, per, threads, "read")
        self._check_written(w[:, W_THREAD], rows, size, per, threads, "read of")
        self._check_writer(w, rows, size, per, who, threads, "reads")
        reader, reader_warp = r[:, R_THREAD], r[:, R_WARP]
        stale = (reader == NOBODY) | (r[:, EPOCH] != epoch) | (
            (reader_warp == warp) & (r[:, WARP_EPOCH] != wepoch))
        acc = self._per_access(threads, per)
        if self.known is not None:     # an earlier read this thread is not ordered after stays
            stale &= (reader == NOBODY) | ~(self._unordered(reader, reader_warp, r[:, EPOCH], who, acc) | (
                (reader_warp == MANY) & self._newer(r[:, EPOCH], self.base[self.st.cta[acc]])))
        new = who        # this thread and epochs, with MANY where others read it before
        if not stale.all():
            keep = ~stale
            new[keep & (reader != lin), R_THREAD] = MANY
            new[keep & (reader_warp != warp), R_WARP] = MANY
            if self.known is not None:      # the newest of the readers' epochs
                older = keep & self._newer(r[:, EPOCH], self.epoch[acc])
                new[older, EPOCH] = r[older, EPOCH]
        self._scatter(self.reads, rows, size, new)
        self._merge_readers(rows, size, new, threads)

    def _merge_readers(self, rows, size, new, threads):
        """Several threads read one row in this very step and the last one's record won:
        such a row's readers are MANY threads, and MANY warps if some reader's warp is not
        the last one's."""
        order = np.arange(len(rows))
        np.put(self.row_reader, rows, order)
        last = np.take(self.row_reader, rows)
        others = np.flatnonzero(last != order)
        if not len(others):
            return
        last = last[others]
        warp = self.lin[threads] >> 5
        shared = np.zeros(len(rows), bool)        # last readers of rows that several read
        shared[last] = True
        mixed = np.zeros(len(rows), bool)         # ... that several warps read
        mixed[last[warp[others] != warp[last]]] = True
        winners = np.flatnonzero(shared)
        record = np.take(new.view(np.uint64).reshape(len(rows), -1), winners, axis=0)
        fields = record.view(np.uint16).reshape(-1, 4)
        fields[:, R_THREAD] = MANY
        fields[np.repeat(mixed[winners], record.shape[1]), R_WARP] = MANY
        self._scatter(self.reads, rows[winners], size, record)

    def write(self, off, size, threads, values=None):
        """A store of `values` ([threads, ...], as many bytes as size each; None: unknown). A
        store that leaves its bytes as they were (the same value again) races with nothing,
        as compute-sanitizer's racecheck sees it too."""
        rows = off // size
        r, w = self._fields(size, self._gather(self.reads, rows, size), self._gather(self.writes, rows, size))
        per = len(r) // len(rows)
        who = self._who(threads, per)
        if self.copies:
            self._check_pending(w[:, W_PENDING], rows, size, per, threads, "overwrite")
        new = None if values is None else np.ascontiguousarray(values).view(np.uint8).reshape(len(rows), size)
        changes = None if new is None else np.repeat(
            (new != self.st.shared[off[:, None] + np.arange(size)]).any(axis=1), per)
        self._check_readers(r, rows, size, per, who, threads, changes)
        self._check_writer(w, rows, size, per, who, threads, "overwrites", " (write-after-write)", changes=changes)
        self._check_one_step(rows, size, threads, new)
        who[:, W_PENDING] = 0           # who becomes the write record
        self._scatter(self.writes, rows, size, who)

    def _check_writer(self, w, rows, size, per, who, threads, access, kind="", atomic=False, changes=None):
        """An access after another thread's write of the same barrier interval (an atomic after
        another atomic is fine: they are ordered among themselves; `changes`: the records a
        store changes, where known)."""
        _, warp, _, wepoch = who.T
        writer = w[:, W_THREAD]
        race = self._unsynchronised(writer, writer >> 5, w[:, EPOCH], who, threads, per, changes)
        if race.any():
            race &= (writer != NOBODY) & (writer != ASYNC) & ~(((writer >> 5) == warp) & (w[:, WARP_EPOCH] != wepoch))
            if atomic:
                race &= w[:, W_PENDING] != ATOMIC
            if race.any():
                k = np.flatnonzero(race)[0]
                i, byte = self._location(k, rows, size, per)
                raise Finding(f"shared-memory race: {access} {self.where(byte)} written by thread "
                              f"{self.thread_xyz(writer[k])} with no barrier in between{kind}", threads[i])

    def _check_one_step(self, rows, size, threads, new):
        """Threads of different warps storing different bytes to one row in the same
        instruction: the hardware orders them no way (lanes of one warp: one of them wins, as
        here). new: the stored bytes [accesses, size], None where unknown."""
        order = np.arange(len(rows))
        np.put(self.row_reader, rows, order)
        last = np.take(self.row_reader, rows)
        clash = last != order
        if clash.any():
            warp = self.lin[threads] >> 5
            clash &= warp != warp[last]
            if new is not None and clash.any():
                k = np.flatnonzero(clash)
                clash[k] = (new[k] != new[last[k]]).any(axis=1)
            if clash.any():
                k = int(np.flatnonzero(clash)[0])
                raise Finding(f"shared-memory race: overwrites {self.where(int(rows[k]) * size)} "
                              f"which thread {self.thread_xyz(self.lin[threads[last[k]]])} writes in the same "
                              "instruction (two warps store to the same bytes)", threads[k])

    def _unsynchronised(self, other, other_warp, other_epoch, who, threads, per, changes):
        """Records left by another thread in the accessing thread's barrier interval, or, after a
        barrier of part of a CTA, that no barrier orders before it (_unordered); where `changes`
        says, only those of a store that changes the bytes."""
        race = (other_epoch == who[:, EPOCH]) & (other != who[:, R_THREAD])
        if self.known is not None:
            race |= self._unordered(other, other_warp, other_epoch, who, self._per_access(threads, per))
        return race if changes is None else race & changes

    def _check_readers(self, r, rows, size, per, who, threads, changes=None):
        _, warp, _, wepoch = who.T
        reader = r[:, R_THREAD]
        race = self._unsynchronised(reader, r[:, R_WARP], r[:, EPOCH], who, threads, per, changes)
        if race.any():
            race &= (reader != NOBODY) & ~((r[:, R_WARP] == warp) & (r[:, WARP_EPOCH] != wepoch))
            if race.any():
                k = np.flatnonzero(race)[0]
                i, byte = self._location(k, rows, size, per)
                who = "several threads" if reader[k] == MANY else f"thread {self.thread_xyz(reader[k])}"
                raise Finding(f"shared-memory race: overwrites {self.where(byte)} which {who} "
                              "read with no barrier in between (write-after-read)", threads[i])

    def atomic(self, off, size, threads):
        """atom/red on shared bytes [off, off+size): they must hold a value; the update counts
        as each thread's write (plain accesses by others need a barrier after it)."""
        rows = off // size
        w, r = self._fields(size, self._gather(self.writes, rows, size), self._gather(self.reads, rows, size))
        per = len(w) // len(rows)
        if self.copies:
            self._check_pending(w[:, W_PENDING], rows, size, per, threads, "atomic update")
        self._check_written(w[:, W_THREAD], rows, size, per, threads, "atomic update of")
        who = self._who(threads, per)
        self._check_readers(r, rows, size, per, who, threads)
        self._check_writer(w, rows, size, per, who, threads, "atomically updates", atomic=True)
        who[:, W_PENDING] = ATOMIC
        self._scatter(self.writes, rows, size, who)

    def _check_written(self, writer, rows, size, per, threads, access):
        """Shared memory starts undefined (not zero) on the GPU: reading a never-written byte
        is a finding."""
        never = writer == NOBODY
        if never.any():
            i, byte = self._location(np.flatnonzero(never)[0], rows, size, per)
            raise Finding(f"{access} {self.where(byte)}, which no thread of this CTA has written "
                          "(shared memory starts undefined)", threads[i])

    # -- cp.async
    def copy_issued(self, off, size, threads, line):
        """cp.async to shared bytes [off, off+size) of each thread: pending until waited for.
        Readers before it must still be ordered before the issue."""
        rows = off // size
        w, r = self._fields(size, self._gather(self.writes, rows, size),
                            self._gather(self.reads, rows, size))
        per = len(w) // len(rows)
        if self.copies:
            self._check_pending(w[:, W_PENDING], rows, size, per, threads, "overwrite")
        self._check_readers(r, rows, size, per, self._who(threads, per), threads)
        w = w.copy()
        w[:, W_PENDING] = PENDING
        self._scatter(self.writes, rows, size, w)
        self.copies.append(AsyncCopy(threads, self.committed[threads], rows, size, line))

    def commit(self, threads):
        self.committed[threads] += 1

    def wait(self, threads, newest):
        """cp.async.wait_group newest: all but the newest `newest` committed groups of these
        threads are complete; their copies become writes as of now."""
        self.completed[threads] = np.maximum(self.completed[threads], self.committed[threads] - newest)
        outstanding = []
        for copy in self.copies:
            done = copy.group < self.completed[copy.threads]
            if done.any():
                who = self._who(copy.threads[done], 1)
                who[:, W_PENDING] = 0
                self._scatter(self.writes, copy.rows[done], copy.size, who)
            if not done.all():
                keep = ~done
                outstanding.append(AsyncCopy(copy.threads[keep], copy.group[keep], copy.rows[keep],
                                             copy.size, copy.line))
        self.copies = outstanding

    def forget(self, granules):
        """Drop the records of these 16-byte granules: accesses ordered by mbarriers, which
        hopper.Ordering judges instead."""
        byte = (np.asarray(granules)[:, None] * 16 + np.arange(16)).ravel()
        self.reads[byte, R_THREAD] = NOBODY
        self.writes[byte, W_THREAD] = ASYNC  # written (not undefined), its readers judged there
        self.writes[byte, W_PENDING] = 0

    def take_copies(self, threads):
        """cp.async.mbarrier.arrive: these threads' outstanding cp.asyncs leave commit-group
        tracking (the mbarrier tracks them now); returns them."""
        mine = np.zeros(self.st.n, bool)
        mine[threads] = True
        taken, kept = [], []
        for copy in self.copies:
            hit = mine[copy.threads]
            for part, out in ((hit, taken), (~hit, kept)):
                if part.any():
                    out.append(AsyncCopy(copy.threads[part], copy.group[part], copy.rows[part],
                                         copy.size, copy.line))
        self.copies = kept
        return taken

    def check_ended(self, ctas):
        """The last threads of these CTAs exit: none of their cp.asyncs may be in flight."""
        for copy in self.copies:
            left = np.isin(self.st.cta[copy.threads], ctas)
            if left.any():
                raise Finding(f"the CTA ends while this thread's cp.async on line {copy.line} is in flight: "
                              "neither waited for (cp.async.wait_group/wait_all) nor handed to an mbarrier",
                              copy.threads[left][0])

    def _check_pending(self, pending, rows, size, per, threads, access):
        pending = pending == PENDING
        if not pending.any():
            return
        i, byte = self._location(np.flatnonzero(pending)[0], rows, size, per)
        for copy in self.copies:
            hit = np.flatnonzero(copy.rows == byte // copy.size)
            if len(hit):
                owner, group = copy.threads[hit[0]], int(copy.group[hit[0]])
                raise Finding(f"{access} of shared memory whose cp.async (line {copy.line}) has not "
                              f"been waited for: {self.where(byte)} is copied by thread "
                              f"{self.thread_xyz(self.lin[owner])} in its commit group {group}, and "
                              f"its cp.async waits have completed {int(self.completed[owner])} "
                              "group(s)", threads[i])

    def where(self, byte):
        offset = int(byte) % self.st.shared_stride
        prog = self.st.program
        spans = [(v.name, v.offset, v.size) for v in prog.shared.values()]
        if prog.dynamic_shared is not None:
            dyn = prog.dynamic_shared
            spans.append((dyn.name, dyn.offset, self.st.shared_size - dyn.offset))
        for name, start, size in spans:
            if start <= offset < start + size:
                return f"shared byte {offset} ({name}+{offset - start})"
        return f"shared byte {offset}"

    def thread_xyz(self, lin):
        bx, by, _ = self.st.block
        lin = int(lin)
        return f"({lin % bx},{lin // bx % by},{lin // (bx * by)})"


def warp_members(st, threads, mask, what):
    """Check that every lane named in each thread's member mask executes this warp-collective
    instruction together with it; returns the executing-lane bits of each thread's warp."""
    if len(threads) == st.n and np.ndim(mask) == 0 and mask == 0xFFFFFFFF:
        return st.warp_lanes[st.warp]             # the whole wave, full masks: nothing to check
    warp = st.warp[threads]
    lane = st.lane[threads]
    executing = np.bincount(warp, weights=np.ldexp(1.0, lane), minlength=st.warp_lanes.size)
    executing = executing.astype(np.uint64)
    mask = np.broadcast_to(np.asarray(mask, np.uint64), threads.shape)
    own = (mask >> lane.astype(np.uint64)) & np.uint64(1)
    if not own.all():
        raise Finding(f"{what}: executing lane {int(lane[np.flatnonzero(own == 0)[0]])} is not in "
                      f"its member mask {int(mask[np.flatnonzero(own == 0)[0]]):#010x}",
                      threads[np.flatnonzero(own == 0)[0]])
    missing = mask & st.warp_lanes[warp] & ~executing[warp]
    if missing.any():
        i = int(np.flatnonzero(missing)[0])
        lanes = [k for k in range(32) if int(missing[i]) >> k & 1]
        raise Finding(f"{what}: lanes {lanes} of member mask {int(mask[i]):#010x} are not "
                      "executing this instruction together (divergent or exited)", threads[i])
    return executing[warp]


def full_warps(st, threads, what):
    """ldmatrix/mma need all 32 lanes of each warp converged; returns threads as [warps, 32]."""
    warp_members(st, threads, np.uint64(0xFFFFFFFF), what)
    incomplete = st.warp_lanes[st.warp[threads]] != 0xFFFFFFFF
    if incomplete.any():
        raise Finding(f"{what}: needs a full warp of 32 threads", threads[np.flatnonzero(incomplete)[0]])
    return threads.reshape(-1, 32)


class FloatAtomics:
    """Float atomic additions whose result depends on the order they land in (checked when a
    launch asks for a deterministic result). Per element: whether threads other than the first
    added to it, the sum of the magnitudes of its initial value and addends, and the finest
    power of two that all of them are multiples of. While that sum stays below 2^p times that
    power (p = 24 for f32, 53 for f64) every partial sum, in any order, is exact, so the result
    cannot depend on the order; past it, additions by two or more threads are a finding."""

    def __init__(self):
        self.elements = {}        # region -> (first thread, several threads?, magnitude sum, grid)

    def add(self, region, elems, mem, values, threads):
        if region not in self.elements:
            n = mem.size
            self.elements[region] = (np.full(n, -1, np.int64), np.zeros(n, bool), np.zeros(n),
                                     np.full(n, np.inf))
        first, several, total, grid = self.elements[region]
        fresh = np.unique(elems[first[elems] < 0])
        start = mem[fresh].astype(np.float64)
        total[fresh] = np.abs(start)
        grid[fresh] = nm.finest(start)
        unset = first[elems] < 0
        first[elems[unset]] = threads[unset]          # one of this step's threads per element
        several[elems[threads != first[elems]]] = True
        values = values.astype(np.float64)
        np.add.at(total, elems, np.abs(values))
        np.minimum.at(grid, elems, nm.finest(values))
        bits = 24 if mem.dtype == np.float32 else 53
        bad = several[elems] & (total[elems] >= np.ldexp(grid[elems], bits))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise Finding("float atomic add whose result depends on the order the additions land in "
                          "(several threads add to this element and not every partial sum is exact): "
                          "the launch asked for a deterministic result", threads[i])
