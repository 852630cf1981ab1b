"""Atomics: contention is serialised in thread order, so results are exact and repeatable."""
import numpy as np

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


def run(body, cell, threads=256, ctas=4):
    out = np.zeros(threads * ctas, np.uint32)
    launch(module(PROLOGUE + body + "\n  st.global.u32 [%out], %old;\n  ret;", PARAMS), "k",
           (ctas, 1, 1), (threads, 1, 1), [cell, out])
    return out


def test_contended_add_counts_every_thread_in_order():
    cell = np.array([5, 0], np.uint32)
    old = run("  atom.global.add.u32 %old, [%cell], 1;\n  red.global.add.u32 [%cell+4], %lin;", cell)
    assert cell[0] == 5 + 1024 and cell[1] == sum(range(1024))
    assert np.array_equal(old, 5 + np.arange(1024))        # thread order within the launch


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
    want = [tid[(tid % 10 == t % 10) & (tid < t)].sum() for t in tid]
    assert np.array_equal(old, want)


def test_cas_lock_free_claim():
    cell = np.zeros(1, np.uint32)
    # each thread tries once to swap 0 -> tid+1: exactly the first thread wins
    old = run("  add.u32 %r2, %lin, 1;\n  atom.global.cas.b32 %old, [%cell], 0, %r2;", cell)
    assert cell[0] == 1
    assert old[0] == 0 and (old[1:] == 1).all()


def test_inc_wraps_and_dec():
    cell = np.array([0, 10], np.uint32)
    old = run("  atom.global.inc.u32 %old, [%cell], 4;\n  atom.global.dec.u32 %r3, [%cell+4], 20;",
              cell, threads=32, ctas=1)
    assert list(old[:7]) == [0, 1, 2, 3, 4, 0, 1]           # wraps after reaching 4
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
    exact = np.float32(0)
    for t in range(128):
        exact = np.float32(exact + np.float32(t))
    assert cell[0] == exact
    assert cell[1:2].view(np.uint32)[0] == 127          # the last thread in order wins the exchange
    assert cell[2:3].view(np.int32)[0] == 127
    assert cell[3:4].view(np.uint32)[0] == 256
    assert np.array_equal(np.sort(old), np.arange(0, 256, 2))


def test_many_slots_few_collisions_in_thread_order():
    cell = np.zeros(50, np.uint32)
    body = """
  .reg .b64 %slotaddr;
  rem.u32 %r2, %lin, 50;
  mul.wide.u32 %slotaddr, %r2, 4;
  add.s64 %slotaddr, %cell, %slotaddr;
  atom.global.exch.b32 %old, [%slotaddr], %lin;
"""
    old = run(body, cell, threads=128, ctas=1)
    lin = np.arange(128)
    assert np.array_equal(cell, [lin[lin % 50 == k].max() for k in range(50)])
    assert np.array_equal(old, np.where(lin >= 50, lin - 50, 0))
