"""Divergence, reconvergence, loops, barriers, shared/local memory, special registers."""
import importlib

import numpy as np
import pytest

from ptxgen.errors import SanitizerError
from ptxgen.interp import launch
from interp_helpers import module

OUT_PARAMS = ".param .u64 out"
PROLOGUE = """
  .reg .b32 %lin, %r<8>, %m;
  .reg .b64 %out, %addr;
  .reg .pred %p<4>;
  ld.param.u64 %out, [out];
  mov.u32 %lin, %tid.x;
"""
STORE = """
  mov.u32 %r7, %ctaid.x;
  mov.u32 %r6, %ntid.x;
  mad.lo.u32 %r7, %r7, %r6, %lin;
  mul.wide.u32 %addr, %r7, 8;
  add.s64 %addr, %out, %addr;
  st.global.v2.u32 [%addr], {%r0, %m};
  ret;
"""


def run_block(body, threads=64, ctas=1):
    out = np.zeros((ctas * threads, 2), np.uint32)
    launch(module(PROLOGUE + body + STORE, OUT_PARAMS), "k", (ctas, 1, 1), (threads, 1, 1), [out])
    return out[:, 0], out[:, 1]


def test_nested_if_else_reconverges():
    body = """
  and.b32 %r1, %lin, 1;
  setp.ne.u32 %p1, %r1, 0;
  @%p1 bra ODD;
  and.b32 %r2, %lin, 3;
  setp.ne.u32 %p2, %r2, 0;
  @%p2 bra EVEN_NOT4;
  mov.u32 %r0, 1;
  bra JOIN_EVEN;
EVEN_NOT4:
  mov.u32 %r0, 2;
JOIN_EVEN:
  add.u32 %r0, %r0, 100;
  bra JOIN;
ODD:
  mov.u32 %r0, 3;
JOIN:
  add.u32 %r0, %r0, 10;
  activemask.b32 %m;
"""
    r, mask = run_block(body)
    tid = np.arange(64)
    want = np.where(tid % 2 == 1, 13, np.where(tid % 4 == 0, 111, 112))
    assert np.array_equal(r, want)
    assert (mask == 0xFFFFFFFF).all()        # every warp is whole again after the join


def test_loops_with_per_thread_trip_counts():
    body = """
  rem.u32 %r1, %lin, 7;          // outer trip count 0..6
  mov.u32 %r0, 0;
  mov.u32 %r2, 0;
OUTER:
  setp.ge.u32 %p1, %r2, %r1;
  @%p1 bra DONE;
  mov.u32 %r3, 0;
INNER:                           // inner trip count r2 + 1
  add.u32 %r0, %r0, %r3;
  add.u32 %r3, %r3, 1;
  setp.le.u32 %p2, %r3, %r2;
  @%p2 bra INNER;
  add.u32 %r2, %r2, 1;
  bra OUTER;
DONE:
  activemask.b32 %m;
"""
    r, mask = run_block(body, threads=96)
    want = [sum(j * (j + 1) // 2 for j in range(t % 7)) for t in range(96)]
    assert list(r) == want
    assert (mask == 0xFFFFFFFF).all()


def test_barrier_orders_shared_memory_across_warps():
    body = """
  .shared .align 4 .b32 buf[128];
  mov.u32 %r1, buf;
  shl.b32 %r2, %lin, 2;
  add.u32 %r2, %r1, %r2;
  mul.lo.u32 %r3, %lin, 3;
  st.shared.u32 [%r2], %r3;
  bar.sync 0;
  add.u32 %r4, %lin, 37;
  and.b32 %r4, %r4, 127;
  shl.b32 %r4, %r4, 2;
  add.u32 %r4, %r1, %r4;
  ld.shared.u32 %r0, [%r4];
  mov.u32 %m, 0;
"""
    r, _ = run_block(body, threads=128, ctas=3)
    tid = np.tile(np.arange(128), 3)
    assert np.array_equal(r, ((tid + 37) % 128) * 3)


def test_tree_reduction_with_barrier_in_loop():
    body = """
  .shared .align 4 .u32 sums[256];
  mov.u32 %r1, sums;
  shl.b32 %r2, %lin, 2;
  add.u32 %r2, %r1, %r2;
  st.shared.u32 [%r2], %lin;
  bar.sync 0;
  mov.u32 %r3, 128;
STEP:
  setp.ge.u32 %p1, %lin, %r3;
  @%p1 bra SKIP;
  shl.b32 %r4, %r3, 2;
  add.u32 %r4, %r2, %r4;
  ld.shared.u32 %r5, [%r4];
  ld.shared.u32 %r6, [%r2];
  add.u32 %r6, %r6, %r5;
  st.shared.u32 [%r2], %r6;
SKIP:
  bar.sync 0;
  shr.u32 %r3, %r3, 1;
  setp.ne.u32 %p2, %r3, 0;
  @%p2 bra STEP;
  ld.shared.u32 %r0, [%r1];
  mov.u32 %m, 0;
"""
    r, _ = run_block(body, threads=256, ctas=2)
    assert (r == sum(range(256))).all()


def test_special_registers_3d():
    body = """
  .reg .b32 %t<12>;
  .reg .b64 %o, %a;
  ld.param.u64 %o, [out];
  mov.u32 %t0, %tid.x;  mov.u32 %t1, %tid.y;  mov.u32 %t2, %tid.z;
  mov.u32 %t3, %ctaid.x; mov.u32 %t4, %ctaid.y; mov.u32 %t5, %ctaid.z;
  mov.u32 %t6, %ntid.x; mov.u32 %t7, %nctaid.y; mov.u32 %t8, %laneid; mov.u32 %t9, %warpid;
  // linear thread index over the grid
  mov.u32 %t10, %nctaid.x;
  mad.lo.u32 %t11, %t5, %t7, %t4;
  mad.lo.u32 %t11, %t11, %t10, %t3;          // linear CTA id
  mad.lo.u32 %t10, %t2, 3, %t1;
  mad.lo.u32 %t10, %t10, 8, %t0;             // linear tid in CTA (block 8x3x2)
  mad.lo.u32 %t11, %t11, 48, %t10;
  mul.wide.u32 %a, %t11, 32;
  add.s64 %a, %o, %a;
  st.global.v4.u32 [%a], {%t0, %t1, %t2, %t3};
  st.global.v4.u32 [%a+16], {%t4, %t5, %t8, %t9};
  ret;
"""
    out = np.zeros((2 * 2 * 3 * 48, 8), np.uint32)
    launch(module(body, OUT_PARAMS), "k", (2, 2, 3), (8, 3, 2), [out])
    for row in (0, 47, 48 * 5 + 33, len(out) - 1):
        cta, lin = divmod(row, 48)
        want = [lin % 8, lin // 8 % 3, lin // 24, cta % 2, cta // 2 % 2, cta // 4, lin % 32, lin // 32]
        assert list(out[row]) == want


def test_dynamic_shared_local_memory_and_scopes():
    body = """
  .reg .b32 %x, %base;
  .reg .b64 %o;
  .local .align 4 .b32 scratch[4];
  .extern .shared .align 16 .b8 dyn[];
  ld.param.u64 %o, [out];
  mov.u32 %x, %tid.x;
  {
    .reg .b32 %x;                 // shadows the outer %x inside this scope
    mov.u32 %x, 1000;
    st.local.u32 [scratch+8], %x;
  }
  mov.u32 %base, dyn;
  shl.b32 %x, %x, 2;
  add.u32 %base, %base, %x;
  st.shared.u32 [%base+0], %x;
  ld.shared.u32 %x, [%base+0];
  {
    .reg .b32 %y;
    ld.local.u32 %y, [scratch+8];
    add.u32 %x, %x, %y;
  }
  {
    .reg .b64 %a;
    .reg .b32 %t;
    mov.u32 %t, %tid.x;
    cvt.u64.u32 %a, %t;
    shl.b64 %a, %a, 2;
    add.s64 %a, %o, %a;
    st.global.u32 [%a], %x;
  }
  ret;
"""
    out = np.zeros(32, np.uint32)
    launch(module(body, OUT_PARAMS), "k", (1, 1, 1), (32, 1, 1), [out], dynamic_shared=128)
    assert np.array_equal(out, np.arange(32) * 4 + 1000)


def test_many_ctas_run_in_waves(monkeypatch):
    launch_module = importlib.import_module("ptxgen.interp.launch")
    monkeypatch.setattr(launch_module, "MAX_WAVE_THREADS", 256)
    body = """
  .reg .b32 %r<4>;
  .reg .b64 %o;
  ld.param.u64 %o, [out];
  mov.u32 %r1, %ctaid.x;
  atom.global.add.u32 %r2, [%o], %r1;
  ret;
"""
    out = np.zeros(1, np.uint32)
    stats = launch(module(body, OUT_PARAMS), "k", (40, 1, 1), (64, 1, 1), [out])
    assert out[0] == 64 * sum(range(40))
    assert stats.waves == 10
    assert stats.thread_instructions == 40 * 64 * 4


def test_launch_validates_arguments():
    from ptxgen.errors import LaunchError
    ptx = module("  ret;", ".param .u64 out, .param .u32 n")
    with pytest.raises(LaunchError):
        launch(ptx, "k", (1, 1, 1), (32, 1, 1), [np.zeros(4)])
    with pytest.raises(LaunchError):
        launch(ptx, "k", (1, 1, 1), (32, 1, 1), [np.zeros(4), -1])
    with pytest.raises(LaunchError):
        launch(ptx, "k", (1, 1, 1), (32, 1, 1), [np.zeros((4, 4))[:, 0], 1])


def test_cp_async_and_generic_addressing():
    body = """
  .shared .align 16 .b8 stage[512];
  .reg .b32 %x, %s, %n, %v;
  .reg .b64 %src, %o, %g, %off;
  ld.param.u64 %o, [out];
  ld.param.u64 %src, [src];
  mov.u32 %x, %tid.x;
  mul.wide.u32 %off, %x, 16;
  add.s64 %src, %src, %off;
  mov.u32 %s, stage;
  shl.b32 %n, %x, 4;
  add.u32 %s, %s, %n;
  and.b32 %n, %x, 15;              // thread t copies t % 16 bytes, zero-filling the rest
  cp.async.cg.shared.global [%s], [%src], 16, %n;
  cp.async.commit_group;
  cp.async.wait_group 0;
  bar.sync 0;
  cvt.u64.u32 %g, %s;
  cvta.shared.u64 %g, %g;          // read back through a generic address
  ld.u32 %v, [%g+12];
  mul.wide.u32 %off, %x, 4;
  add.s64 %o, %o, %off;
  st.global.u32 [%o], %v;
  ret;
"""
    src = np.arange(32 * 16, dtype=np.uint8)
    out = np.zeros(32, np.uint32)
    launch(module(body, ".param .u64 out, .param .u64 src"), "k", (1, 1, 1), (32, 1, 1), [out, src])
    for t in range(32):
        row = np.where(np.arange(16) < t % 16, src[t * 16:(t + 1) * 16], 0).astype(np.uint8)
        assert out[t] == row[12:16].view(np.uint32)[0]


def test_prefetches_and_sleep_are_hints_that_change_nothing():
    """prefetch (to L2 with an eviction priority, and of the last byte of an array), prefetchu,
    nanosleep; a prefetch past every array is a finding (it would not fault on hardware)."""
    body = """
  .reg .b64 %a;
  .reg .b32 %v;
  ld.param.u64 %a, [a];
  prefetch.global.L2 [%a];
  prefetch.global.L2::evict_last [%a+15];
  prefetchu.L1 [%a];
  nanosleep.u32 100;
  mov.u32 %v, 7;
  st.global.u32 [%a], %v;
  ret;"""
    a = np.zeros(4, np.uint32)
    launch(module(body, ".param .u64 a"), "k", (1, 1, 1), (32, 1, 1), [a])
    np.testing.assert_array_equal(a, [7, 0, 0, 0])
    past = body.replace("[%a+15]", "[%a+16]")
    with pytest.raises(SanitizerError, match=r"out-of-bounds 1-byte global access: address .* is outside every "
                                             r"array, byte 16 of a, which holds 16 \(a at \["):
        launch(module(past, ".param .u64 a"), "k", (1, 1, 1), (32, 1, 1), [np.zeros(4, np.uint32)])


def test_timers_count_the_launchs_instructions():
    """%globaltimer, %clock64 and %clock: here the launch's executed instructions so far (the
    same for every thread of a step, never decreasing), so a kernel that times its phases runs."""
    body = """
  .reg .b64 %a, %t0, %t1, %c;
  .reg .b32 %s;
  ld.param.u64 %a, [a];
  mov.u64 %t0, %globaltimer;
  mov.u64 %c, %clock64;
  mov.u32 %s, %clock;
  mov.u64 %t1, %globaltimer;
  st.global.u64 [%a], %t0;
  st.global.u64 [%a+8], %c;
  st.global.u64 [%a+16], %t1;
  cvt.u64.u32 %c, %s;
  st.global.u64 [%a+24], %c;
  ret;"""
    a = np.zeros(4, np.uint64)
    launch(module(body, ".param .u64 a"), "k", (1, 1, 1), (32, 1, 1), [a])
    np.testing.assert_array_equal(a, [2, 3, 5, 4])  # counting the reading instruction itself
