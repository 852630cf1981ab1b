"""Machine state of one wave of CTAs: registers as arrays over every thread of the wave,
per-CTA shared memory, per-thread local memory, and the launch's global address space."""
import bisect
from functools import cache

import numpy as np

from ..errors import LaunchError
from .findings import Finding
from .parser import SHARED_BASE, TYPES
from .sanitizer import SharedRaces

FULL = slice(None)              # "every thread of the wave", cheaper than an index array
# A `sel` of threads is FULL, another slice of the wave (a contiguous range) or an index array.
SHARED_WINDOW = 1 << 32         # generic addresses [2^32, 2^33) are the CTA's shared memory
GLOBAL_BASE = 1 << 40           # first global array; arrays sit 1 MiB apart, 256-aligned
GLOBAL_GAP = 1 << 20

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_SINT = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}


def item(size):
    """dtype of one aligned `size`-byte access: an unsigned integer, or raw bytes past 8;
    np.take/np.put of whole items beat fancy indexing of [threads, elements] arrays."""
    return np.dtype(_UINT[size]) if size in _UINT else np.dtype((np.void, size))


# The type helpers are pure and run for every operand of every compiled instruction: cached.
@cache
def dtype_of(t):
    """numpy dtype an instruction type computes in (bf16 and packed types as raw bits)."""
    size, kind = TYPES[t]
    if kind == "p":
        return np.dtype(np.bool_)
    if kind == "s":
        return np.dtype(_SINT[size])
    if kind == "f":
        return np.dtype({2: np.float16, 4: np.float32, 8: np.float64}[size])
    return np.dtype(_UINT[size])


@cache
def storage_of(t):
    """numpy dtype a register of type t is stored as: raw bits of its width."""
    size, kind = TYPES[t]
    return np.dtype(np.bool_) if kind == "p" else np.dtype(_UINT[size])


@cache
def converter(src, t):
    """Function turning values of dtype src into the dtype of type t, PTX-style: same width
    reinterprets bits, narrower truncates, wider extends by t's signedness (None = as is)."""
    dst = dtype_of(t)
    src = np.dtype(src)
    if src == dst:
        return None
    if src.kind == "b" or dst.kind == "b":
        return lambda a: a != 0 if dst.kind == "b" else a.astype(dst)
    if src.itemsize == dst.itemsize:
        return lambda a: a.view(dst)
    if src.itemsize > dst.itemsize:
        narrow = _UINT[dst.itemsize]
        return lambda a: a.view(_UINT[src.itemsize]).astype(narrow).view(dst)
    ext = _SINT[src.itemsize] if TYPES[t][1] == "s" else _UINT[src.itemsize]
    wide = _SINT[dst.itemsize] if TYPES[t][1] == "s" else _UINT[dst.itemsize]
    return lambda a: a.view(ext).astype(wide).view(dst)


@cache
def store_converter(t, storage):
    """Function turning a value of type t into a register's storage dtype."""
    src = dtype_of(t)
    storage = np.dtype(storage)
    if src == storage:
        return None
    if storage.kind == "b" or src.kind == "b":
        return lambda v: np.asarray(v).astype(storage)
    if src.itemsize == storage.itemsize:
        return lambda v: np.asarray(v).view(storage)
    if src.itemsize > storage.itemsize:
        return lambda v: np.asarray(v).view(_UINT[src.itemsize]).astype(storage)
    ext = _SINT[src.itemsize] if TYPES[t][1] == "s" else _UINT[src.itemsize]
    return lambda v: np.asarray(v).view(ext).astype(_SINT[storage.itemsize]).view(storage)


def first(sel, bad):
    """Wave index of the first thread of sel for which bad (a mask over sel) holds."""
    pos = int(np.flatnonzero(bad)[0])
    return (sel.start or 0) + pos if isinstance(sel, slice) else int(sel[pos])


class GlobalMemory:
    """The launch's arrays mapped into one virtual address space, written in place."""

    def __init__(self):
        self.bases, self.sizes, self.bytes, self.arrays, self.names = [], [], [], [], []
        self._views = {}
        self.next_base = GLOBAL_BASE

    def map(self, array, name):
        if not isinstance(array, np.ndarray) or not array.flags.c_contiguous:
            raise LaunchError(f"argument {name} must be a C-contiguous numpy array")
        base = self.next_base
        self.arrays.append(array)
        self.names.append(name)
        self.bases.append(base)
        self.sizes.append(array.nbytes)
        self.bytes.append(array.reshape(-1).view(np.uint8))
        self.next_base = -(-(base + array.nbytes + GLOBAL_GAP) // 256) * 256
        self._bases = np.array(self.bases, np.int64)
        self._ends = self._bases + np.array(self.sizes, np.int64)
        return base

    def view(self, region, size):
        key = (region, size)
        if key not in self._views:
            raw = self.bytes[region]
            self._views[key] = raw[: raw.size - raw.size % size].view(item(size))
        return self._views[key]

    def holding(self, start, end):
        """The array that contains all of [start, end), or None."""
        i = bisect.bisect_right(self.bases, start) - 1
        return i if i >= 0 and end <= self.bases[i] + self.sizes[i] else None

    def locate(self, addr, size):
        """Region of each address; -1 where any byte of [addr, addr+size) is unmapped."""
        if not self.bases:
            return np.full(np.shape(addr), -1)
        region = np.searchsorted(self._bases, addr, side="right") - 1
        safe = np.maximum(region, 0)
        inside = (region >= 0) & (addr + size <= self._ends[safe])
        return np.where(inside, region, -1)

    def describe_byte(self, region, byte):
        """`name[index]` of the element holding byte `byte` of an array, for messages."""
        array = self.arrays[region]
        index = np.unravel_index(byte // array.itemsize, array.shape) if array.size else ()
        return f"{self.names[region]}[{', '.join(str(int(i)) for i in index)}]"

    def describe(self, addr):
        """Where an address outside every array lies: past the end of the array below it (or
        before the first), and every array's parameter and range, for messages."""
        lines = [f"{name} at [{b:#x}, {b + s:#x})" for name, b, s in zip(self.names, self.bases, self.sizes)]
        below = bisect.bisect_right(self.bases, addr) - 1
        if below >= 0:
            where = f"byte {addr - self.bases[below]} of {self.names[below]}, which holds {self.sizes[below]}"
        else:
            where = "before every array"
        return f"address {addr:#x} is outside every array, {where} ({'; '.join(lines) or 'none passed'})"


class WaveState:
    """Registers and on-chip memory of one wave of CTAs; cta_ids: the CTAs' linear ids in the
    wave's slot order (launch orders them so that its cohorts are contiguous)."""

    def __init__(self, program, grid, block, cta_ids, memory, params, sanitize, shared_bytes):
        bx, by, bz = block
        self.program = program
        self.block = block
        self.sanitize = sanitize
        self.cta_threads = bx * by * bz
        self.num_ctas = num_ctas = len(cta_ids)
        self.cta_ids = cta_ids
        self.n = n = num_ctas * self.cta_threads
        self.warps_per_cta = -(-self.cta_threads // 32)
        self.memory = memory
        self.params = params
        wave = np.arange(n, dtype=np.int64)
        self.all = wave
        self.cta = wave // self.cta_threads
        lin = wave % self.cta_threads
        self.lin = lin
        self.lane = lin % 32
        self.warp = self.cta * self.warps_per_cta + lin // 32      # warp index within the wave
        self.cta_global = cta_ids[self.cta]                          # linear CTA id of each thread
        gx, gy, _ = grid
        cx, cy, cz = cta_ids % gx, cta_ids // gx % gy, cta_ids // (gx * gy)
        u32 = np.uint32
        lane = self.lane.astype(u32)
        self.special = {
            "%tid.x": (lin % bx).astype(u32), "%tid.y": (lin // bx % by).astype(u32),
            "%tid.z": (lin // (bx * by)).astype(u32),
            "%ctaid.x": cx.astype(u32)[self.cta], "%ctaid.y": cy.astype(u32)[self.cta],
            "%ctaid.z": cz.astype(u32)[self.cta],
            "%laneid": lane, "%warpid": (lin // 32).astype(u32),
            "%lanemask_eq": u32(1) << lane, "%lanemask_lt": (u32(1) << lane) - u32(1),
            "%lanemask_le": ((u32(1) << lane) - u32(1)) | (u32(1) << lane),
        }
        self.special["%lanemask_gt"] = ~self.special["%lanemask_le"]
        self.special["%lanemask_ge"] = ~self.special["%lanemask_lt"]
        for name, value in zip(("ntid", "nctaid"), (block, grid)):
            for c, v in zip("xyz", value):
                self.special[f"%{name}.{c}"] = np.broadcast_to(u32(v), (n,))
        # lanes that exist in each warp (the last warp of a CTA may be partial)
        in_last = self.cta_threads - (self.warps_per_cta - 1) * 32
        per_warp = np.full(self.warps_per_cta, 0xFFFFFFFF, np.uint64)
        per_warp[-1] = (1 << in_last) - 1
        self.warp_lanes = np.tile(per_warp, num_ctas)
        self.regs = [None] * len(program.regs)
        self.storage = [storage_of(r.type) for r in program.regs]
        self.written = [None] * len(program.regs)   # per-thread "has been written" (sanitizer)
        self.fully_written = set()
        self.shared_size = shared_bytes
        # strides are multiples of every access size, so aligned accesses are whole items
        self.shared_stride = -(-max(shared_bytes, 1) // 64) * 64
        self.shared = np.zeros(num_ctas * self.shared_stride, np.uint8)
        self.local_size = program.local_size
        self.local_stride = -(-max(program.local_size, 1) // 64) * 64
        self.local = None
        self.local_written = None      # per local byte, with the sanitizer: written by its thread
        self._views = {}
        self.races = None
        # set by launch: the global-memory ordering model, the approximate-instruction model,
        # the float-atomic determinism check (or None) and each thread's rank when atomics contend
        self.ordering = self.approx = self.float_atomics = self.rank = None
        self.pc = 0                 # the instruction being executed
        if sanitize:
            self.races = SharedRaces(self)
        # sm_90a async instructions (hopper.py): their state, the registers they lend out, and
        # why a lent register reads as unwritten
        self.watched = program.async_registers if sanitize else frozenset()
        self.unwritten_note = {}
        self.async_state = program.async_model(self) if program.async_model else None
        # Programmatic dependent launch (sanitizer, kernels whose PTX has griddepcontrol.wait):
        # the threads that have not passed it yet, and the arrays they may touch meanwhile.
        self.before_wait, self.stable_regions = None, frozenset()

    def watch_dependent_launch(self, stable: frozenset[int]) -> None:
        """Check what a programmatic dependent launch allows: until a thread executes
        griddepcontrol.wait, the previous kernel of the stream may still run, so the thread may
        touch only the `stable` arrays (region indices: a model's weights, the same for every
        launch)."""
        self.before_wait = np.ones(self.n, bool)
        self.stable_regions = stable

    def check_dependent(self, region: int, threads) -> None:
        """A global access to `region` by `threads`, before griddepcontrol.wait, is a finding
        unless the array is stable."""
        early = threads[self.before_wait[threads]]
        if len(early) and region not in self.stable_regions:
            raise Finding(f"accesses {self.memory.names[region]} before griddepcontrol.wait: under a programmatic "
                          "dependent launch the previous kernel of the stream may still be writing or reading it "
                          "(only stable arrays, the same in every launch, may be read before the wait)", early[0])

    # -- registers
    def read(self, rid, sel):
        arr = self.regs[rid]
        if arr is None:
            if self.sanitize:
                raise Finding(f"read of register {self.program.regs[rid].name} "
                              "which no thread has written", first(sel, np.ones(1, bool)))
            arr = self.regs[rid] = np.zeros(self.n, self.storage[rid])
        if self.sanitize and rid not in self.fully_written:
            ok = self.written[rid][sel]
            if not ok.all():
                note = self.unwritten_note.get(rid, "before this thread wrote it")
                raise Finding(f"read of register {self.program.regs[rid].name} {note}", first(sel, ~ok))
        if rid in self.watched:
            self.async_state.register_read(rid, sel)
        return arr[sel]

    def write(self, rid, sel, value):
        if rid in self.watched:
            self.async_state.register_written(rid, sel)
        arr = self.regs[rid]
        if arr is None:
            arr = self.regs[rid] = np.zeros(self.n, self.storage[rid])
            if self.sanitize:
                self.written[rid] = np.zeros(self.n, bool)
        arr[sel] = value
        if self.sanitize and rid not in self.fully_written:
            if sel is FULL:
                self.fully_written.add(rid)
                return
            written = self.written[rid]
            written[sel] = True
            if isinstance(sel, slice) and written.all():     # e.g. each cohort wrote it
                self.fully_written.add(rid)

    def indices(self, sel):
        return self.all[sel] if isinstance(sel, slice) else sel

    # -- memory
    def view(self, space, size):
        key = (space, size)
        if key not in self._views:
            raw = self.shared if space == "shared" else self.local
            self._views[key] = raw.view(item(size))
        return self._views[key]

    def global_parts(self, addr, size, threads):
        """segments' [(array index, byte offsets, positions)] of a global access that is not
        within one array: out of bounds (a finding) or across several."""
        region = self.memory.locate(addr, size)
        lo, hi = region.min(), region.max()
        if lo < 0:
            i = int(np.flatnonzero(region < 0)[0])
            raise Finding(f"out-of-bounds {size}-byte global access: "
                          + self.memory.describe(int(addr[i])), threads[i])
        bases = self.memory._bases
        if lo == hi:
            return [(int(lo), addr - bases[lo], FULL)]
        return [(int(r), addr[p] - bases[r], p) for r in np.unique(region) for p in [np.flatnonzero(region == r)]]

    def segments(self, space, addr, size, threads, align=None, hint=False):
        """Split an access of `size` bytes per thread at `addr` (int64) into
        [(region, byte offsets, positions or FULL)] after bounds and alignment checks.
        region is a global array index, 'shared' or 'local'. `hint`: a prefetch, which reads
        no value, so a programmatic dependent launch may issue it before its wait."""
        align = align or size
        bad = addr % align != 0
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise Finding(f"misaligned {size}-byte {space} access at address "
                          f"{int(addr[i]):#x} (needs {align}-byte alignment)", threads[i])
        if space == "generic":
            in_shared = (addr >= SHARED_WINDOW) & (addr < 2 * SHARED_WINDOW)
            if not in_shared.any():
                return self.segments("global", addr, size, threads, align, hint)
            if in_shared.all():
                return self.segments("shared", addr - SHARED_WINDOW, size, threads, align, hint)
            out = []
            for mask, space2, shift in ((in_shared, "shared", SHARED_WINDOW), (~in_shared, "global", 0)):
                pos = np.flatnonzero(mask)
                for region, off, p in self.segments(space2, addr[pos] - shift, size, threads[pos], align, hint):
                    out.append((region, off, pos if isinstance(p, slice) else pos[p]))
            return out
        if space == "global":
            whole = self.memory.holding(int(addr.min()), int(addr.max()) + size)
            if whole is not None:         # the usual case: one array, in bounds
                parts = [(whole, addr - self.memory.bases[whole], FULL)]
            else:
                parts = self.global_parts(addr, size, threads)
            if self.before_wait is not None and not hint:
                for r, _, p in parts:
                    self.check_dependent(r, threads[p])
            return parts
        if space == "shared":
            low, limit, stride, owner = SHARED_BASE, self.shared_size, self.shared_stride, self.cta[threads]
        elif space == "local":
            if self.local is None:
                self.local = np.zeros(self.n * self.local_stride, np.uint8)
                self.local_written = np.zeros(len(self.local), bool) if self.races is not None else None
            low, limit, stride, owner = 0, self.local_size, self.local_stride, threads
        else:
            raise Finding(f"unsupported state space {space}", threads[0], sanitizer=False)
        bad = (addr < low) | (addr + size > limit)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise Finding(f"out-of-bounds {size}-byte {space} access at address {int(addr[i]):#x} "
                          f"({space} memory is [{low:#x}, {limit:#x}))", threads[i])
        return [(space, owner * stride + addr, FULL)]

    def check_local_written(self, off, size, threads):
        """Local memory starts undefined (sanitizer on): a read of a byte this thread has not
        written is a finding."""
        if self.local_written is None:
            return
        unwritten = ~self.local_written[off[:, None] + np.arange(size)].all(axis=1)
        if unwritten.any():
            i = int(np.flatnonzero(unwritten)[0])
            byte = int(off[i]) % self.local_stride
            raise Finding(f"read of local byte {byte}, which this thread has not written (local memory starts "
                          "undefined)", threads[i])

    def typed(self, region, size):
        if isinstance(region, str):
            return self.view(region, size)
        return self.memory.view(region, size)

    def load(self, space, addr, esize, count, threads, access=None):
        """Load count elements of esize bytes per thread -> uint array [threads, count];
        access: how the instruction reads global memory (an ordering.Access; None: weak)."""
        size = esize * count
        out = np.empty((len(threads), count), _UINT[esize])
        for region, off, pos in self.segments(space, addr, size, threads):
            raw = np.take(self.typed(region, size), off // size)
            if region == "shared":
                if self.races is not None:
                    if self.async_state is not None:
                        self.async_state.ordering.shared_read(off, size, threads[pos])
                    self.races.read(off, size, threads[pos])
            elif region == "local":
                self.check_local_written(off, size, threads[pos])
            else:
                raw = self.ordering.load(region, off, size, threads[pos], access, raw)
            out[pos] = raw.view(out.dtype).reshape(-1, count)
        return out

    def store(self, space, addr, esize, values, threads, copy_line=None, access=None):
        """Store values [threads, count] of esize-byte elements. copy_line: the line of the
        cp.async doing this store (the sanitizer keeps its bytes pending until waited for)."""
        size = esize * values.shape[1]
        for region, off, pos in self.segments(space, addr, size, threads):
            if region == "shared":
                if self.races is not None:
                    if self.async_state is not None:
                        self.async_state.ordering.shared_write(off, size, threads[pos], copy_line)
                    if copy_line is None:
                        self.races.write(off, size, threads[pos], values[pos])
                    else:
                        self.races.copy_issued(off, size, threads[pos], copy_line)
            elif region == "local":
                if self.local_written is not None:
                    self.local_written[off[:, None] + np.arange(size)] = True
            else:
                self.ordering.store(region, off, size, threads[pos], access)
            data = self.typed(region, size)
            np.put(data, off // size, np.ascontiguousarray(values[pos]).reshape(-1).view(data.dtype))
