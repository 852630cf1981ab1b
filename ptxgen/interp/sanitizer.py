"""Checks that need bookkeeping beyond plain execution: shared-memory races and
warp-collective membership. Findings are raised as state.Finding; launch formats them."""
import numpy as np

from .state import Finding

NOBODY, MANY = -1, -2


class SharedRaces:
    """Per byte of shared memory: the last writer and the reader(s) since the last barrier.

    Threads are recorded by linear id within their CTA (the byte says which CTA). An access
    conflicts with an earlier one by another thread of the same barrier interval (CTA epoch)
    unless both threads are in one warp and that warp passed bar.warp.sync in between.
    Epochs are 16-bit counters compared for equality; they wrap after 65536 barriers."""

    def __init__(self, st):
        size = st.shared.size
        self.st = st
        self.writer = np.full(size, NOBODY, np.int16)
        self.w_epoch = np.zeros(size, np.uint16)
        self.w_warp_epoch = np.zeros(size, np.uint16)
        self.reader = np.full(size, NOBODY, np.int16)
        self.r_warp = np.full(size, NOBODY, np.int8)     # warp of the reader(s), MANY if mixed
        self.r_epoch = np.zeros(size, np.uint16)
        self.r_warp_epoch = np.zeros(size, np.uint16)

    def _bytes(self, off, size, threads):
        """Byte addresses [threads, size] and per-thread columns [threads, 1] of who accesses."""
        st = self.st
        b = off[:, None] + np.arange(size)
        lin = st.lin[threads]
        column = lambda x: x[:, None]
        return (b, column(lin.astype(np.int16)), column((lin // 32).astype(np.int8)),
                column(st.cta_epoch[st.cta[threads]]), column(st.warp_epoch[st.warp[threads]]))

    def _synced(self, other_warp, warp, recorded, now):
        return (other_warp == warp) & (recorded != now)

    def read(self, off, size, threads):
        b, lin, warp, epoch, wepoch = self._bytes(off, size, threads)
        w = self.writer[b]
        race = (w != NOBODY) & (w != lin) & (self.w_epoch[b] == epoch) & ~self._synced(
            (w // 32).astype(np.int8), warp, self.w_warp_epoch[b], wepoch)
        if race.any():
            i, j = np.argwhere(race)[0]
            raise Finding(f"shared-memory race: reads {self.where(b[i, j])} written by thread "
                          f"{self.thread_xyz(w[i, j])} with no barrier in between", threads[i])
        prev, prev_warp = self.reader[b], self.r_warp[b]
        stale = (prev == NOBODY) | (self.r_epoch[b] != epoch) | self._synced(
            prev_warp, warp, self.r_warp_epoch[b], wepoch)
        new = np.where(stale | (prev == lin), lin, np.int16(MANY))
        new_warp = np.where(stale | (prev_warp == warp), warp, np.int8(MANY))
        self.reader[b] = new
        self.r_warp[b] = new_warp
        # several threads reading one byte in this very step: the last assignment won
        self.reader[b[self.reader[b] != new]] = MANY
        self.r_warp[b[self.r_warp[b] != new_warp]] = MANY
        self.r_epoch[b] = epoch
        self.r_warp_epoch[b] = wepoch

    def write(self, off, size, threads):
        b, lin, warp, epoch, wepoch = self._bytes(off, size, threads)
        r = self.reader[b]
        race = (r != NOBODY) & (r != lin) & (self.r_epoch[b] == epoch) & ~self._synced(
            self.r_warp[b], warp, self.r_warp_epoch[b], wepoch)
        if race.any():
            i, j = np.argwhere(race)[0]
            who = "several threads" if r[i, j] == MANY else f"thread {self.thread_xyz(r[i, j])}"
            raise Finding(f"shared-memory race: overwrites {self.where(b[i, j])} which {who} "
                          "read with no barrier in between (write-after-read)", threads[i])
        self.writer[b] = lin
        self.w_epoch[b] = epoch
        self.w_warp_epoch[b] = wepoch

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
