"""Opcode table: each PTX opcode compiles, once per program, into a function that executes
the instruction for a vector of threads (`sel`: a slice or an index array into the wave).

Floating point: add/sub/mul/div/sqrt/rcp .rn on f32 are numpy's IEEE float32 operations;
fma/mad and directed roundings are computed exactly (see numerics). The .approx functions
(ex2, lg2, rsqrt, sin, cos, tanh, div.approx/full, rcp/sqrt.approx) and mma.sync's sums go
through the launch's approx model (approx.py): within the hardware's error bounds, or exact.

Global loads, stores, atomics and fences report to the launch's ordering model (ordering.py)
with their memory-model qualifiers, and bar.warp.sync its lanes (which pass on what each
acquired); the other qualifiers (cache hints, .aligned, .uni) are accepted and ignored.
"""
from fractions import Fraction

import numpy as np

from ..errors import InterpError
from . import numerics as nm
from .approx import EXACT
from .ordering import access_of, fence_of
from .parser import (TENSOR_MAP, TIMERS, TYPE_NAME, TYPES, Addr, Imm, Neg, Pair, Reg, Sink, Special, Sym, Vec,
                     tensor_map_address)
from .sanitizer import full_warps, warp_members
from .findings import Finding
from .state import SHARED_WINDOW, converter, dtype_of, storage_of, store_converter

FLOAT_ROUND = ("rn", "rz", "rm", "rp")
INT_ROUND = ("rni", "rzi", "rmi", "rpi")
IGNORED = {"nc", "ca", "cg", "cs", "lu", "cv", "wb", "wt", "volatile", "relaxed", "acquire",
           "release", "acq_rel", "weak", "cta", "gpu", "sys", "cluster", "aligned", "sync",
           "uni", "noftz"}
SPACES = {"param", "global", "shared", "local", "shared::cta", "const"}


class Exec:
    """A compiled instruction: kind is alu, bra, exit, bar or wait. target: a branch's target, a
    barrier's (waits, aligned), a wait's what it waits for (launch's deadlock report).
    strong_read: a strong global load (the scheduler's spin-wait detection)."""
    __slots__ = ("ins", "kind", "run", "target", "strong_read")

    def __init__(self, ins, kind, run=None, target=None):
        self.ins, self.kind, self.run, self.target = ins, kind, run, target
        self.strong_read = False


COMPILERS = {}


def opcode(*names):
    def register(fn):
        for name in names:
            COMPILERS[name] = fn
        return fn
    return register


def compile_program(prog):
    out = []
    accessors = {}
    for ins in prog.instructions:
        compile_fn = COMPILERS.get(ins.base)
        if compile_fn is None:
            raise InterpError(f"line {ins.line}: `{ins.text}`: unsupported opcode {ins.opcode}")
        out.append(compile_fn(Ctx(ins, prog, accessors)))
    return out


def _count(st, sel):
    return len(st.all[sel]) if isinstance(sel, slice) else len(sel)


def _uint(size):
    return np.dtype(f"u{size}")


class Ctx:
    """One instruction being compiled: its modifiers, type and operand accessors."""
    # compiled closures keep their Ctx alive: no per-instance dict for the garbage collector
    __slots__ = ("ins", "prog", "accessors", "mods", "ops", "_type", "types")

    def __init__(self, ins, prog, accessors):
        self.ins, self.prog = ins, prog
        self.accessors = accessors      # operand accessors, shared across the program
        self.mods = ins.mods
        self.ops = ins.operands
        types = [m for m in self.mods if m in TYPES]
        self._type = types[-1] if types else None
        self.types = types
        unknown = [m for m in self.mods if m not in TYPES and TYPE_NAME.fullmatch(m)]
        if unknown:
            self.fail(f"unsupported type .{unknown[0]}")

    @property
    def type(self) -> str:
        """The instruction's (last) type modifier; an instruction that needs one and lacks it fails."""
        if self._type is None:
            self.fail(f"{self.ins.base} needs a type (e.g. .u32, .f32)")
        return self._type

    def fail(self, msg):
        raise InterpError(f"line {self.ins.line}: `{self.ins.text}`: {msg}")

    def alu(self, run):
        return Exec(self.ins, "alu", run)

    def has(self, *mods):
        return any(m in self.mods for m in mods)

    def pick(self, options, default=None):
        found = [m for m in self.mods if m in options]
        if len(found) > 1:
            self.fail(f"conflicting modifiers {found}")
        return found[0] if found else default

    def check_mods(self, allowed):
        for m in self.mods:
            if m not in allowed and m not in TYPES and m not in IGNORED and not m.startswith(("L1::", "L2::")):
                self.fail(f"unsupported modifier .{m} on {self.ins.base}")

    def need(self, count):
        if len(self.ops) != count:
            self.fail(f"expected {count} operands, found {len(self.ops)}")

    # -- operands
    def reg_type(self, reg):
        return self.prog.regs[reg.id].type

    def read(self, op, t):
        """Accessor (st, sel) -> values of type t's dtype (numpy scalar for immediates).
        One per distinct operand and type in a program: fewer objects, for the garbage
        collector to walk, than one per instruction."""
        if isinstance(op, int):
            op = self.ops[op]
        if isinstance(op, Special) and self.ins.base != "mov":
            self.fail(f"special register {op.name} can only be read by mov")
        # repr tells -0.0 from 0.0, which compare (and hash) equal
        key = ("read", t, op.kind, repr(op.value)) if isinstance(op, Imm) else ("read", t, op)
        if key not in self.accessors:
            self.accessors[key] = self._reader(op, t)
        return self.accessors[key]

    def _reader(self, op, t):
        if isinstance(op, Reg):
            rid = op.id
            conv = converter(storage_of(self.reg_type(op)), t)
            if conv is None:
                return lambda st, sel: st.read(rid, sel)
            return lambda st, sel: conv(st.read(rid, sel))
        if isinstance(op, Special) and op.name in TIMERS:
            timer = dtype_of(TIMERS[op.name]).type
            conv = converter(timer, t) or _as_is
            wrap = int(np.iinfo(timer).max)
            return lambda st, sel: conv(np.full(_count(st, sel), st.stats.instructions & wrap, timer))
        if isinstance(op, Special):
            name, conv = op.name, converter(np.uint32, t)
            if conv is None:
                return lambda st, sel: st.special[name][sel]
            return lambda st, sel: conv(st.special[name][sel])
        if isinstance(op, Neg):
            rid = op.reg.id
            return lambda st, sel: ~st.read(rid, sel)
        if isinstance(op, Imm):
            value = self.immediate(op, t)
            return lambda st, sel: value
        if isinstance(op, Sym):
            value = self.immediate(Imm(self.symbol(op.name), "int"), t)
            return lambda st, sel: value
        self.fail(f"unsupported operand {op}")

    def immediate(self, op, t):
        size, kind = TYPES[t]
        dt = dtype_of(t)
        if kind == "p":
            return np.bool_(op.value)
        if op.kind in ("f32bits", "f64bits"):
            src = np.float32 if op.kind == "f32bits" else np.float64
            value = np.array(op.value, _uint(np.dtype(src).itemsize)).view(src)
            if kind == "f":
                return dt.type(value.astype(dt))
            if kind == "bf":
                return nm.f32_to_bf16_bits(value.astype(np.float32))[()]
            return np.array(op.value & ((1 << 8 * size) - 1), _uint(size)).view(dt)[()]
        if op.kind == "float":
            if kind == "f":
                return dt.type(op.value)
            if kind == "bf":
                return nm.f32_to_bf16_bits(np.float32(op.value))[()]
            self.fail(f"float literal for .{t}")
        if kind == "f":
            return dt.type(op.value)
        return np.array(op.value & ((1 << 8 * size) - 1), _uint(size)).view(dt)[()]

    def symbol(self, name):
        prog = self.prog
        for table in (prog.shared, prog.local):
            if name in table:
                return table[name].offset
        if prog.dynamic_shared is not None and prog.dynamic_shared.name == name:
            return prog.dynamic_shared.offset
        for index, (param, kind) in enumerate(prog.params):
            if param == name and kind == TENSOR_MAP:
                return tensor_map_address(index)
        self.fail(f"unknown symbol {name}")

    def write(self, op, t):
        """Accessor (st, sel, value of type t) storing into a register (or the `_` sink),
        shared like read's."""
        if isinstance(op, int):
            op = self.ops[op]
        key = ("write", t, op)
        if key not in self.accessors:
            self.accessors[key] = self._writer(op, t)
        return self.accessors[key]

    def _writer(self, op, t):
        if isinstance(op, Sink):
            return lambda st, sel, v: None
        if not isinstance(op, Reg):
            self.fail(f"destination must be a register, found {op}")
        rid = op.id
        conv = store_converter(t, storage_of(self.reg_type(op)))
        if conv is None:
            return lambda st, sel, v: st.write(rid, sel, v)
        return lambda st, sel, v: st.write(rid, sel, conv(v))

    def space(self):
        found = [m for m in self.mods if m in SPACES]
        space = found[0] if found else "generic"
        if space == "const":
            self.fail("the .const state space is not supported")
        return "shared" if space == "shared::cta" else space

    def address(self, op, space):
        """Accessor (st, sel) -> int64 addresses of the executing threads."""
        if not isinstance(op, Addr):
            self.fail("expected an address operand [..]")
        offset = op.offset
        if isinstance(op.base, Reg):
            base = self.read(op.base, "u64")
            return lambda st, sel: base(st, sel).astype(np.int64) + offset
        if isinstance(op.base, Sym):
            offset += self.symbol(op.base.name) + (SHARED_WINDOW if space == "generic" else 0)
            if space not in ("shared", "local", "generic"):
                self.fail(f"symbol {op.base.name} used as a {space} address")
        return lambda st, sel: np.full(_count(st, sel), offset, np.int64)

    def finish_float(self, values, t):
        """Apply .ftz and .sat to a float result."""
        if "ftz" in self.mods and t == "f32":
            values = nm.flush_subnormal(values)
        if "sat" in self.mods:
            values = np.where(np.isnan(values), 0, np.clip(values, 0, 1)).astype(values.dtype)
        return values


def _as_is(x):
    return x


def _ftz_in(c, t):
    if "ftz" in c.mods and t == "f32":
        return nm.flush_subnormal
    return _as_is


# ---- data movement ---------------------------------------------------------------------
@opcode("mov")
def _mov(c):
    c.need(2)
    d, a = c.ops
    t = c.type
    size = TYPES[t][0]
    if isinstance(d, Vec):          # unpack: lowest element from the lowest bits
        src = c.read(a, f"b{size * 8}")
        part = size // len(d.items)
        writers = [c.write(item, f"b{part * 8}") for item in d.items]
        udt, pdt = _uint(size), _uint(part)

        def unpack(st, sel):
            v = np.asarray(src(st, sel)).astype(udt)
            for i, w in enumerate(writers):
                w(st, sel, (v >> udt.type(8 * part * i)).astype(pdt))
        return c.alu(unpack)
    if isinstance(a, Vec):
        part = size // len(a.items)
        readers = [c.read(item, f"b{part * 8}") for item in a.items]
        dst = c.write(d, f"b{size * 8}")
        udt = _uint(size)

        def pack(st, sel):
            v = udt.type(0)
            for i, r in enumerate(readers):
                v = v | (np.asarray(r(st, sel)).astype(udt) << udt.type(8 * part * i))
            dst(st, sel, v)
        return c.alu(pack)
    src, dst = c.read(a, t), c.write(d, t)
    return c.alu(lambda st, sel: dst(st, sel, src(st, sel)))


def _vector(c):
    vec = next((int(m[1:]) for m in c.mods if m in ("v2", "v4", "v8")), 1)
    return vec


@opcode("ld", "ldu")
def _ld(c):
    c.check_mods({"param", "global", "shared", "local", "shared::cta", "v2", "v4", "v8"})
    if len(c.ops) not in (2, 3):
        c.fail("expected destination and address")
    space, t, vec = c.space(), c.type, _vector(c)
    d = c.ops[0]
    items = d.items if isinstance(d, Vec) else (d,)
    if len(items) != vec:
        c.fail(f"{len(items)} destinations for a .v{vec} load")
    writers = [c.write(item, t) for item in items]
    if space == "param":
        addr = c.ops[1]
        params = dict(c.prog.params)
        if not (isinstance(addr, Addr) and isinstance(addr.base, Sym) and addr.offset == 0
                and addr.base.name in params and vec == 1):
            c.fail("ld.param supports only [kernel_parameter]")
        name = addr.base.name
        conv = converter(storage_of(params[name]), t) or (lambda v: v)
        w = writers[0]
        return c.alu(lambda st, sel: w(st, sel, conv(st.params[name])))
    address, esize, dt = c.address(c.ops[1], space), TYPES[t][0], dtype_of(t)
    access = access_of(c.ins.base, c.mods)

    def load(st, sel):
        raw = st.load(space, address(st, sel), esize, vec, st.indices(sel), access)
        for i, w in enumerate(writers):
            w(st, sel, raw[:, i].view(dt))
    ex = c.alu(load)
    ex.strong_read = access.strong and space in ("global", "generic")
    return ex


@opcode("st")
def _st(c):
    c.check_mods({"global", "shared", "local", "shared::cta", "v2", "v4", "v8"})
    if len(c.ops) not in (2, 3):
        c.fail("expected address and value")
    space, t, vec = c.space(), c.type, _vector(c)
    if space == "param":
        c.fail("st.param is not supported")
    v = c.ops[1]
    items = v.items if isinstance(v, Vec) else (v,)
    if len(items) != vec:
        c.fail(f"{len(items)} values for a .v{vec} store")
    readers = [c.read(item, t) for item in items]
    address, esize = c.address(c.ops[0], space), TYPES[t][0]
    udt = _uint(esize)
    access = access_of(c.ins.base, c.mods)

    def store(st, sel):
        m = _count(st, sel)
        values = np.empty((m, vec), udt)
        for i, r in enumerate(readers):
            values[:, i] = np.asarray(r(st, sel)).view(udt)
        st.store(space, address(st, sel), esize, values, st.indices(sel), access=access)
    return c.alu(store)


@opcode("cvta")
def _cvta(c):
    c.need(2)
    to = "to" in c.mods
    space = c.pick(("global", "shared", "shared::cta", "local", "param"))
    if space is None or space == "local":
        c.fail("only cvta to/from .global, .shared and .param (a tensor map's address) is supported")
    t = c.type
    mask = (1 << 8 * TYPES[t][0]) - 1
    shift = 0 if space in ("global", "param") else (-SHARED_WINDOW if to else SHARED_WINDOW)
    src, dst = c.read(1, "u64"), c.write(0, t)
    delta, dt = np.uint64(shift & (2**64 - 1)), dtype_of(t)
    return c.alu(lambda st, sel: dst(st, sel, ((np.asarray(src(st, sel)) + delta) & np.uint64(mask)).astype(dt)))


# ---- integer and float arithmetic ------------------------------------------------------
def _float_kind(t):
    return t in ("f16", "bf16", "f16x2", "bf16x2")


def _any_float(t):
    """A float type: .f16/.f32/.f64, .bf16, or a packed pair of halves."""
    return TYPES[t][1] in ("f", "bf") or _float_kind(t)


# .f16 and .bf16 bits <-> floats holding their values (numpy's float16 arithmetic is slow, its
# conversions of float16 to and from float64 the fastest; NaN payloads survive both ways)
_HALF_VALUES = {
    "f16": (lambda h: h.view(np.float16).astype(np.float64), lambda v: v.astype(np.float16).view(np.uint16)),
    "bf16": (nm.bf16_bits_to_f32, lambda v: (v.view(np.uint32) >> 16).astype(np.uint16))}
_HALF_NAN = np.uint16(0x7FFF)      # the canonical NaN of .f16 and .bf16
# the canonical NaN as the value that holds each kind
_CANONICAL_NAN = {"f16": _HALF_VALUES["f16"][0](_HALF_NAN), "bf16": _HALF_VALUES["bf16"][0](_HALF_NAN),
                  "f32": np.uint32(0x7FFFFFFF).view(np.float32)}


def _flush_f16(h):
    """.f16 bits with subnormals flushed to sign-preserving zero (.ftz)."""
    return np.where((h & np.uint16(0x7C00)) == 0, h & np.uint16(0x8000), h)


def _half_lanes(c, t, fn, nargs, operands=None):
    """Compile fn (uint16 bit arrays -> uint16 bits) over the operands of an .f16/.bf16
    instruction (or `operands`), or over the low, then the high halves of .x2 operands (one pass
    over both runs slower: its arrays, twice the size, fall out of the cache)."""
    packed = t.endswith("x2")
    readers = [c.read(op, "b32" if packed else "b16") for op in operands or range(1, nargs + 1)]
    dst = c.write(0, "b32" if packed else "b16")

    def run(st, sel):
        args = [np.atleast_1d(np.asarray(r(st, sel))) for r in readers]
        if packed:
            lo = fn(*[(a & 0xFFFF).astype(np.uint16) for a in args]).astype(np.uint32)
            hi = fn(*[(a >> 16).astype(np.uint16) for a in args]).astype(np.uint32)
            dst(st, sel, lo | (hi << np.uint32(16)))
        else:
            dst(st, sel, fn(*args))
    return c.alu(run)


def _half(c, t, fn, nargs, operands=None):
    """f16/bf16 scalar or packed-pair arithmetic: decode to exact float64, compute and round
    once with fn(kind, mode, *values)."""
    kind = t.replace("x2", "")
    mode = c.pick(FLOAT_ROUND, "rn")
    flush = "ftz" in c.mods and kind == "f16"
    sat, relu = "sat" in c.mods, "relu" in c.mods

    def one(*halves):
        if flush:
            halves = [_flush_f16(h) for h in halves]
        vals = [nm.decode(h.view(np.float16) if kind == "f16" else h, kind) for h in halves]
        out = np.asarray(fn(kind, mode, *vals))
        if sat:
            v = nm.decode(out, kind)
            out = nm.narrow(np.where(np.isnan(v), 0.0, np.clip(v, 0.0, 1.0)), kind, "rn")
        if flush:
            out = nm.flush_subnormal(out)
        bits = out.view(np.uint16) if kind == "f16" else out.astype(np.uint16)
        if relu:        # negative results clamp to 0, a NaN result is the canonical NaN
            v = nm.decode(out, kind)
            bits = np.where(np.isnan(v), _HALF_NAN, np.where(v < 0, np.uint16(0), bits))
        return bits
    return _half_lanes(c, t, one, nargs, operands)


def _int_binary(c, fn):
    t = c.type
    a, b, dst = c.read(1, t), c.read(2, t), c.write(0, t)
    return c.alu(lambda st, sel: dst(st, sel, fn(a(st, sel), b(st, sel))))


def _float_binary(c, numpy_fn, exact_fn):
    """f32/f64 add/sub/mul: numpy's IEEE result for .rn, exact rounding for .rz/.rm/.rp."""
    t, mode = c.type, c.pick(FLOAT_ROUND, "rn")
    if mode != "rn" and t != "f32":
        c.fail(f".{mode} is supported for f32 only")
    a, b, dst, fin = c.read(1, t), c.read(2, t), c.write(0, t), _ftz_in(c, t)
    if mode == "rn":
        return c.alu(lambda st, sel: dst(st, sel, c.finish_float(
            np.asarray(numpy_fn(fin(a(st, sel)), fin(b(st, sel)))), t)))
    return c.alu(lambda st, sel: dst(st, sel, c.finish_float(
        exact_fn(np.asarray(fin(a(st, sel)), np.float64), np.asarray(fin(b(st, sel)), np.float64),
                 mode), t)))


def _arithmetic_mods(c, t, extra=()):
    """Check add/sub/mul/fma's modifiers: rounding, .ftz and .sat on the float types that have
    them (.ftz, .sat: .f32, .f16, .f16x2; neither on .f64 or .bf16), `extra` as the caller allows."""
    c.check_mods({*FLOAT_ROUND, "ftz", "sat", *extra})
    if not _any_float(t):
        if c.has("ftz") or c.pick(FLOAT_ROUND):
            c.fail("rounding modifiers and .ftz need a float type")
        return
    for flag in ("ftz", "sat"):
        if flag in c.mods and t not in ("f32", "f16", "f16x2"):
            c.fail(f".{flag} needs .f32, .f16 or .f16x2")


def _contracted(c, t, sub):
    """An add/sub that takes a mul's product unrounded (launch's contract, contraction.py): one
    fma of the factors the mul copied, the product negated for `sub z, p` and the other
    operand for `sub p, z`; the add's .ftz and .sat apply."""
    (x, y), position = c.prog.fused[c.ins.index]
    return _fused(c, t, "rn", (x, y, c.ops[3 - position]), negate=(sub and position == 2, sub and position == 1))


@opcode("add", "sub")
def _add(c):
    c.need(3)
    t, sub = c.type, c.ins.base == "sub"
    if c.has("cc") or "c" in c.mods:
        c.fail("carry arithmetic is not supported")
    _arithmetic_mods(c, t)
    if c.ins.index in c.prog.fused:
        return _contracted(c, t, sub)
    if _float_kind(t):
        return _half(c, t, lambda k, m, x, y: nm.add(x, -y if sub else y, k, m), 2)
    if TYPES[t][1] == "f":
        return _float_binary(c, np.subtract if sub else np.add,
                             lambda x, y, m: nm.add(x, -y if sub else y, "f32", m))
    if "sat" in c.mods:
        if t != "s32":
            c.fail(".sat needs .s32")
        sign = -1 if sub else 1
        return _int_binary(c, lambda x, y: np.clip(
            np.asarray(x, np.int64) + sign * np.asarray(y, np.int64), -2**31, 2**31 - 1).astype(np.int32))
    return _int_binary(c, np.subtract if sub else np.add)


def _mul_hi64(a, b, signed):
    """High 64 bits of the 128-bit product, from 32-bit halves."""
    ua, ub = np.asarray(a).view(np.uint64), np.asarray(b).view(np.uint64)
    m = np.uint64(0xFFFFFFFF)
    s32 = np.uint64(32)
    al, ah, bl, bh = ua & m, ua >> s32, ub & m, ub >> s32
    ll, lh, hl, hh = al * bl, al * bh, ah * bl, ah * bh
    mid = (ll >> s32) + (lh & m) + (hl & m)
    hi = hh + (lh >> s32) + (hl >> s32) + (mid >> s32)
    if signed:
        hi = hi - np.where(np.asarray(a) < 0, ub, 0).astype(np.uint64) \
                - np.where(np.asarray(b) < 0, ua, 0).astype(np.uint64)
        return hi.view(np.int64)
    return hi


def _int_product(c, t):
    """(function of a, b, result type) for mul/mad .lo/.hi/.wide."""
    size, kind = TYPES[t]
    part = c.pick(("lo", "hi", "wide"))
    if part is None:
        c.fail("integer mul/mad needs .lo, .hi or .wide")
    signed = kind == "s"
    wide_dt = np.int64 if signed else np.uint64
    if part == "lo":
        return (lambda a, b: a * b), t
    if part == "wide":
        if size == 8:
            c.fail(".wide on 64-bit operands is not supported")
        out_t = f"{'s' if signed else 'u'}{size * 16}"
        wdt = dtype_of(out_t)
        return (lambda a, b: a.astype(wdt) * np.asarray(b).astype(wdt)), out_t
    if size == 8:
        return (lambda a, b: _mul_hi64(a, b, signed)), t
    dt = dtype_of(t)
    return (lambda a, b: ((np.asarray(a).astype(wide_dt) * np.asarray(b).astype(wide_dt))
                          >> (8 * size)).astype(dt)), t


def _copying_factors(c, t, ex):
    """A mul whose product an add/sub takes unrounded (contraction.py): it first copies its
    factors, as it reads them, to the registers the fused add/sub reads."""
    kind = t if t in ("f32", "f64") else "b32" if t.endswith("x2") else "b16"
    copies = [(c.read(i + 1, kind), c.write(reg, kind)) for i, reg in enumerate(c.prog.factors[c.ins.index])]
    run = ex.run

    def copy_and_run(st, sel):
        for read, write in copies:
            write(st, sel, read(st, sel))
        run(st, sel)
    ex.run = copy_and_run
    return ex


@opcode("mul")
def _mul(c):
    if c.ins.index in c.prog.factors:
        return _copying_factors(c, c.type, _product(c))
    return _product(c)


def _product(c):
    c.need(3)
    t = c.type
    _arithmetic_mods(c, t, ("lo", "hi", "wide"))
    if _any_float(t) and c.pick(("lo", "hi", "wide")):
        c.fail(".lo, .hi and .wide need an integer type")
    if _float_kind(t):
        return _half(c, t, lambda k, m, x, y: nm.narrow(x * y, k, m), 2)
    if TYPES[t][1] == "f":
        return _float_binary(c, np.multiply, lambda x, y, m: nm.narrow(x * y, "f32", m))
    fn, out_t = _int_product(c, t)
    a, b, dst = c.read(1, t), c.read(2, t), c.write(0, out_t)
    return c.alu(lambda st, sel: dst(st, sel, fn(np.asarray(a(st, sel)), b(st, sel))))


def _fma64(a, b, c):
    """Correctly rounded f64 fma (.rn), element by element through exact rationals (slow, rare)."""
    out = np.empty(np.broadcast(a, b, c).shape, np.float64)
    for i, (x, y, z) in enumerate(np.broadcast(a, b, c)):
        if not (np.isfinite(x) and np.isfinite(y) and np.isfinite(z)):
            out.flat[i] = x * y + z
            continue
        exact = Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z))
        try:
            out.flat[i] = float(exact) if exact != 0 else (x * y + z)
        except OverflowError:       # rounds past the largest double: to nearest is an infinity
            out.flat[i] = np.inf if exact > 0 else -np.inf
    return out


def _fma(c):
    t = c.type
    if not _any_float(t):
        c.fail(f"fma needs a float type, not .{t}")
    _arithmetic_mods(c, t, ("relu",))     # not .oob (needs the tensor copies' OOB NaN)
    if c.pick(("sat", "relu")) == "relu" and not _float_kind(t):
        c.fail(".relu needs .f16, .f16x2, .bf16 or .bf16x2")
    mode = c.pick(FLOAT_ROUND)
    if mode is None and c.ins.base == "fma":
        c.fail("fma needs a rounding modifier")
    if t == "f64" and mode not in (None, "rn"):
        c.fail("only fma.rn.f64 is supported")
    return _fused(c, t, mode or "rn", (1, 2, 3))


def _fused(c, t, mode, operands, negate=(False, False)):
    """a * b + z of `operands` (positions or operands) rounded once in `mode`, the product's
    and z's signs flipped where `negate` says (fma, mad, and contracted add/sub)."""
    sign_p, sign_z = ((lambda v: -v) if flip else (lambda v: v) for flip in negate)
    if _float_kind(t):
        return _half(c, t, lambda k, m, x, y, z: nm.fma(sign_p(x), y, sign_z(z), k, m), 3, operands)
    a, b, z = (c.read(op, t) for op in operands)
    dst = c.write(0, t)
    if t == "f64":
        return c.alu(lambda st, sel: dst(st, sel, _fma64(sign_p(a(st, sel)), b(st, sel), sign_z(z(st, sel)))))
    fin = _ftz_in(c, t)
    return c.alu(lambda st, sel: dst(st, sel, c.finish_float(np.asarray(nm.fma(
        sign_p(fin(a(st, sel))), fin(b(st, sel)), sign_z(fin(z(st, sel))), "f32", mode)), t)))


@opcode("fma")
def _fma_op(c):
    c.need(4)
    return _fma(c)


@opcode("mad")
def _mad(c):
    c.need(4)
    t = c.type
    if TYPES[t][1] == "f" or _float_kind(t):
        return _fma(c)        # mad.rn.f32 is a fused multiply-add
    c.check_mods({"lo", "hi", "wide", "sat", "cc"})
    if "sat" in c.mods or "cc" in c.mods:
        c.fail("mad .sat/.cc is not supported")
    fn, out_t = _int_product(c, t)
    a, b, z, dst = c.read(1, t), c.read(2, t), c.read(3, out_t), c.write(0, out_t)
    return c.alu(lambda st, sel: dst(st, sel, fn(np.asarray(a(st, sel)), b(st, sel)) + z(st, sel)))


@opcode("mul24", "mad24")
def _mul24(c):
    t = c.type
    signed = TYPES[t][1] == "s"
    part = c.pick(("lo", "hi"))
    if part is None or t not in ("u32", "s32"):
        c.fail("mul24/mad24 need .lo or .hi and .u32/.s32")
    mad = c.ins.base == "mad24"
    c.need(4 if mad else 3)
    a, b, dst = c.read(1, t), c.read(2, t), c.write(0, t)
    z = c.read(3, t) if mad else (lambda st, sel: 0)

    def low24(x):
        x = np.asarray(x).astype(np.int64) & 0xFFFFFF
        return np.where(x >= 0x800000, x - 0x1000000, x) if signed else x

    def run(st, sel):
        p = low24(a(st, sel)) * low24(b(st, sel))
        p = (p >> 16) if part == "hi" else p
        dst(st, sel, (p.astype(np.uint64).astype(np.uint32)).view(dtype_of(t)) + z(st, sel))
    return c.alu(run)


@opcode("div", "rem")
def _div(c):
    c.need(3)
    t = c.type
    if TYPES[t][1] == "f":
        mode = c.pick(("rn", "full", "approx", "rz", "rm", "rp"))
        if mode in ("rz", "rm", "rp"):
            c.fail(f"div.{mode} is not supported")
        if t == "f32" and mode is None:
            c.fail("div.f32 needs .rn, .full or .approx")
        a, b, dst, fin = c.read(1, t), c.read(2, t), c.write(0, t), _ftz_in(c, t)
        if t == "f32" and mode in ("full", "approx"):
            return c.alu(lambda st, sel: dst(st, sel, c.finish_float(
                st.approx.divide(fin(a(st, sel)), fin(b(st, sel)), mode == "approx"), t)))
        return c.alu(lambda st, sel: dst(st, sel, c.finish_float(
            np.asarray(fin(a(st, sel)) / fin(b(st, sel))), t)))
    signed, rem = TYPES[t][1] == "s", c.ins.base == "rem"
    dt = dtype_of(t)

    def divide(x, y):
        x, y = np.broadcast_arrays(np.asarray(x), np.asarray(y))
        zero = y == 0
        ys = np.where(zero, 1, y).astype(dt)
        q = x // ys
        if signed:     # PTX truncates toward zero; numpy floors
            q = q + ((x % ys != 0) & ((x < 0) != (ys < 0))).astype(dt)
        if rem:
            return np.where(zero, x, x - q * ys).astype(dt)
        return np.where(zero, dt.type(-1) if signed else np.iinfo(dt).max, q).astype(dt)
    return _int_binary(c, divide)


def _float_minmax(is_max, nan, xorsign, canonical):
    """min/max of two float arrays of one dtype (ISA 9.7.3.11-12, 9.7.4.7-8): a NaN loses to a
    number, or with .NaN makes the result the canonical NaN; +0 > -0; with .xorsign.abs the
    magnitudes are compared and a number result takes the XOR of the input signs."""
    pick = np.fmax if is_max else np.fmin

    def fn(x, y):
        if xorsign:
            negative = np.signbit(x) ^ np.signbit(y)
            x, y = np.abs(x), np.abs(y)
        r = pick(x, y)
        # fmax/fmin return either of two equal values; equal values have equal bits but for
        # zeros, where AND-ing the bits gives max's +0 and OR-ing them min's -0 (rare: the
        # test of any tie is a fifth of the cost of fixing them all)
        tie = x == y
        if tie.any():
            u = _uint(r.dtype.itemsize)
            bits = (x.view(u) & y.view(u)) if is_max else (x.view(u) | y.view(u))
            r = np.where(tie, bits.view(r.dtype), r)
        if nan:
            r = np.where(np.isnan(x) | np.isnan(y), canonical, r)
        if xorsign:
            r = np.where(negative & ~np.isnan(r), -r, r)
        return r
    return fn


@opcode("min", "max")
def _minmax(c):
    c.need(3)
    c.check_mods({"ftz", "NaN", "xorsign", "abs", "relu"})
    t, is_max = c.type, c.ins.base == "max"
    kind = TYPES[t][1]
    if kind in ("u", "s"):
        if c.has("ftz", "NaN", "xorsign", "abs"):
            c.fail(".ftz, .NaN and .xorsign.abs need a float type")
        fn = np.maximum if is_max else np.minimum
        if "relu" in c.mods:        # negative results clamp to 0
            if t != "s32":
                c.fail(".relu needs .s32")
            return _int_binary(c, lambda x, y: np.maximum(fn(x, y), 0))
        return _int_binary(c, fn)
    if not _any_float(t):
        c.fail(f"{c.ins.base} needs an integer or float type, not .{t}")
    if "relu" in c.mods:
        c.fail(".relu needs .s32")
    xorsign = "xorsign" in c.mods
    if xorsign != ("abs" in c.mods):
        c.fail(".xorsign and .abs go together (the three-operand .abs form is not supported)")
    half = t.replace("x2", "")
    if t == "f64" and c.has("ftz", "NaN", "xorsign"):
        c.fail("min/max.f64 takes no .ftz, .NaN or .xorsign.abs")
    if "ftz" in c.mods and half == "bf16":
        c.fail(".ftz needs .f32, .f16 or .f16x2")
    fn = _float_minmax(is_max, "NaN" in c.mods, xorsign, _CANONICAL_NAN.get(half))
    if _float_kind(t):
        decode, encode = _HALF_VALUES[half]
        flush = _flush_f16 if "ftz" in c.mods else _as_is
        return _half_lanes(c, t, lambda a, b: encode(fn(decode(flush(a)), decode(flush(b)))), 2)
    fin = _ftz_in(c, t)     # results are inputs (or the canonical NaN): flushed already
    return _int_binary(c, lambda x, y: fn(fin(x), fin(y)))


@opcode("abs", "neg")
def _absneg(c):
    c.need(2)
    c.check_mods({"ftz"})
    t, is_abs = c.type, c.ins.base == "abs"
    size, kind = TYPES[t]
    if "ftz" in c.mods and t not in ("f32", "f16", "f16x2"):
        c.fail(".ftz needs .f32, .f16 or .f16x2")
    # sign-bit operations, NaNs included; .ftz flushes subnormal inputs to sign-preserving zero
    if _float_kind(t):
        flush, sign = (_flush_f16 if "ftz" in c.mods else _as_is), np.uint16(0x8000)
        return _half_lanes(c, t, lambda h: flush(h) & ~sign if is_abs else flush(h) ^ sign, 1)
    if kind == "f":
        udt, sign = _uint(size), _uint(size).type(1 << (8 * size - 1))
        a, dst, fin, dt = c.read(1, t), c.write(0, t), _ftz_in(c, t), dtype_of(t)

        def run(st, sel):
            bits = np.asarray(fin(a(st, sel))).view(udt)
            dst(st, sel, (bits & ~sign if is_abs else bits ^ sign).view(dt))
        return c.alu(run)
    a, dst = c.read(1, t), c.write(0, t)
    fn = np.abs if is_abs else np.negative
    return c.alu(lambda st, sel: dst(st, sel, fn(np.asarray(a(st, sel)))))


def _bitwise(c):
    """The type of a bitwise instruction: bits, integers or predicates (numpy has no bitwise
    operations on floats)."""
    if TYPES[c.type][1] in ("f", "bf"):
        c.fail(f"{c.ins.base} needs a .b, .u, .s or .pred type, not .{c.type}")
    return c.type


@opcode("and", "or", "xor")
def _logic(c):
    c.need(3)
    _bitwise(c)
    fn = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}[c.ins.base]
    return _int_binary(c, fn)


@opcode("not", "cnot")
def _not(c):
    c.need(2)
    t = _bitwise(c)
    a, dst = c.read(1, t), c.write(0, t)
    if c.ins.base == "cnot":
        return c.alu(lambda st, sel: dst(st, sel, (np.asarray(a(st, sel)) == 0).astype(dtype_of(t))))
    return c.alu(lambda st, sel: dst(st, sel, ~np.asarray(a(st, sel))))


@opcode("shl", "shr")
def _shift(c):
    c.need(3)
    t = c.type
    bits = 8 * TYPES[t][0]
    dt = dtype_of(t)
    a, b, dst = c.read(1, t), c.read(2, "u32"), c.write(0, t)
    left, arith = c.ins.base == "shl", TYPES[t][1] == "s"

    def run(st, sel):
        x, n = np.asarray(a(st, sel)), np.asarray(b(st, sel))
        k = np.minimum(n, bits - 1).astype(dt)
        if left:
            out = np.where(n >= bits, dt.type(0), x << k)
        elif arith:      # shift amounts past the width fill with the sign
            out = x >> k
        else:
            out = np.where(n >= bits, dt.type(0), x >> k)
        dst(st, sel, out.astype(dt))
    return c.alu(run)


def _low_mask(k):
    """(1 << k) - 1 as uint64 for k in 0..64."""
    k = np.asarray(k, np.uint64)
    return np.where(k >= 64, np.uint64(2**64 - 1),
                    (np.uint64(1) << np.minimum(k, np.uint64(63))) - np.uint64(1))


@opcode("bfe")
def _bfe(c):
    c.need(4)
    t = c.type
    width, signed = 8 * TYPES[t][0], TYPES[t][1] == "s"
    a, p, n, dst = c.read(1, t), c.read(2, "u32"), c.read(3, "u32"), c.write(0, t)
    dt = dtype_of(t)

    def run(st, sel):
        x = np.asarray(a(st, sel)).view(_uint(width // 8)).astype(np.uint64)
        pos = np.asarray(p(st, sel)).astype(np.uint64) & np.uint64(0xFF)
        length = np.asarray(n(st, sel)).astype(np.uint64) & np.uint64(0xFF)
        avail = np.minimum(length, np.where(pos >= width, 0, width - np.minimum(pos, width)).astype(np.uint64))
        field = (x >> np.minimum(pos, np.uint64(63))) & _low_mask(avail)
        field = np.where(pos >= 64, np.uint64(0), field)
        if signed:
            top = np.minimum(pos + length - np.uint64(1), np.uint64(width - 1))
            sbit = ((x >> np.minimum(top, np.uint64(63))) & np.uint64(1)).astype(bool)
            field = np.where(sbit, field | ~_low_mask(avail), field)
            field = np.where(length == 0, np.uint64(0), field)
        dst(st, sel, field.astype(_uint(width // 8)).view(dt))
    return c.alu(run)


@opcode("bfi")
def _bfi(c):
    c.need(5)
    t = c.type
    width = 8 * TYPES[t][0]
    udt = _uint(width // 8)
    a, b, p, n, dst = c.read(1, t), c.read(2, t), c.read(3, "u32"), c.read(4, "u32"), c.write(0, t)

    def run(st, sel):
        x = np.asarray(a(st, sel)).view(udt).astype(np.uint64)
        y = np.asarray(b(st, sel)).view(udt).astype(np.uint64)
        pos = np.asarray(p(st, sel)).astype(np.uint64) & np.uint64(0xFF)
        length = np.asarray(n(st, sel)).astype(np.uint64) & np.uint64(0xFF)
        avail = np.minimum(length, np.where(pos >= width, 0, width - np.minimum(pos, width)).astype(np.uint64))
        shift = np.minimum(pos, np.uint64(63))
        m = _low_mask(avail) << shift
        out = (y & ~m) | ((x << shift) & m)
        dst(st, sel, out.astype(udt).view(dtype_of(t)))
    return c.alu(run)


_NIBBLES = np.arange(0, 16, 4, dtype=np.uint32)     # selector nibble of result byte 0..3


@opcode("prmt")
def _prmt(c):
    c.need(4)
    if c.type != "b32" or len(c.mods) != 1:
        c.fail("only the default mode of prmt.b32 is supported")
    a, b, s, dst = c.read(1, "b32"), c.read(2, "b32"), c.read(3, "b32"), c.write(0, "b32")

    def pool(st, sel):
        """[threads, 8] bytes: 0..3 from a, 4..7 from b."""
        words = np.empty((_count(st, sel), 2), np.uint32)
        words[:, 0] = a(st, sel)
        words[:, 1] = b(st, sel)
        return words.view(np.uint8)

    def signs(picked):
        return (picked.view(np.int8) >> 7).view(np.uint8)   # each byte's sign bit, replicated

    if isinstance(c.ops[3], Imm):       # the usual case: the same bytes for every thread
        nibble = (np.uint32(c.ops[3].value) >> _NIBBLES) & np.uint32(0xF)
        index, replicate = nibble & np.uint32(7), np.flatnonzero(nibble >= 8)

        def run_constant(st, sel):
            picked = np.take(pool(st, sel), index, axis=1)
            if len(replicate):
                picked[:, replicate] = signs(picked[:, replicate])
            dst(st, sel, picked.view(np.uint32)[:, 0])
        return c.alu(run_constant)

    def run(st, sel):
        m = _count(st, sel)
        selector = np.broadcast_to(np.asarray(s(st, sel), np.uint32), (m,))
        nibble = (selector[:, None] >> _NIBBLES) & np.uint32(0xF)
        flat = (nibble & np.uint32(7)) + (np.arange(m, dtype=np.uint32) * np.uint32(8))[:, None]
        picked = np.take(pool(st, sel).reshape(-1), flat)
        dst(st, sel, np.where(nibble >= 8, signs(picked), picked).view(np.uint32)[:, 0])
    return c.alu(run)


@opcode("lop3")
def _lop3(c):
    c.need(5)
    if not isinstance(c.ops[4], Imm):
        c.fail("lop3 needs an immediate lookup table")
    lut = c.ops[4].value
    a, b, z, dst = c.read(1, "b32"), c.read(2, "b32"), c.read(3, "b32"), c.write(0, "b32")

    def run(st, sel):
        x, y, w = (np.asarray(r(st, sel)) for r in (a, b, z))
        out = np.uint32(0)
        for i in range(8):    # minterm i: a, b, c bits taken from 0xF0, 0xCC, 0xAA
            if lut >> i & 1:
                out = out | ((x if 0xF0 >> i & 1 else ~x) & (y if 0xCC >> i & 1 else ~y)
                             & (w if 0xAA >> i & 1 else ~w))
        dst(st, sel, np.asarray(out, np.uint32))
    return c.alu(run)


@opcode("dp4a")
def _dp4a(c):
    """dp4a.atype.btype d, a, b, c: c + the four byte products of a and b (each byte sign- or
    zero-extended by its type), wrapping to 32 bits; d and c are .s32 unless both are .u32."""
    c.need(4)
    if len(c.types) != 2 or any(t not in ("u32", "s32") for t in c.types):
        c.fail("dp4a needs .u32/.s32 operand types, e.g. dp4a.u32.s32")
    out_t = "u32" if c.types == ["u32", "u32"] else "s32"
    bytes_of = [np.int8 if t == "s32" else np.uint8 for t in c.types]
    a, b, z, dst = c.read(1, "b32"), c.read(2, "b32"), c.read(3, out_t), c.write(0, out_t)

    def run(st, sel):
        m = _count(st, sel)
        x, y = (np.broadcast_to(np.asarray(r(st, sel), np.uint32), (m,)).copy().view(kind).reshape(m, 4)
                for r, kind in zip((a, b), bytes_of))
        total = (x.astype(np.int64) * y).sum(axis=1) + np.asarray(z(st, sel)).astype(np.int64)
        dst(st, sel, total.astype(np.uint32).view(dtype_of(out_t)))
    return c.alu(run)


_REVERSED_BYTES = np.array([int(f"{i:08b}"[::-1], 2) for i in range(256)], np.uint8)


@opcode("popc", "clz", "brev")
def _bits(c):
    c.need(2)
    t = c.type
    size = TYPES[t][0]
    udt = _uint(size)
    a = c.read(1, t)
    if c.ins.base == "brev":
        dst = c.write(0, t)

        def brev(st, sel):
            x = np.atleast_1d(np.asarray(a(st, sel)).view(udt))
            rev = _REVERSED_BYTES[x.view(np.uint8).reshape(-1, size)][:, ::-1]
            dst(st, sel, np.ascontiguousarray(rev).view(udt).ravel())
        return c.alu(brev)
    dst = c.write(0, "u32")
    if c.ins.base == "popc":
        return c.alu(lambda st, sel: dst(st, sel, np.bitwise_count(np.asarray(a(st, sel)).view(udt)).astype(np.uint32)))

    def clz(st, sel):
        x = np.asarray(a(st, sel)).view(udt).astype(np.uint64)
        hi = (x >> np.uint64(32)).astype(np.float64)
        lo = (x & np.uint64(0xFFFFFFFF)).astype(np.float64)
        top = np.where(hi > 0, np.frexp(hi)[1] + 32, np.frexp(lo)[1])   # bit length
        dst(st, sel, (8 * size - top).astype(np.uint32))
    return c.alu(clz)


_COMPARE = {
    "eq": lambda a, b, u: a == b, "ne": lambda a, b, u: (a != b) & ~u,
    "lt": lambda a, b, u: a < b, "le": lambda a, b, u: a <= b,
    "gt": lambda a, b, u: a > b, "ge": lambda a, b, u: a >= b,
    "lo": lambda a, b, u: a < b, "ls": lambda a, b, u: a <= b,
    "hi": lambda a, b, u: a > b, "hs": lambda a, b, u: a >= b,
    "equ": lambda a, b, u: (a == b) | u, "neu": lambda a, b, u: (a != b) | u,
    "ltu": lambda a, b, u: ~(a >= b), "leu": lambda a, b, u: ~(a > b),
    "gtu": lambda a, b, u: ~(a <= b), "geu": lambda a, b, u: ~(a < b),
    "num": lambda a, b, u: ~u, "nan": lambda a, b, u: u,
}


@opcode("setp")
def _setp(c):
    t = c.type
    cmp = c.pick(tuple(_COMPARE))
    combine = c.pick(("and", "or", "xor"))
    if cmp is None:
        c.fail("setp needs a comparison")
    c.need(4 if combine else 3)
    kind = TYPES[t][1]
    if cmp in ("lo", "ls", "hi", "hs") and kind == "s":
        t = "u" + t[1:]
    if t.endswith("x2"):
        c.fail("packed setp is not supported")
    if t == "bf16":
        prep = lambda x: nm.decode(x, "bf16")
    elif t == "f16" and "ftz" in c.mods:    # setp.ftz.f16 flushes subnormal inputs (ISA 9.7.6.2)
        prep = lambda x: _flush_f16(np.asarray(x).view(np.uint16)).view(np.float16)
    else:
        prep = _ftz_in(c, t)
    ra, rb = c.read(1, t), c.read(2, t)
    is_float = kind in ("f", "bf")
    if not is_float and cmp not in ("eq", "ne", "lt", "le", "gt", "ge", "lo", "ls", "hi", "hs"):
        c.fail(f".{cmp} needs a float type")
    fn = _COMPARE[cmp]
    d = c.ops[0]
    first, second = (d.first, d.second) if isinstance(d, Pair) else (d, None)
    w1, w2 = c.write(first, "pred"), (c.write(second, "pred") if second else None)
    pred = c.read(3, "pred") if combine else None
    join = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}.get(combine)

    def run(st, sel):
        x, y = np.asarray(prep(ra(st, sel))), np.asarray(prep(rb(st, sel)))
        unordered = (np.isnan(x) | np.isnan(y)) if is_float else np.False_  # ~False is -1, ~np.False_ is True
        r = np.broadcast_to(fn(x, y, unordered), (_count(st, sel),))
        if join is None:
            w1(st, sel, r)
            if w2:
                w2(st, sel, ~r)
        else:
            p = pred(st, sel)
            w1(st, sel, join(r, p))
            if w2:
                w2(st, sel, join(~r, p))
    return c.alu(run)


@opcode("selp")
def _selp(c):
    c.need(4)
    t = c.type
    a, b, p, dst = c.read(1, t), c.read(2, t), c.read(3, "pred"), c.write(0, t)
    return c.alu(lambda st, sel: dst(st, sel, np.where(p(st, sel), a(st, sel), b(st, sel)).astype(dtype_of(t))))


# ---- transcendental approximations and square roots ------------------------------------
@opcode(*EXACT)
def _unary(c):
    c.need(2)
    t, name = c.type, c.ins.base
    if t not in ("f32", "f64"):
        c.fail(f"{name} is supported for .f32/.f64 only")
    mode = c.pick(("approx", "rn", "full", "rz", "rm", "rp"))
    if mode in ("rz", "rm", "rp"):
        c.fail(f"{name}.{mode} is not supported")
    if mode is None:
        c.fail(f"{name} needs .approx or .rn")
    fin, fn, dt = _ftz_in(c, t), EXACT[name], dtype_of(t)
    a, dst = c.read(1, t), c.write(0, t)
    if name in ("rcp", "sqrt") and mode != "approx":     # IEEE-exact in the operand's own precision
        fn = (lambda x: dt.type(1) / x) if name == "rcp" else np.sqrt
        return c.alu(lambda st, sel: dst(st, sel, c.finish_float(np.asarray(fn(fin(a(st, sel)))), t)))
    if t == "f32":
        return c.alu(lambda st, sel: dst(st, sel, c.finish_float(st.approx.unary(name, fin(a(st, sel))), t)))
    if mode != "approx" or name not in ("rcp", "rsqrt"):
        c.fail(f"{name}.{mode}.f64 is not a PTX instruction")
    if "ftz" in c.mods:      # rcp/rsqrt.approx.ftz.f64: of the upper word only
        return c.alu(lambda st, sel: dst(st, sel, st.approx.upper_word(name, a(st, sel))))
    if name == "rcp":
        c.fail("rcp.approx.f64 needs .ftz")
    # rsqrt.approx.f64: emulated in software, no error bound given (ISA 9.7.3.16): exact, rounded once
    return c.alu(lambda st, sel: dst(st, sel, np.asarray(fn(np.asarray(a(st, sel), np.float64)))))


# ---- conversion ------------------------------------------------------------------------
@opcode("cvt")
def _cvt(c):
    c.check_mods({*FLOAT_ROUND, *INT_ROUND, "ftz", "sat", "relu"})    # not .satfinite, .pack, .rna, .rs
    types = c.types
    mode = c.pick(FLOAT_ROUND + INT_ROUND)
    if len(types) != 2:
        c.fail("cvt needs a destination and a source type")
    dt_, at = types
    if dt_ in ("f16x2", "bf16x2"):
        return _cvt_pack(c, dt_, at, mode)
    c.need(2)
    dkind, akind = TYPES[dt_][1], TYPES[at][1]
    a, dst = c.read(1, at), c.write(0, dt_)
    sat, ftz, relu = "sat" in c.mods, "ftz" in c.mods, "relu" in c.mods
    d_float, a_float = dkind in ("f", "bf"), akind in ("f", "bf")
    ddt = dtype_of(dt_)

    def source(st, sel):
        x = np.atleast_1d(np.asarray(a(st, sel)))
        if ftz and at == "f32":
            x = nm.flush_subnormal(x)
        return nm.decode(x, "bf16" if akind == "bf" else "f") if a_float else x

    if a_float and not d_float:
        if mode not in INT_ROUND:
            c.fail("float-to-integer cvt needs .rni, .rzi, .rmi or .rpi")
        # NaN -> 0 unless the source is .f64 or the destination 64-bit: then 1 << (bits - 1)
        # (MININT, or MAXINT / 2 + 1 unsigned; ISA 9.7.9.21)
        size = ddt.itemsize
        nan = np.array(0 if at != "f64" and size != 8 else 1 << (8 * size - 1), _uint(size)).view(ddt)[()]
        return c.alu(lambda st, sel: dst(st, sel, nm.float_to_int(source(st, sel), ddt, mode, nan)))
    if relu and dt_ not in ("f16", "bf16"):
        c.fail(".relu needs a .f16, .f16x2, .bf16 or .bf16x2 destination")
    if d_float:
        if mode in INT_ROUND and not a_float:
            c.fail(f".{mode} needs a float source")
        kind = dt_ if dt_ in ("f16", "bf16", "f32", "f64") else None

        def to_float(st, sel):
            x = source(st, sel)
            if not a_float:
                y = nm.int_to_float(x, kind, mode or "rn")
            elif mode in INT_ROUND:
                y = nm.narrow(nm.round_integral(x, mode), kind, "rn")
            else:
                y = nm.narrow(x, kind, mode or "rn")
            if sat or relu:
                v = nm.decode(y, "bf16" if kind == "bf16" else "f")
                lo_hi = (0.0, 1.0) if sat else (0.0, np.inf)
                clamped = np.where(np.isnan(v), 0.0 if sat else v, np.clip(v, *lo_hi))
                y = nm.narrow(clamped, kind, "rn")
                if relu:    # a NaN result is the canonical NaN (ISA, cvt's .relu)
                    y = np.where(np.isnan(v), _HALF_NAN, np.asarray(y).view(np.uint16)).view(y.dtype)
            if ftz and kind == "f32":
                y = nm.flush_subnormal(y)
            dst(st, sel, y)
        return c.alu(to_float)
    # integer -> integer: wrap, or clamp to the destination range with .sat
    src_dt = dtype_of(at)
    if not sat:
        return c.alu(lambda st, sel: dst(st, sel, np.asarray(a(st, sel)).astype(ddt)))
    lo = src_dt.type(max(np.iinfo(ddt).min, np.iinfo(src_dt).min))
    hi = src_dt.type(min(np.iinfo(ddt).max, np.iinfo(src_dt).max))
    return c.alu(lambda st, sel: dst(st, sel, np.clip(np.asarray(a(st, sel)), lo, hi).astype(ddt)))


def _cvt_pack(c, dt_, at, mode):
    """cvt.rn.f16x2.f32 d, a, b: a goes to the upper half, b to the lower half (.rn or .rz)."""
    c.need(3)
    if at != "f32" or mode not in ("rn", "rz"):
        c.fail(f"only cvt.rn.{dt_}.f32 and cvt.rz.{dt_}.f32 are supported")
    kind = dt_[:-2]
    a, b, dst = c.read(1, "f32"), c.read(2, "f32"), c.write(0, "b32")
    relu = "relu" in c.mods

    def half(x):
        x = np.atleast_1d(np.asarray(x, np.float64))
        if relu:
            x = np.where(np.isnan(x), x, np.maximum(x, 0.0))
        y = nm.narrow(x, kind, mode)
        bits = y.view(np.uint16) if kind == "f16" else y
        if relu:    # a NaN result is the canonical NaN (ISA, cvt's .relu)
            bits = np.where(np.isnan(x), _HALF_NAN, bits)
        return bits.astype(np.uint32)

    return c.alu(lambda st, sel: dst(st, sel, (half(a(st, sel)) << np.uint32(16)) | half(b(st, sel))))


# ---- control flow and synchronisation --------------------------------------------------
def _uniform_branch(st, taken, passed):
    """bra.uni's promise (ISA 9.7.8.1: the guard is the same for every active thread of a warp):
    a warp whose threads here go both ways is a finding (hardware may send it all one way)."""
    split = np.intersect1d(st.warp[taken], st.warp[passed])
    if len(split):
        thread = taken[int(np.flatnonzero(st.warp[taken] == split[0])[0])]
        raise Finding("bra.uni whose guard differs between threads of a warp: a divergent branch marked "
                      "uniform (drop .uni, or make the guard warp-uniform, e.g. by vote.sync)", thread)


@opcode("bra")
def _bra(c):
    """A branch; `run` (bra.uni only) checks the taken and passing threads share no warp."""
    return Exec(c.ins, "bra", run=_uniform_branch if "uni" in c.mods else None, target=c.ins.target)


@opcode("ret", "exit")
def _exit(c):
    return Exec(c.ins, "exit")


@opcode("trap")
def _trap(c):
    def run(st, sel):
        raise Finding("trap executed", st.indices(sel)[0], sanitizer=False)
    return c.alu(run)


@opcode("bar", "barrier")
def _bar(c):
    if "warp" in c.mods:
        c.need(1)
        mask = c.read(0, "b32")

        def warp_sync(st, sel):
            threads = st.indices(sel)
            members = np.asarray(mask(st, sel)).astype(np.uint64)
            warp_members(st, threads, members, "bar.warp.sync")
            if st.races is not None:
                st.races.warp_barrier(threads)
            st.ordering.warp_barrier(threads, members)
        return c.alu(warp_sync)
    arrive = c.has("arrive")
    if c.has("red") or not (arrive or c.has("sync")):
        c.fail("only bar.sync / barrier.sync, bar.arrive / barrier.arrive and bar.warp.sync are supported")
    if len(c.ops) not in (1, 2) or (arrive and len(c.ops) != 2):
        c.fail("expected a barrier id and a thread count (optional for sync)")
    barrier_id = c.read(0, "u32")
    count = c.read(1, "u32") if len(c.ops) == 2 else None

    def operands(st, sel):
        return barrier_id(st, sel), (count(st, sel) if count else None)
    # target: (whether the threads wait, whether the form is aligned: bar.*, barrier.*.aligned)
    return Exec(c.ins, "bar", run=operands, target=(not arrive, c.ins.base == "bar" or c.has("aligned")))


@opcode("griddepcontrol")
def _griddepcontrol(c):
    """Programmatic dependent launch. The interpreter runs launches one after another, so the
    previous kernel of the stream has always completed: .wait has nothing to wait for and
    .launch_dependents starts nothing early. What a kernel may do before its wait is checked by
    the sanitizer (WaveState.watch_dependent_launch)."""
    if c.ops:
        c.fail("griddepcontrol takes no operands")
    if c.mods == ["wait"]:
        def passed(st, sel):
            if st.before_wait is not None:
                st.before_wait[sel] = False
        return c.alu(passed)
    if c.mods == ["launch_dependents"]:
        return c.alu(lambda st, sel: None)
    c.fail("expected griddepcontrol.wait or griddepcontrol.launch_dependents")


@opcode("prefetch", "prefetchu", "nanosleep")
def _hint(c):
    """Performance hints with no effect on results: a prefetch into a cache level, a sleep (the
    scheduler picks who runs). A prefetch does not fault on hardware whatever its address, but one
    outside every array is a finding here, as a load there would be: no kernel of ours asks the
    memory system for bytes it was not given. It reads no value, so a programmatic dependent
    launch may issue it before griddepcontrol.wait, for any array."""
    c.need(1)
    if c.ins.base == "nanosleep":
        c.read(0, "u32")
        return c.alu(lambda st, sel: None)
    if not isinstance(c.ops[0], Addr):
        c.fail("expected [address]")
    space = c.space()
    address = c.address(c.ops[0], space)

    def bounds(st, sel):
        st.segments(space, address(st, sel), 1, st.indices(sel), hint=True)
    return c.alu(bounds)


@opcode("membar", "fence")
def _fence(c):
    effect = fence_of(c.ins.base, c.mods)
    if effect is None:       # CTA scope (an event inside the CTA only) or a proxy fence
        if any(m.startswith(("proxy", "mbarrier_init")) for m in c.mods):
            return c.alu(lambda st, sel: None)
        return c.alu(lambda st, sel: st.ordering.cta_event(st.indices(sel)))
    acquire, release = effect
    return c.alu(lambda st, sel: st.ordering.fence(st.indices(sel), acquire, release))


# ---- atomics ---------------------------------------------------------------------------
_ATOMIC = {
    "add": lambda old, b, c: old + b, "min": lambda old, b, c: np.minimum(old, b),
    "max": lambda old, b, c: np.maximum(old, b), "exch": lambda old, b, c: b,
    "cas": lambda old, b, c: np.where(old == b, c, old),
    "inc": lambda old, b, c: np.where(old >= b, 0, old + 1).astype(old.dtype),
    "dec": lambda old, b, c: np.where((old == 0) | (old > b), b, old - 1).astype(old.dtype),
    "and": lambda old, b, c: old & b, "or": lambda old, b, c: old | b,
    "xor": lambda old, b, c: old ^ b,
    # not a PTX modifier: the add of atom/red.add.f32 on global memory (_flushed_add)
    "add.ftz": lambda old, b, c: nm.flush_subnormal(nm.flush_subnormal(old) + b),
}
_ACCUMULATE = {"add": np.add, "min": np.minimum, "max": np.maximum, "and": np.bitwise_and,
               "or": np.bitwise_or, "xor": np.bitwise_xor}


def serialize(mem, elems, op, b, c, order):
    """Apply an atomic op from many threads to mem[elems], one thread after another in
    `order` (positions into elems, grouped by element); returns the old value each saw."""
    fn = _ATOMIC[op]
    e, bv, cv = elems[order], b[order], c[order]
    start = np.r_[True, e[1:] != e[:-1]]
    old = np.empty_like(bv)
    if start.all():
        old[:] = mem[e]
        mem[e] = fn(old, bv, cv)
    else:
        firsts = np.flatnonzero(start)
        lengths = np.diff(np.r_[firsts, len(e)])
        if op == "add" and mem.dtype.kind in "ui":     # wrapping prefix sums are exact
            run = np.cumsum(start) - 1
            incl = np.cumsum(bv, dtype=mem.dtype)
            excl = incl - bv
            before = excl - excl[firsts][run]
            base = mem[e[firsts]]
            old[:] = base[run] + before
            last = firsts + lengths - 1
            mem[e[firsts]] = base + (incl[last] - excl[firsts])
        elif len(firsts) <= lengths.max():           # few hot addresses: one pass per address
            for f, n in zip(firsts, lengths):
                k = e[f]
                seq = np.r_[mem[k:k + 1], bv[f:f + n]]
                if op in _ACCUMULATE:
                    acc = _ACCUMULATE[op].accumulate(seq, dtype=mem.dtype)
                elif op == "exch":
                    acc = seq
                else:
                    acc = seq.copy()
                    for i in range(n):
                        acc[i + 1] = fn(acc[i:i + 1], bv[f + i:f + i + 1], cv[f + i:f + i + 1])[0]
                old[f:f + n] = acc[:-1]
                mem[k] = acc[-1]
        else:                                          # many addresses: one pass per rank
            for r in range(int(lengths.max())):
                p = firsts[lengths > r] + r
                old[p] = mem[e[p]]
                mem[e[p]] = fn(old[p], bv[p], cv[p])
    out = np.empty_like(old)
    out[order] = old
    return out


def _flushed_add(mem, elems, b, c, order):
    """serialize's add for atom/red.add.f32 on global memory, b flushed already: subnormal
    inputs (b, the values in memory) and results flush to sign-preserving zero (ISA 9.7.13.5;
    shared memory keeps them). Each partial sum is an old value or a final one: unless one of
    them is subnormal, the plain sums are the flushed ones, and only then are the additions
    redone, flushing each."""
    saved = mem[elems]
    old = serialize(mem, elems, "add", b, c, order)
    if nm.is_subnormal(old).any() or nm.is_subnormal(mem[elems]).any():
        mem[elems] = saved
        old = serialize(mem, elems, "add.ftz", b, c, order)
    return old


@opcode("atom", "red")
def _atom(c):
    c.check_mods({"global", "shared", "shared::cta", *_ATOMIC})
    op = c.pick(tuple(_ATOMIC))
    if op is None:
        c.fail("unsupported atomic operation")
    t = c.type
    if t not in ("b32", "b64", "u32", "s32", "u64", "s64", "f32", "f64"):
        c.fail(f"atomics on .{t} are not supported")
    if op in ("inc", "dec") and t != "u32":
        c.fail(f"atom.{op} needs .u32")
    red = c.ins.base == "red"
    ops = c.ops if not red else [Sink()] + c.ops
    nargs = 4 if op == "cas" else 3
    if len(ops) not in (nargs, nargs + 1):      # optional trailing cache policy
        c.fail(f"expected {nargs} operands")
    space = c.space()
    if space not in ("global", "shared", "generic"):
        c.fail(f"atomics on .{space} are not supported")
    address = c.address(ops[1], space)
    b = c.read(ops[2], t)
    z = c.read(ops[3], t) if op == "cas" else (lambda st, sel: 0)
    dst = c.write(ops[0], t)
    dt, size = dtype_of(t), TYPES[t][0]
    access = access_of(c.ins.base, c.mods)
    float_add = op == "add" and t in ("f32", "f64")
    flushing = op == "add" and t == "f32"       # on global memory

    def run(st, sel):
        threads = st.indices(sel)
        m = len(threads)
        bv = np.broadcast_to(np.asarray(b(st, sel), dt), (m,)).copy()
        cv = np.broadcast_to(np.asarray(z(st, sel), dt), (m,)).copy()
        old = np.empty(m, dt)
        for region, off, pos in st.segments(space, address(st, sel), size, threads):
            mem = st.typed(region, size).view(dt)
            who = threads[pos]
            # contention lands in a seeded order of the threads, not thread order
            order = np.lexsort((st.rank[who], off))
            if region == "shared":
                if st.races is not None:
                    if st.async_state is not None:     # bytes an async copy writes, an mbarrier object
                        st.async_state.ordering.shared_write(off, size, who)
                    st.races.atomic(off, size, who)
            else:
                st.ordering.atomic(region, off, size, who, access, order)
            elems, ftz = off // size, flushing and region != "shared"
            here = nm.flush_subnormal(bv[pos]) if ftz else bv[pos]
            if float_add and st.float_atomics is not None:
                st.float_atomics.add(region, elems, mem, here, who)
            if ftz:
                old[pos] = _flushed_add(mem, elems, here, cv[pos], order)
            else:
                old[pos] = serialize(mem, elems, op, here, cv[pos], order)
            if op == "cas" and region != "shared" and (old[pos] != bv[pos]).all():
                st.ordering.failed_cas(region, off, old[pos])
        dst(st, sel, old)
    ex = c.alu(run)
    # A compare-and-swap that keeps failing (a lock's spin) is a strong read that changes nothing:
    # the scheduler parks it as it parks a spinning load (Ordering.failed_cas).
    ex.strong_read = op == "cas" and access.strong and space in ("global", "generic")
    return ex


# ---- warp-level collectives ------------------------------------------------------------
@opcode("shfl")
def _shfl(c):
    mode = c.pick(("up", "down", "bfly", "idx"))
    if "sync" not in c.mods or mode is None or c.type != "b32":
        c.fail("only shfl.sync.{up,down,bfly,idx}.b32 is supported")
    c.need(5)
    d = c.ops[0]
    first, second = (d.first, d.second) if isinstance(d, Pair) else (d, None)
    dst, pdst = c.write(first, "b32"), (c.write(second, "pred") if second else None)
    a, b, cc, mask = (c.read(i, "b32") for i in (1, 2, 3, 4))

    def run(st, sel):
        threads = st.indices(sel)
        members = np.asarray(mask(st, sel)).astype(np.uint64)
        executing = warp_members(st, threads, members, f"shfl.sync.{mode}")
        lane = st.lane[threads]
        bval = np.asarray(b(st, sel)).astype(np.int64) & 31
        cval = np.asarray(cc(st, sel)).astype(np.int64)
        clamp, segmask = cval & 31, (cval >> 8) & 31
        max_lane = (lane & segmask) | (clamp & ~segmask)
        min_lane = lane & segmask
        if mode == "up":
            j = lane - bval
            ok = j >= max_lane
        elif mode == "down":
            j, ok = lane + bval, None
        elif mode == "bfly":
            j, ok = lane ^ bval, None
        else:
            j, ok = min_lane | (bval & ~segmask), None
        if ok is None:
            ok = j <= max_lane
        if st.sanitize:
            _shfl_sources(threads, lane, j, ok, executing, members, mode)
        exists = (st.warp_lanes[st.warp[threads]].astype(np.int64) >> np.clip(j, 0, 31)) & 1
        j = np.where(ok & (exists == 1), j, lane)
        values = np.zeros(st.n, np.uint32)
        values[threads] = a(st, sel)
        dst(st, sel, values[threads - lane + j])
        if pdst:
            pdst(st, sel, np.broadcast_to(ok, lane.shape))
    return c.alu(run)


def _shfl_sources(threads, lane, j, ok, executing, members, mode):
    """A lane in range must read a lane that executes this shfl and is in the member mask:
    the value of any other lane is undefined on the GPU."""
    src = np.uint64(1) << np.clip(j, 0, 31).astype(np.uint64)
    inactive = ok & ((np.asarray(executing, np.uint64) & src) == 0)
    outside = ok & ((np.broadcast_to(members, lane.shape) & src) == 0)
    bad = inactive | outside
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        why = "is not in the member mask" if outside[i] else \
            "does not execute this shfl (inactive, exited or past the CTA)"
        raise Finding(f"shfl.sync.{mode}: lane {int(lane[i])} reads lane {int(j[i])}, which {why}: "
                      "the value is undefined", threads[i])


def _ballot(st, threads, pred):
    bits = np.bincount(st.warp[threads], weights=np.where(pred, np.ldexp(1.0, st.lane[threads]), 0.0),
                       minlength=st.warp_lanes.size)
    return bits.astype(np.uint64)[st.warp[threads]]


@opcode("vote")
def _vote(c):
    mode = c.pick(("all", "any", "uni", "ballot"))
    if "sync" not in c.mods or mode is None:
        c.fail("only vote.sync.{all,any,uni,ballot} is supported")
    c.need(3)
    p, mask = c.read(1, "pred"), c.read(2, "b32")
    dst = c.write(0, "b32" if mode == "ballot" else "pred")

    def run(st, sel):
        threads = st.indices(sel)
        m = np.asarray(mask(st, sel)).astype(np.uint64)
        warp_members(st, threads, m, f"vote.sync.{mode}")
        pred = np.broadcast_to(p(st, sel), threads.shape)
        ballot = _ballot(st, threads, pred) & m
        members = m & st.warp_lanes[st.warp[threads]]
        if mode == "ballot":
            dst(st, sel, ballot.astype(np.uint32))
        elif mode == "all":
            dst(st, sel, ballot == members)
        elif mode == "any":
            dst(st, sel, ballot != 0)
        else:
            dst(st, sel, (ballot == members) | (ballot == 0))
    return c.alu(run)


@opcode("activemask")
def _activemask(c):
    c.need(1)
    dst = c.write(0, "b32")

    def run(st, sel):
        threads = st.indices(sel)
        dst(st, sel, _ballot(st, threads, np.ones(threads.shape, bool)).astype(np.uint32))
    return c.alu(run)


@opcode("redux")
def _redux(c):
    op = c.pick(("add", "min", "max", "and", "or", "xor"))
    t = c.type
    if "sync" not in c.mods or op is None or t not in ("u32", "s32", "b32"):
        c.fail("only redux.sync.{add,min,max,and,or,xor} on 32-bit integers is supported")
    c.need(3)
    a, mask, dst = c.read(1, t), c.read(2, "b32"), c.write(0, t)
    dt = dtype_of(t)
    ufunc = {"add": np.add, "min": np.minimum, "max": np.maximum, "and": np.bitwise_and,
             "or": np.bitwise_or, "xor": np.bitwise_xor}[op]
    start = {"add": 0, "min": np.iinfo(dt).max, "max": np.iinfo(dt).min, "and": np.iinfo(dt).max,
             "or": 0, "xor": 0}[op]

    def run(st, sel):
        threads = st.indices(sel)
        warp_members(st, threads, np.asarray(mask(st, sel)).astype(np.uint64), f"redux.sync.{op}")
        acc = np.full(st.warp_lanes.size, start, dt if op != "add" else np.int64)
        values = np.broadcast_to(np.asarray(a(st, sel)), threads.shape).astype(acc.dtype)
        ufunc.at(acc, st.warp[threads], values)
        dst(st, sel, acc[st.warp[threads]].astype(np.int64).astype(dt) if op == "add" else acc[st.warp[threads]])
    return c.alu(run)


# ---- asynchronous copies (data moves at issue; the sanitizer tracks the groups) --------
def _cp_group(c, op):
    """commit_group / wait_group N / wait_all (= commit_group + wait_group 0)."""
    newest = 0
    if op == "wait_group":
        c.need(1)
        if not isinstance(c.ops[0], Imm):
            c.fail("cp.async.wait_group needs an immediate group count")
        newest = c.ops[0].value
    else:
        c.need(0)

    def run(st, sel):
        if st.races is None:
            return
        threads = st.indices(sel)
        if op != "wait_group":
            st.races.commit(threads)
        if op != "commit_group":
            st.races.wait(threads, newest)
    return c.alu(run)


@opcode("cp")
def _cp(c):
    rest = c.mods[1:] if c.mods and c.mods[0] == "async" else None
    if rest is None:
        c.fail("only cp.async is supported")
    if rest and rest[0] in ("commit_group", "wait_group", "wait_all"):
        return _cp_group(c, rest[0])
    if "bulk" in rest or "ca" not in rest and "cg" not in rest:
        c.fail("only cp.async.{ca,cg}.shared.global is supported")
    if len(c.ops) < 3 or not isinstance(c.ops[2], Imm) or c.ops[2].value not in (4, 8, 16):
        c.fail("cp.async needs a copy size of 4, 8 or 16")
    size, line = c.ops[2].value, c.ins.line
    dst_addr, src_addr = c.address(c.ops[0], "shared"), c.address(c.ops[1], "global")
    extra = c.ops[3] if len(c.ops) > 3 else None
    src_size = ignore_src = None
    if isinstance(extra, (Reg, Neg)) and (isinstance(extra, Neg) or c.reg_type(extra) == "pred"):
        ignore_src = c.read(extra, "pred")
    elif extra is not None:
        src_size = c.read(extra, "u32")

    def run(st, sel):
        threads = st.indices(sel)
        m = len(threads)
        n = np.full(m, size, np.int64)
        if src_size is not None:
            n = np.minimum(np.broadcast_to(np.asarray(src_size(st, sel)).astype(np.int64), (m,)), size)
        if ignore_src is not None:
            n = np.where(ignore_src(st, sel), 0, n)
        src = src_addr(st, sel)
        data = np.zeros((m, size), np.uint8)
        whole = n == size
        if whole.any():
            pos = np.flatnonzero(whole)
            data[pos] = st.load("global", src[pos], 1, size, threads[pos])
        part = (n > 0) & ~whole
        if part.any():      # a partial copy reads src-size bytes and zero-fills the rest
            pos = np.flatnonzero(part)
            misaligned = src[pos] % size != 0
            if misaligned.any():
                i = pos[np.flatnonzero(misaligned)[0]]
                raise Finding(f"misaligned cp.async source {int(src[i]):#x}", threads[i])
            rows, cols = np.nonzero(np.arange(size) < n[pos][:, None])
            data[pos[rows], cols] = st.load("global", src[pos][rows] + cols, 1, 1, threads[pos][rows])[:, 0]
        st.store("shared", dst_addr(st, sel), 1, data, threads, copy_line=line)
    return c.alu(run)


# ---- tensor cores ----------------------------------------------------------------------
def _fragment_maps():
    """Element coordinates of the m16n8k16 fragments, per lane and element index, as the
    PTX ISA lays them out: g = lane / 4 (group), t = lane % 4 (thread in group)."""
    lane = np.arange(32)[:, None]
    g, t = lane // 4, lane % 4
    i8, i4 = np.arange(8)[None, :], np.arange(4)[None, :]
    a_row = g + 8 * ((i8 // 2) % 2)
    a_col = 2 * t + (i8 % 2) + 8 * (i8 // 4)
    b_row = 2 * t + (i4 % 2) + 8 * (i4 // 2)           # k
    b_col = np.broadcast_to(g, (32, 4))                # n
    c_row = g + 8 * (i4 // 2)
    c_col = 2 * t + (i4 % 2)
    return a_row, a_col, b_row, b_col, c_row, c_col


A_ROW, A_COL, B_ROW, B_COL, C_ROW, C_COL = _fragment_maps()
# Each fragment holds every element of its matrix once: as flat positions (row * columns + col,
# in lane order) they are permutations, and their inverses gather a warp's fragments into
# the row-major matrix.
A_FROM_LANES = np.argsort((A_ROW * 16 + A_COL).ravel())
B_FROM_LANES = np.argsort((B_ROW * 8 + B_COL).ravel())
C_TO_LANES = (C_ROW * 8 + C_COL).ravel()
C_FROM_LANES = np.argsort(C_TO_LANES)


def _halves_to_f64(words, kind):
    """uint32 words [..., k] -> float64 halves [..., 2k], low half first."""
    halves = np.ascontiguousarray(words).view(np.uint16)
    return nm.decode(halves.view(np.float16) if kind == "f16" else halves, kind)


@opcode("ldmatrix")
def _ldmatrix(c):
    num = c.pick(("x1", "x2", "x4"))
    if "m8n8" not in c.mods or num is None or c.type != "b16":
        c.fail("only ldmatrix.sync.aligned.m8n8.{x1,x2,x4}[.trans].shared.b16 is supported")
    c.need(2)
    count = int(num[1])
    trans = "trans" in c.mods
    d = c.ops[0]
    items = d.items if isinstance(d, Vec) else (d,)
    if len(items) != count:
        c.fail(f"ldmatrix .{num} needs {count} destination registers")
    writers = [c.write(item, "b32") for item in items]
    address = c.address(c.ops[1], c.space())
    space = c.space()

    def run(st, sel):
        threads = st.indices(sel)
        warps = full_warps(st, threads, "ldmatrix")
        addr = address(st, sel).reshape(-1, 32)
        rows = warps[:, : 8 * count].ravel()         # lane 8i+r addresses row r of matrix i
        data = st.load(space, addr[:, : 8 * count].ravel(), 2, 8, rows)
        mats = data.reshape(-1, count, 8, 8)          # [warp, matrix, row, col]
        if trans:
            mats = np.ascontiguousarray(mats.transpose(0, 1, 3, 2))
        # lane l holds columns 2(l % 4), +1 of row l / 4: word l of the row-major matrix
        words = mats.view(np.uint32).reshape(-1, count, 32)
        for i, w in enumerate(writers):
            w(st, sel, words[:, i, :].ravel())
    return c.alu(run)


@opcode("mma")
def _mma(c):
    kinds = [m for m in c.mods if m in TYPES]
    if ("m16n8k16" not in c.mods or c.pick(("row",)) is None or c.pick(("col",)) is None
            or len(kinds) != 4 or kinds[0] != "f32" or kinds[3] != "f32"
            or kinds[1] != kinds[2] or kinds[1] not in ("f16", "bf16")):
        c.fail("only mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 is supported")
    c.need(4)
    kind = kinds[1]
    groups = [op.items if isinstance(op, Vec) else () for op in c.ops]
    if [len(g) for g in groups] != [4, 4, 2, 4]:
        c.fail("mma m16n8k16 takes {d0..d3}, {a0..a3}, {b0,b1}, {c0..c3}")
    a_r = [c.read(x, "b32") for x in groups[1]]
    b_r = [c.read(x, "b32") for x in groups[2]]
    c_r = [c.read(x, "f32") for x in groups[3]]
    d_w = [c.write(x, "f32") for x in groups[0]]

    def stack(readers, st, sel, dt):
        values = np.empty((_count(st, sel), len(readers)), dt)
        for i, r in enumerate(readers):
            values[:, i] = r(st, sel)
        return values

    def run(st, sel):
        threads = st.indices(sel)
        nw = len(full_warps(st, threads, "mma"))
        a = _halves_to_f64(stack(a_r, st, sel, np.uint32), kind).reshape(nw, 256)
        b = _halves_to_f64(stack(b_r, st, sel, np.uint32), kind).reshape(nw, 128)
        A = np.take(a, A_FROM_LANES, axis=1).reshape(nw, 16, 16)
        B = np.take(b, B_FROM_LANES, axis=1).reshape(nw, 16, 8)
        C = np.take(stack(c_r, st, sel, np.float32).reshape(nw, 128), C_FROM_LANES, axis=1)
        D = st.approx.mma(A, B, C.reshape(nw, 16, 8))
        out = np.take(D.reshape(nw, 128), C_TO_LANES, axis=1).reshape(-1, 4)
        for i, w in enumerate(d_w):
            w(st, sel, out[:, i])
    return c.alu(run)
