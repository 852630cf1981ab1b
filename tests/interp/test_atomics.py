"""Atomics: every op returns the old value; contention lands in a seeded order of the threads,
always with the right final value."""
import numpy as np
import pytest

from ptxgen.interp import launch
from interp_helpers import module

PARAMS = ".param .u64 cell, .param .u64 out"
PROLOGUE = """
  .reg .b32 %lin, %v, %old, %r<4>;
  .reg .f32 %f, %fold;
  .reg .b64 %cell, %out, %a;
  ld.param.u64 %cell, [cell];
  ld.param.u64 %out, [out];
  mov.u32 %lin, %ctaid.x;
  mov.u32 %r1, %ntid.x;
  mov.u32 %r2, %tid.x;
  mad.lo.u32 %lin, %lin, %r1, %r2;
  mul.wide.u32 %a, %lin, 4;
  add.s64 %out, %out, %a;
"""


def run(body, cell, threads=256, ctas=4, seed=0):
    out = np.zeros(threads * ctas, np.uint32)
    launch(module(PROLOGUE + body + "\n  st.global.u32 [%out], %old;\n  ret;", PARAMS), "k",
           (ctas, 1, 1), (threads, 1, 1), [cell, out], seed=seed)
    return out


def test_contended_add_counts_every_thread_in_a_seeded_order():
    orders = []
    for seed in (0, 0, 1):
        cell = np.array([5, 0], np.uint32)
        old = run("  atom.global.add.u32 %old, [%cell], 1;\n  red.global.add.u32 [%cell+4], %lin;",
                  cell, seed=seed)
        assert cell[0] == 5 + 1024 and cell[1] == sum(range(1024))
        assert np.array_equal(np.sort(old), 5 + np.arange(1024))    # each thread one slot
        orders.append(old)
    assert np.array_equal(orders[0], orders[1]), "the same seed must give the same order"
    assert not np.array_equal(orders[0], orders[2]), "another seed should give another order"
    assert not np.array_equal(orders[0], 5 + np.arange(1024)), "the order is not thread order"


def test_add_to_many_addresses_with_collisions():
    cell = np.zeros(10, np.uint64)
    body = """
  .reg .b64 %d, %slot;
  rem.u32 %r2, %lin, 10;
  mul.wide.u32 %slot, %r2, 8;
  add.s64 %slot, %cell, %slot;
  cvt.u64.u32 %d, %lin;
  atom.global.add.u64 %d, [%slot], %d;
  cvt.u32.u64 %old, %d;
"""
    old = run(body, cell, threads=64, ctas=2)
    tid = np.arange(128)
    assert np.array_equal(cell, [tid[tid % 10 == k].sum() for k in range(10)])
    # each thread saw the sum of the threads of its slot that came before it, in some order
    for k in range(10):
        mine = tid[tid % 10 == k]
        seen = np.sort(old[mine].astype(np.int64))
        order = mine[np.argsort(old[mine], kind="stable")]
        assert np.array_equal(seen, np.concatenate([[0], np.cumsum(order)[:-1]]))


def test_cas_lock_free_claim():
    cell = np.zeros(1, np.uint32)
    # each thread tries once to swap 0 -> tid+1: exactly one thread wins, the rest see it
    old = run("  add.u32 %r2, %lin, 1;\n  atom.global.cas.b32 %old, [%cell], 0, %r2;", cell)
    winner = np.flatnonzero(old == 0)
    assert len(winner) == 1 and cell[0] == winner[0] + 1
    assert (np.delete(old, winner) == cell[0]).all()


def test_inc_wraps_and_dec():
    cell = np.array([0, 10], np.uint32)
    old = run("  atom.global.inc.u32 %old, [%cell], 4;\n  atom.global.dec.u32 %r3, [%cell+4], 20;",
              cell, threads=32, ctas=1)
    assert sorted(old) == sorted([0, 1, 2, 3, 4] * 6 + [0, 1])     # counts 0..4, wraps
    assert cell[0] == 32 % 5
    # dec counts 10 down to 0, then wraps to the bound 20 and keeps counting down
    value = 10
    for _ in range(32):
        value = 20 if value == 0 or value > 20 else value - 1
    assert cell[1] == value


def test_float_add_exch_min_max_shared():
    cell = np.zeros(4, np.float32)
    body = """
  .shared .align 4 .b32 smem[2];
  .reg .b32 %s;
  mov.u32 %s, smem;
  setp.eq.u32 %p0, %lin, 0;
  mov.u32 %r2, 0;
  @%p0 st.shared.u32 [%s], %r2;
  @%p0 st.shared.u32 [%s+4], %r2;
  bar.sync 0;
  cvt.rn.f32.u32 %f, %lin;
  atom.global.add.f32 %fold, [%cell], %f;
  atom.global.exch.b32 %r3, [%cell+4], %lin;
  atom.global.max.s32 %r3, [%cell+8], %lin;
  atom.shared.add.u32 %old, [%s], 2;
  red.shared.max.u32 [%s+4], %lin;
  bar.sync 0;
  @%p0 ld.shared.u32 %r2, [%s];
  @%p0 st.global.u32 [%cell+12], %r2;
"""
    body = "  .reg .pred %p0;\n" + body
    old = run(body, cell, threads=128, ctas=1)
    assert cell[0] == sum(range(128))                   # small integers: exact in any order
    assert 0 <= cell[1:2].view(np.uint32)[0] < 128      # some thread wins the exchange
    assert cell[2:3].view(np.int32)[0] == 127
    assert cell[3:4].view(np.uint32)[0] == 256
    assert np.array_equal(np.sort(old), np.arange(0, 256, 2))


def test_many_slots_few_collisions():
    cell = np.zeros(50, np.uint32)
    body = """
  .reg .b64 %slotaddr;
  rem.u32 %r2, %lin, 50;
  mul.wide.u32 %slotaddr, %r2, 4;
  add.s64 %slotaddr, %cell, %slotaddr;
  add.u32 %r3, %lin, 1;
  atom.global.exch.b32 %old, [%slotaddr], %r3;
"""
    old = run(body, cell, threads=128, ctas=1)
    lin = np.arange(128)
    for k in range(50):
        mine = lin[lin % 50 == k] + 1
        # the exchanges form one chain: 0 -> a -> b -> ... -> the final value
        chain = {int(o): int(t) for o, t in zip(old[mine - 1], mine)}
        value, seen = 0, []
        while value in chain:
            value = chain.pop(value)
            seen.append(value)
        assert not chain and sorted(seen) == sorted(mine) and cell[k] == seen[-1]


# ---- uncontended atomics: every op and type returns the old value ------------------------
UNCONTENDED = """
  .reg .b32 %lin, %t<2>;
  .reg .b64 %cell, %bp, %cp, %out, %off;
  .reg .{reg} %b, %c, %old, %v;
  .shared .align 8 .b8 smem[{shared}];
  ld.param.u64 %cell, [cell];
  ld.param.u64 %bp, [bp];
  ld.param.u64 %cp, [cp];
  ld.param.u64 %out, [out];
  mov.u32 %lin, %tid.x;
  mul.wide.u32 %off, %lin, {size};
  add.s64 %cell, %cell, %off;
  add.s64 %bp, %bp, %off;
  add.s64 %cp, %cp, %off;
  add.s64 %out, %out, %off;
  ld.global.{t} %b, [%bp];
  ld.global.{t} %c, [%cp];
{body}
  st.global.{t} [%out], %old;
  ret;
"""
GLOBAL = "  atom.global.{op}.{t} %old, [%cell], %b{c};"
SHARED = """  mov.u32 %t0, smem;
  mad.lo.u32 %t0, %lin, {size}, %t0;
  ld.global.{t} %v, [%cell];
  st.shared.{t} [%t0], %v;
  atom.shared.{op}.{t} %old, [%t0], %b{c};
  ld.shared.{t} %v, [%t0];
  st.global.{t} [%cell], %v;"""


def _wrap(dtype):
    return lambda x: x.astype(dtype)


def _inc(old, b, c):
    return np.where(old >= b, 0, old + 1).astype(old.dtype)


def _dec(old, b, c):
    return np.where((old == 0) | (old > b), b, old - 1).astype(old.dtype)


OPS = {
    "add": lambda old, b, c: (old + b).astype(old.dtype),
    "min": lambda old, b, c: np.minimum(old, b), "max": lambda old, b, c: np.maximum(old, b),
    "exch": lambda old, b, c: b, "cas": lambda old, b, c: np.where(old == b, c, old),
    "and": lambda old, b, c: old & b, "or": lambda old, b, c: old | b, "xor": lambda old, b, c: old ^ b,
    "inc": _inc, "dec": _dec,
}
CASES = [("add", t) for t in ("u32", "s32", "u64", "s64", "f32", "f64")] + \
        [(op, t) for op in ("min", "max") for t in ("u32", "s32", "u64", "s64")] + \
        [(op, t) for op in ("exch", "cas", "and", "or", "xor") for t in ("b32", "b64")] + \
        [("inc", "u32"), ("dec", "u32")]


def operands(op, t, rng, n):
    dtype = {"u32": np.uint32, "s32": np.int32, "u64": np.uint64, "s64": np.int64, "f32": np.float32,
             "f64": np.float64, "b32": np.uint32, "b64": np.uint64}[t]
    if t.startswith("f"):
        old, b = (rng.standard_normal(n) * 100).astype(dtype), (rng.standard_normal(n) * 100).astype(dtype)
    elif op in ("inc", "dec"):     # small values so that wrapping and the bound both happen
        old, b = rng.integers(0, 8, n).astype(dtype), rng.integers(0, 8, n).astype(dtype)
    else:
        info = np.iinfo(dtype)
        old = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
        b = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
    c = rng.permutation(old)
    if op == "cas":                # half the compares succeed
        b = np.where(np.arange(n) % 2 == 0, old, b)
    return old, b, c


def uncontended(op, t, space, old, b, c):
    """Thread i applies atom.space.op.t to its own cell, old[i], with b[i] (and c[i]): the cells
    after, and the old values the threads saw."""
    size = old.itemsize
    reg = ("f" if t.startswith("f") else "b") + str(8 * size)
    atom = (GLOBAL if space == "global" else SHARED).format(op=op, t=t, size=size,
                                                            c=", %c" if op == "cas" else "")
    ptx = module(UNCONTENDED.format(reg=reg, t=t, size=size, shared=old.size * size, body=atom),
                 ".param .u64 cell, .param .u64 bp, .param .u64 cp, .param .u64 out")
    cell, out = old.copy(), np.zeros_like(old)
    launch(ptx, "k", (1, 1, 1), (old.size, 1, 1), [cell, b, c, out])
    return cell, out


@pytest.mark.parametrize("space", ["global", "shared"])
@pytest.mark.parametrize("op, t", CASES, ids=[f"{op}.{t}" for op, t in CASES])
def test_uncontended_atomic_returns_the_old_value(op, t, space):
    old, b, c = operands(op, t, np.random.default_rng(len(op) * 7 + len(t)), 64)
    cell, out = uncontended(op, t, space, old, b, c)
    assert np.array_equal(out.view(np.uint8), old.view(np.uint8)), f"{op}.{t}: returned values are not the old ones"
    want = OPS[op](old, b, c)
    assert np.array_equal(cell.view(np.uint8), want.astype(old.dtype).view(np.uint8)), f"{op}.{t}: new values"


def test_float_add_flushes_subnormals_on_global_memory_only():
    """ISA 9.7.13.5: atom.add.f32 on global memory flushes subnormal inputs (the value in memory
    too) and results to sign-preserving zero; on shared memory it keeps them."""
    tiny = 2.0**-126
    old = np.array([tiny / 2, 2 * tiny, -2 * tiny, 1.5, tiny / 2], np.float32)
    b = np.array([tiny / 2, -1.5 * tiny, 1.5 * tiny, 2.0**-140, 1.0], np.float32)
    cell, seen = uncontended("add", "f32", "global", old, b, b)
    assert list(cell.view(np.uint32)) == [0, 0, 0x80000000, 0x3FC00000, 0x3F800000]
    assert np.array_equal(seen, old)                      # the old values come back unflushed
    cell, _ = uncontended("add", "f32", "shared", old, b, b)
    assert np.array_equal(cell, old + b)
    old64, b64 = old.astype(np.float64) * 2.0**-900, b.astype(np.float64) * 2.0**-900    # f64 keeps subnormals
    assert np.array_equal(uncontended("add", "f64", "global", old64, b64, b64)[0], old64 + b64)


def test_contended_float_add_flushes_each_partial_sum():
    """2^-125 + 3 x (-1.5 x 2^-126): the first partial sum, 2^-127, is subnormal and flushed."""
    cell = np.array([2.0**-125], np.float32)
    old = run("  mov.b32 %f, 0f80C00000;\n  atom.add.f32 %fold, [%cell], %f;\n  mov.b32 %old, %fold;",
              cell, threads=3, ctas=1)
    assert cell.view(np.uint32)[0] == 0x81400000                    # -3 x 2^-126, not -2.5 x 2^-126
    assert sorted(old) == [0, 0x01000000, 0x80C00000]
