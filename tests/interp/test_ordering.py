"""Global-memory ordering across CTAs (ordering.py): correct release/acquire patterns pass under
every interleaving tried; a missing release, a missing acquire, a non-coherent read, the wrong
scope or a cross-CTA write race is a finding naming the line, CTA and thread, and with the
sanitizer off it gives a wrong answer."""
import re
import sys

import numpy as np
import pytest

from ptxgen.errors import InterpError, SanitizerError
from ptxgen.interp import launch
from interp_helpers import module

launch_module = sys.modules["ptxgen.interp.launch"]

SEEDS = (0, 1, 2, 3)
CTAS, THREADS = 8, 64

# Each CTA writes its partials, releases, counts in; the CTA that completes the count sums
# every CTA's partials (the split-KV "last CTA merges" shape).
COUNT_IN = """
  .shared .align 4 .u32 last;
  .reg .b32 %t, %c, %n, %v, %old, %i;
  .reg .b64 %p, %q, %cnt, %o, %off;
  .reg .f32 %f, %acc;
  .reg .pred %first, %notlast, %more;
  ld.param.u64 %p, [partials];
  ld.param.u64 %cnt, [counter];
  ld.param.u64 %o, [out];
  mov.u32 %t, %tid.x;
  mov.u32 %c, %ctaid.x;
  mov.u32 %n, %nctaid.x;
  mad.lo.u32 %i, %c, 64, %t;
  mad.lo.u32 %v, %c, 1000, %t;
  add.u32 %v, %v, 1;
  cvt.rn.f32.u32 %f, %v;
  mul.wide.u32 %off, %i, 4;
  add.s64 %q, %p, %off;
  st.global.f32 [%q], %f;
  {release}
  bar.sync 0;
  setp.eq.u32 %first, %t, 0;
  @%first {count} %old, [%cnt], 1;
  @%first st.shared.u32 [last], %old;
  bar.sync 0;
  ld.shared.u32 %old, [last];
  sub.u32 %v, %n, 1;
  setp.ne.u32 %notlast, %old, %v;
  @%notlast bra DONE;
  {acquire}
  mov.u32 %v, %ctaid.x;
  @%first st.global.u32 [%cnt+4], %v;
  mov.f32 %acc, 0f00000000;
  mov.u32 %c, 0;
LOOP:
  mad.lo.u32 %i, %c, 64, %t;
  mul.wide.u32 %off, %i, 4;
  add.s64 %q, %p, %off;
  ld.global{cache}.f32 %f, [%q];   // READ
  add.f32 %acc, %acc, %f;
  add.u32 %c, %c, 1;
  setp.lt.u32 %more, %c, %n;
  @%more bra LOOP;
  mul.wide.u32 %off, %t, 4;
  add.s64 %q, %o, %off;
  st.global.f32 [%q], %acc;
DONE:
  ret;
"""
GOOD = dict(release="membar.gl;", acquire="membar.gl;", cache=".cg", count="atom.global.add.u32")
WANT = np.array([sum(c * 1000 + t + 1 for c in range(CTAS)) for t in range(THREADS)], np.float32)


def count_in_ptx(**change):
    return module(COUNT_IN.format(**{**GOOD, **change}), ".param .u64 partials, .param .u64 counter, .param .u64 out")


def count_in(seed=0, sanitize=True, **change):
    ptx = count_in_ptx(**change)
    partials = np.zeros(CTAS * THREADS, np.float32)
    counter = np.zeros(2, np.uint32)
    out = np.full(THREADS, np.nan, np.float32)
    launch(ptx, "k", (CTAS, 1, 1), (THREADS, 1, 1), [partials, counter, out], seed=seed,
           sanitize=sanitize, kernel_name="count_in")
    return out, int(counter[1])


def expect_finding(what, **change):
    """The planted bug is a finding at the READ line, for every seed; returns a message."""
    line = next(i + 1 for i, text in enumerate(count_in_ptx(**change).splitlines()) if "// READ" in text)
    for seed in SEEDS:
        with pytest.raises(SanitizerError) as err:
            count_in(seed, **change)
        msg = str(err.value)
        assert msg.startswith(f"count_in: line {line}: `ld.global"), msg
        assert re.search(what, msg), msg
        assert re.search(r"\[CTA \(\d,0,0\), thread \(\d+,0,0\)\]$", msg), msg
    return msg


def test_release_then_acquire_passes_in_every_interleaving():
    lasts = set()
    for seed in SEEDS:
        out, last = count_in(seed)
        np.testing.assert_array_equal(out, WANT)
        lasts.add(last)
    assert len(lasts) > 1, f"the same CTA completed the count under every seed: {lasts}"


@pytest.mark.parametrize("change", [
    dict(release="fence.acq_rel.gpu;", acquire="fence.acq_rel.gpu;"),
    dict(release="fence.sc.sys;", acquire="membar.sys;"),
    dict(release="", acquire="", count="atom.acq_rel.gpu.global.add.u32"),
    dict(release="", count="atom.release.gpu.global.add.u32"),
    dict(acquire="", count="atom.acquire.gpu.global.add.u32"),
    dict(cache=""),
], ids=["fence.acq_rel", "fence.sc+membar.sys", "atom.acq_rel", "atom.release+membar", "membar+atom.acquire",
        "plain-ld"])
def test_other_correct_patterns_pass(change):
    for seed in SEEDS[:2]:
        np.testing.assert_array_equal(count_in(seed, **change)[0], WANT)


def test_missing_release_and_acquire():
    msg = expect_finding(r"global-memory race: reads partials\[\d+\], which CTA \(\d,0,0\) wrote \(line \d+ "
                         r"`st.global.f32 \[%q\], %f;`\)", release="", acquire="")
    assert "signalled with line" in msg and "atom.global.add.u32" in msg and "without releasing" in msg
    for seed in SEEDS:
        assert not np.array_equal(count_in(seed, sanitize=False, release="", acquire="")[0], WANT)


def test_missing_release_only():
    msg = expect_finding("global-memory race", release="")
    assert "without releasing" in msg
    assert not np.array_equal(count_in(sanitize=False, release="")[0], WANT)


def test_missing_acquire_only():
    msg = expect_finding("global-memory race", acquire="")
    assert "never acquired a release" in msg
    assert not np.array_equal(count_in(sanitize=False, acquire="")[0], WANT)


def test_release_before_the_writes_is_no_release():
    """membar.gl must come after the data it publishes: here it precedes the store."""
    body = dict(release="")
    ptx_change = COUNT_IN.replace("  st.global.f32 [%q], %f;\n", "  membar.gl;\n  st.global.f32 [%q], %f;\n")
    ptx = module(ptx_change.format(**{**GOOD, **body}), ".param .u64 partials, .param .u64 counter, .param .u64 out")
    with pytest.raises(SanitizerError, match="global-memory race"):
        launch(ptx, "k", (CTAS, 1, 1), (THREADS, 1, 1),
               [np.zeros(CTAS * THREADS, np.float32), np.zeros(2, np.uint32), np.zeros(THREADS, np.float32)])


def test_non_coherent_read_of_data_written_in_the_launch():
    msg = expect_finding(r"non-coherent load \(.nc / ldu\) of partials\[\d+\], which CTA", cache=".nc")
    assert "stale" in msg
    for seed in SEEDS:
        assert not np.array_equal(count_in(seed, sanitize=False, cache=".nc")[0], WANT)


def test_cta_scoped_counter_does_not_order_other_ctas():
    with pytest.raises(SanitizerError, match=r"atomically updates counter\[0\]"):
        count_in(count="atom.relaxed.cta.global.add.u32")


def test_nc_read_of_inputs_is_fine():
    """.nc is right for data no thread writes during the launch."""
    ptx = module("""
  .reg .b64 %a, %b, %off;
  .reg .b32 %c, %v;
  ld.param.u64 %a, [a];
  ld.param.u64 %b, [b];
  mov.u32 %c, %ctaid.x;
  ld.global.nc.u32 %v, [%a];
  add.u32 %v, %v, %c;
  mul.wide.u32 %off, %c, 4;
  add.s64 %b, %b, %off;
  st.global.u32 [%b], %v;
  ret;""", ".param .u64 a, .param .u64 b")
    b = np.zeros(4, np.uint32)
    launch(ptx, "k", (4, 1, 1), (1, 1, 1), [np.array([7], np.uint32), b])
    assert list(b) == [7, 8, 9, 10]


# ---- a flag between two CTAs: store-release / load-acquire and the spin-wait -------------
FLAG = """
  .reg .b32 %c, %v, %g;
  .reg .b64 %d, %f, %o;
  .reg .pred %p;
  ld.param.u64 %d, [data];
  ld.param.u64 %f, [flag];
  ld.param.u64 %o, [out];
  mov.u32 %c, %ctaid.x;
  setp.ne.u32 %p, %c, 0;
  @%p bra CONSUMER;
  mov.u32 %v, 42;
  st.global.u32 [%d], %v;
  {publish}
  ret;
CONSUMER:
  {wait}
  setp.eq.u32 %p, %g, 0;
  @%p bra CONSUMER;
  {after}
  ld.global.u32 %v, [%d];   // READ
  st.global.u32 [%o], %v;
  ret;
"""


def flag(seed=0, sanitize=True, publish="st.release.gpu.global.u32 [%f], 1;",
         wait="ld.acquire.gpu.global.u32 %g, [%f];", after=""):
    ptx = module(FLAG.format(publish=publish, wait=wait, after=after),
                 ".param .u64 data, .param .u64 flag, .param .u64 out")
    out = np.zeros(1, np.uint32)
    launch(ptx, "k", (2, 1, 1), (32, 1, 1), [np.zeros(1, np.uint32), np.zeros(1, np.uint32), out],
           seed=seed, sanitize=sanitize)
    return out[0]


@pytest.mark.parametrize("publish, wait, after", [
    ("st.release.gpu.global.u32 [%f], 1;", "ld.acquire.gpu.global.u32 %g, [%f];", ""),
    ("fence.acq_rel.gpu; st.relaxed.gpu.global.u32 [%f], 1;", "ld.relaxed.gpu.global.u32 %g, [%f];",
     "fence.acq_rel.gpu;"),
    ("membar.gl; st.volatile.global.u32 [%f], 1;", "ld.volatile.global.u32 %g, [%f];", "membar.gl;"),
    ("red.release.gpu.global.add.u32 [%f], 1;", "atom.acquire.gpu.global.or.b32 %g, [%f], 0;", ""),
], ids=["st.release/ld.acquire", "fences+relaxed", "membar+volatile", "red.release/atom.acquire"])
def test_flag_patterns_pass(publish, wait, after):
    for seed in SEEDS:
        assert flag(seed, publish=publish, wait=wait, after=after) == 42


@pytest.mark.parametrize("publish, wait, after, why", [
    ("st.relaxed.gpu.global.u32 [%f], 1;", "ld.acquire.gpu.global.u32 %g, [%f];", "", "without releasing"),
    ("st.release.gpu.global.u32 [%f], 1;", "ld.relaxed.gpu.global.u32 %g, [%f];", "", "never acquired"),
    ("st.release.gpu.global.u32 [%f], 1;", "ld.relaxed.cta.global.u32 %g, [%f];", "fence.acq_rel.gpu;",
     "never acquired"),
    ("st.release.gpu.global.u32 [%f], 1;", "ld.relaxed.gpu.global.u32 %g, [%f];", "fence.acq_rel.cta;",
     "never acquired"),
    # a reduction's read forms no acquire pattern (PTX ISA 8.8)
    ("st.release.gpu.global.u32 [%f], 1;", "red.gpu.global.add.u32 [%f], 0; ld.relaxed.gpu.global.u32 %g, [%f];",
     "", "never acquired"),
], ids=["relaxed-store", "relaxed-load", "cta-scope-load", "cta-scope-fence", "red-no-acquire"])
def test_broken_flag_patterns_are_findings(publish, wait, after, why):
    for seed in SEEDS[:2]:
        with pytest.raises(SanitizerError, match=why):
            flag(seed, publish=publish, wait=wait, after=after)
    assert flag(publish=publish, wait=wait, after=after, sanitize=False) == 0    # the stale value


def test_a_spin_that_nothing_ends_is_a_deadlock():
    with pytest.raises(SanitizerError, match="spin-waits on global memory that no running thread writes"):
        flag(publish="", wait="ld.acquire.gpu.global.u32 %g, [%f];")


# ---- which writes of its CTA a release covers: its thread's own, and those before a bar.sync --
# CTA 0: the writers store data[tid % 32] = tid + 100, thread 0 fences and raises the flag;
# CTA 1 waits for the flag and copies data to out.
COVERAGE = """
  .reg .b32 %c, %t, %v, %g;
  .reg .b64 %d, %f, %o, %off;
  .reg .pred %p, %writer;
  ld.param.u64 %d, [data];
  ld.param.u64 %f, [flag];
  ld.param.u64 %o, [out];
  mov.u32 %c, %ctaid.x;
  mov.u32 %t, %tid.x;
  and.b32 %v, %t, 31;
  mul.wide.u32 %off, %v, 4;
  add.s64 %d, %d, %off;
  setp.ne.u32 %p, %c, 0;
  @%p bra CONSUMER;
  {writers}
  add.u32 %v, %t, 100;
  @%writer st.global.u32 [%d], %v;
  {between}
  setp.ne.u32 %p, %t, 0;
  @%p bra PRODUCED;
  fence.acq_rel.gpu;
  st.relaxed.gpu.global.u32 [%f], 1;
PRODUCED:
  {after}
  ret;
CONSUMER:
  ld.acquire.gpu.global.u32 %g, [%f];
  setp.eq.u32 %p, %g, 0;
  @%p bra CONSUMER;
  ld.global.u32 %v, [%d];   // READ
  mul.wide.u32 %off, %t, 4;
  add.s64 %o, %o, %off;
  st.global.u32 [%o], %v;
  ret;
"""
WARP1 = "setp.ge.u32 %writer, %t, 32;"
THREAD0 = "setp.eq.u32 %writer, %t, 0;"


def coverage(writers, between="", after="", seed=0, sanitize=True):
    """out, and what it must be: data as the writers left it, read by CTA 1's 64 threads."""
    ptx = module(COVERAGE.format(writers=writers, between=between, after=after),
                 ".param .u64 data, .param .u64 flag, .param .u64 out")
    out = np.zeros(64, np.uint32)
    launch(ptx, "k", (2, 1, 1), (64, 1, 1), [np.zeros(32, np.uint32), np.zeros(1, np.uint32), out],
           seed=seed, sanitize=sanitize, kernel_name="coverage")
    data = np.zeros(32, np.uint32)
    if writers == WARP1:
        data[:] = np.arange(32, 64) + 100
    else:
        data[0] = 100
    return out, np.tile(data, 2)


@pytest.mark.parametrize("writers, between", [(WARP1, "bar.sync 0;"), (THREAD0, "")],
                         ids=["bar.sync-then-thread-0-releases", "thread-0-releases-its-own-store"])
def test_release_covers_its_own_and_barrier_ordered_writes(writers, between):
    for seed in SEEDS:
        out, want = coverage(writers, between, seed=seed)
        np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("after", ["", "bar.sync 0;"], ids=["no-bar.sync", "bar.sync-after-the-release"])
def test_release_does_not_cover_other_threads_writes_without_a_barrier_before_it(after):
    """Warp 1 stores, thread 0 fences and flags: no bar.sync puts warp 1's stores before the
    fence (PTX ISA 8.9: a release is cumulative only over writes that precede it in causality
    order), and one after the release comes too late."""
    line = next(i + 1 for i, text in enumerate(module(COVERAGE, "").splitlines()) if "// READ" in text)
    for seed in SEEDS:
        with pytest.raises(SanitizerError) as err:
            coverage(WARP1, after=after, seed=seed)
        msg = str(err.value)
        assert msg.startswith(f"coverage: line {line}: `ld.global.u32"), msg
        assert re.search(r"reads data\[\d+\], which CTA \(0,0,0\) wrote \(line \d+ `@%writer st\.global\.u32 "
                         r"\[%d\], %v;`\).*the release of CTA \(0,0,0\) it acquired \(line \d+ `fence\.acq_rel\.gpu;` "
                         r"by thread \(0,0,0\)\) does not cover that write by thread \((3[2-9]|[4-6]\d),0,0\)", msg), msg
    out, want = coverage(WARP1, after=after, sanitize=False)
    assert (out == 0).all() and (want != 0).all(), "the uncovered stores must read as stale"


def test_a_word_whose_bytes_two_threads_wrote_needs_both_covered():
    """Threads 0-3 store one byte each of a word (one instruction: one record), thread 3
    releases; CTA 1 reads the word: threads 0-2's bytes are not covered."""
    ptx = module("""
  .reg .b32 %c, %t, %v, %g;
  .reg .b64 %d, %f, %o, %off;
  .reg .pred %p;
  ld.param.u64 %d, [data];
  ld.param.u64 %f, [flag];
  ld.param.u64 %o, [out];
  mov.u32 %c, %ctaid.x;
  mov.u32 %t, %tid.x;
  setp.ne.u32 %p, %c, 0;
  @%p bra CONSUMER;
  cvt.u64.u32 %off, %t;
  add.s64 %off, %d, %off;
  add.u32 %v, %t, 1;
  st.global.u8 [%off], %v;
  setp.ne.u32 %p, %t, 3;
  @%p bra PRODUCED;
  st.release.gpu.global.u32 [%f], 1;
PRODUCED:
  ret;
CONSUMER:
  ld.acquire.gpu.global.u32 %g, [%f];
  setp.eq.u32 %p, %g, 0;
  @%p bra CONSUMER;
  ld.global.u32 %v, [%d];
  st.global.u32 [%o], %v;
  ret;""", ".param .u64 data, .param .u64 flag, .param .u64 out")
    with pytest.raises(SanitizerError, match=r"reads data\[0\].* by thread \(3,0,0\)\) does not cover that write by "
                       r"thread \(0,0,0\)"):
        launch(ptx, "k", (2, 1, 1), (4, 1, 1), [np.zeros(1, np.uint32), np.zeros(1, np.uint32), np.zeros(1, np.uint32)])


# ---- an acquisition belongs to its thread: lane 0 acquires, then the warp reads --------------
# CTA 0's threads store data[t] = t + 100 and thread 0 releases a flag after a bar.sync; in CTA 1
# warp 0's lane 0 polls the flag (the others wait in the loop through a shfl.sync), then {sync},
# then every thread reads data[t]; warp 1, if any, runs {others} first (SYNC: warp 0's {sync}).
LANE0 = """
  .reg .b32 %c, %t, %v, %g;
  .reg .b64 %d, %f, %o, %off;
  .reg .pred %p, %lead, %low;
  ld.param.u64 %d, [data];
  ld.param.u64 %f, [flag];
  ld.param.u64 %o, [out];
  mov.u32 %c, %ctaid.x;
  mov.u32 %t, %tid.x;
  mul.wide.u32 %off, %t, 4;
  add.s64 %d, %d, %off;
  setp.eq.u32 %lead, %t, 0;
  setp.lt.u32 %low, %t, 16;
  setp.ne.u32 %p, %c, 0;
  @%p bra CONSUMER;
  add.u32 %v, %t, 100;
  st.global.u32 [%d], %v;
  bar.sync 0;
  @%lead st.release.gpu.global.u32 [%f], 1;
  ret;
CONSUMER:
  setp.ge.u32 %p, %t, 32;
  @%p bra OTHERS;
  mov.u32 %g, 0;
SPIN:
  @%lead {poll} %g, [%f];
  shfl.sync.idx.b32 %g, %g, 0, 0x1f, 0xffffffff;
  setp.eq.u32 %p, %g, 0;
  @%p bra SPIN;
  {fence}
SYNC:
  {sync}
READ:
  ld.global.u32 %v, [%d];   // READ
  add.s64 %o, %o, %off;
  st.global.u32 [%o], %v;
  ret;
OTHERS:
  {others}
  bra.uni READ;
"""
# Lane 0's acquire: an acquiring poll, or relaxed polls and then a fence of lane 0 alone (the
# persistent decoder's count-in shape).
POLLS = {"ld.acquire": dict(poll="ld.acquire.gpu.global.u32", fence=""),
         "relaxed+lane-0-fence": dict(poll="ld.relaxed.gpu.global.u32", fence="@%lead fence.acq_rel.gpu;")}


def lane0_ptx(poll, sync, others=""):
    return module(LANE0.format(**POLLS[poll], sync=sync, others=others),
                  ".param .u64 data, .param .u64 flag, .param .u64 out")


def lane0(poll, sync, others="", threads=32, seed=0, sanitize=True):
    """CTA 1's out, and what it must be (data as CTA 0 left it)."""
    out = np.zeros(threads, np.uint32)
    launch(lane0_ptx(poll, sync, others), "k", (2, 1, 1), (threads, 1, 1),
           [np.zeros(threads, np.uint32), np.zeros(1, np.uint32), out], seed=seed, sanitize=sanitize,
           kernel_name="lane0")
    return out, np.arange(threads, dtype=np.uint32) + 100


@pytest.mark.parametrize("poll", POLLS)
@pytest.mark.parametrize("sync, others, threads", [
    ("bar.warp.sync 0xffffffff;", "", 32),
    ("bar.sync 0;", "", 32),
    ("bar.sync 0;", "bra.uni SYNC;", 64),                                    # to a warp that never acquired
    ("bar.warp.sync 0xffffffff;\n  bar.arrive 1, 64;", "bar.sync 1, 64;", 64),   # a named barrier's waiters
], ids=["bar.warp.sync", "bar.sync", "bar.sync-two-warps", "bar.arrive-to-bar.sync"])
def test_a_barrier_passes_lane_0s_acquisition_on(poll, sync, others, threads):
    for seed in SEEDS[:2]:
        out, want = lane0(poll, sync, others, threads, seed)
        np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("poll", POLLS)
@pytest.mark.parametrize("sync, first", [
    ("", 1),
    ("@%low bar.warp.sync 0x0000ffff;", 16),
    ("selp.b32 %v, 0x0000ffff, 0xffff0000, %low;\n  bar.warp.sync %v;", 16),   # two masks in one instruction
], ids=["no-barrier", "bar.warp.sync-of-lanes-0-15", "two-half-warp-masks"])
def test_lanes_no_barrier_reached_read_unordered(poll, sync, first):
    """Lane 0's acquire orders lane 0's reads only (PTX ISA 8.8: an acquire pattern orders its own
    thread's later accesses); the shfl.sync and the loop's reconvergence order no memory, and a
    bar.warp.sync orders only the lanes of its mask."""
    line = next(i + 1 for i, text in enumerate(lane0_ptx(poll, sync).splitlines()) if "// READ" in text)
    for seed in SEEDS[:2]:
        with pytest.raises(SanitizerError) as err:
            lane0(poll, sync, seed=seed)
        msg = str(err.value)
        assert msg.startswith(f"lane0: line {line}: `ld.global.u32"), msg
        assert "another thread of this CTA acquired a release of it" in msg, msg
        assert msg.endswith(f"[CTA (1,0,0), thread ({first},0,0)]"), msg
    out, want = lane0(poll, sync, sanitize=False)
    np.testing.assert_array_equal(out[:first], want[:first])
    assert (out[first:] == 0).all(), "the unordered lanes must read stale values"


# CTA 0 stores data and releases flag[0]; in CTA 1 lane 0 acquires it and lane {relay} releases
# flag[1] (no barrier between); CTA 2 acquires flag[1] and reads CTA 0's data.
RELAY = """
  .reg .b32 %c, %t, %v, %g;
  .reg .b64 %d, %f, %o, %off;
  .reg .pred %p, %lead, %relay;
  ld.param.u64 %d, [data];
  ld.param.u64 %f, [flag];
  ld.param.u64 %o, [out];
  mov.u32 %c, %ctaid.x;
  mov.u32 %t, %tid.x;
  mul.wide.u32 %off, %t, 4;
  add.s64 %d, %d, %off;
  setp.eq.u32 %lead, %t, 0;
  setp.eq.u32 %relay, %t, {relay};
  setp.eq.u32 %p, %c, 1;
  @%p bra RELAY;
  setp.eq.u32 %p, %c, 2;
  @%p bra CONSUMER;
  add.u32 %v, %t, 100;
  st.global.u32 [%d], %v;
  bar.sync 0;
  @%lead st.release.gpu.global.u32 [%f], 1;
  ret;
RELAY:
  mov.u32 %g, 0;
WAIT:
  @%lead ld.acquire.gpu.global.u32 %g, [%f];
  shfl.sync.idx.b32 %g, %g, 0, 0x1f, 0xffffffff;
  setp.eq.u32 %p, %g, 0;
  @%p bra WAIT;
  @%relay st.release.gpu.global.u32 [%f+4], 1;
  ret;
CONSUMER:
  ld.acquire.gpu.global.u32 %g, [%f+4];
  setp.eq.u32 %p, %g, 0;
  @%p bra CONSUMER;
  ld.global.u32 %v, [%d];
  add.s64 %o, %o, %off;
  st.global.u32 [%o], %v;
  ret;
"""


def relay(lane, seed=0, sanitize=True):
    """CTA 2's out."""
    out = np.zeros(32, np.uint32)
    launch(module(RELAY.format(relay=lane), ".param .u64 data, .param .u64 flag, .param .u64 out"), "k",
           (3, 1, 1), (32, 1, 1), [np.zeros(32, np.uint32), np.zeros(2, np.uint32), out], seed=seed,
           sanitize=sanitize)
    return out


def test_a_release_carries_what_its_own_thread_acquired():
    """Release is cumulative over what its thread acquired (causality order is transitive): lane
    0's release passes CTA 0's data on, lane 1's (which acquired nothing) does not."""
    for seed in SEEDS[:2]:
        np.testing.assert_array_equal(relay(0, seed), np.arange(32) + 100)
        with pytest.raises(SanitizerError, match=r"global-memory race: reads data\[0\], which CTA \(0,0,0\) wrote"):
            relay(1, seed)
    assert (relay(1, sanitize=False) == 0).all(), "the unordered reads must see stale values"


# CTA 0 stores data[t] and releases flag[0]; CTA 1 stores data[32 + t] and releases flag[1]. In
# CTA 2's one warp: lane 0 acquires flag[0], lane 1 flag[1], lanes 0-15 pass theirs on to each
# other, lane 16 acquires flag[0] and lane 17 flag[1]; then lanes 0-16 read CTA 0's data, lane 17
# CTA 1's.
LANES = """
  .reg .b32 %c, %t, %v, %g;
  .reg .b64 %d, %f, %o, %off;
  .reg .pred %p, %low, %l0, %l1, %l16, %l17, %reads;
  ld.param.u64 %d, [data];
  ld.param.u64 %f, [flag];
  ld.param.u64 %o, [out];
  mov.u32 %c, %ctaid.x;
  mov.u32 %t, %tid.x;
  setp.eq.u32 %l0, %t, 0;
  setp.eq.u32 %l1, %t, 1;
  setp.eq.u32 %l16, %t, 16;
  setp.eq.u32 %l17, %t, 17;
  setp.lt.u32 %low, %t, 16;
  setp.eq.u32 %p, %c, 2;
  @%p bra CONSUMER;
  mad.lo.u32 %v, %c, 32, %t;
  mul.wide.u32 %off, %v, 4;
  add.s64 %d, %d, %off;
  add.u32 %v, %v, 100;
  st.global.u32 [%d], %v;
  bar.sync 0;
  mul.wide.u32 %off, %c, 4;
  add.s64 %f, %f, %off;
  @%l0 st.release.gpu.global.u32 [%f], 1;
  ret;
CONSUMER:
  mov.u32 %g, 0;
WAIT0:
  @%l0 ld.acquire.gpu.global.u32 %g, [%f];
  shfl.sync.idx.b32 %g, %g, 0, 0x1f, 0xffffffff;
  setp.eq.u32 %p, %g, 0;
  @%p bra WAIT0;
  mov.u32 %g, 0;
WAIT1:
  @%l1 ld.acquire.gpu.global.u32 %g, [%f+4];
  shfl.sync.idx.b32 %g, %g, 1, 0x1f, 0xffffffff;
  setp.eq.u32 %p, %g, 0;
  @%p bra WAIT1;
  @%low bar.warp.sync 0x0000ffff;
  @%l16 ld.acquire.gpu.global.u32 %g, [%f];
  @%l17 ld.acquire.gpu.global.u32 %g, [%f+4];
  selp.u32 %v, 32, 0, %l17;
  add.u32 %v, %v, %t;
  mul.wide.u32 %off, %v, 4;
  add.s64 %d, %d, %off;
  setp.le.u32 %reads, %t, 17;
  @%reads ld.global.u32 %v, [%d];
  mul.wide.u32 %off, %t, 4;
  add.s64 %o, %o, %off;
  @%reads st.global.u32 [%o], %v;
  ret;
"""


def test_each_lanes_acquisitions_stay_its_own():
    """Lanes that acquired different flags, some passing theirs on with a bar.warp.sync, each read
    what they acquired (the table of per-thread acquisitions drops unused rows as it fills)."""
    want = np.zeros(32, np.uint32)
    want[:17] = np.arange(17) + 100
    want[17] = 32 + 17 + 100
    for seed in SEEDS[:2]:
        out = np.zeros(32, np.uint32)
        launch(module(LANES, ".param .u64 data, .param .u64 flag, .param .u64 out"), "k", (3, 1, 1), (32, 1, 1),
               [np.zeros(64, np.uint32), np.zeros(2, np.uint32), out], seed=seed)
        np.testing.assert_array_equal(out, want)


# ---- a grid barrier (the persistent decoder's shape: one word, CTA 0 adds 2^31 - (CTAs - 1)) ----
GRID_BARRIER = """
  .reg .b32 %c, %n, %t, %v, %add, %old, %g;
  .reg .b64 %x, %y, %b, %off;
  .reg .pred %first, %cta0, %p;
  ld.param.u64 %x, [x];
  ld.param.u64 %y, [y];
  ld.param.u64 %b, [bar];
  mov.u32 %c, %ctaid.x;
  mov.u32 %n, %nctaid.x;
  mov.u32 %t, %tid.x;
  setp.eq.u32 %first, %t, 0;
  mad.lo.u32 %v, %c, 64, %t;
  mul.wide.u32 %off, %v, 4;
  add.s64 %off, %x, %off;
  add.u32 %v, %v, 7;
  st.global.u32 [%off], %v;
  bar.sync 0;
  setp.eq.u32 %cta0, %c, 0;
  neg.s32 %add, %n;
  add.u32 %add, %add, 0x80000001;
  selp.u32 %add, %add, 1, %cta0;
  @!%first bra PASSED;
  {fence}
  atom.relaxed.gpu.global.add.u32 %old, [%b], %add;
  add.u32 %g, %old, %add;
POLL:
  xor.b32 %g, %g, %old;
  setp.ge.s32 %p, %g, 0;
  @%p ld.relaxed.gpu.global.u32 %g, [%b];
  @%p bra POLL;
  {fence}
PASSED:
  bar.sync 0;
  add.u32 %v, %c, 1;
  rem.u32 %v, %v, %n;
  mad.lo.u32 %v, %v, 64, %t;
  mul.wide.u32 %off, %v, 4;
  add.s64 %off, %x, %off;
  ld.global.cg.u32 %v, [%off];   // READ
  mad.lo.u32 %g, %c, 64, %t;
  mul.wide.u32 %off, %g, 4;
  add.s64 %off, %y, %off;
  st.global.u32 [%off], %v;
  ret;
"""


def grid_barrier(fence, seed=0, sanitize=True, ctas=6):
    ptx = module(GRID_BARRIER.format(fence=fence), ".param .u64 x, .param .u64 y, .param .u64 bar")
    x, y, bar = np.zeros(ctas * 64, np.uint32), np.zeros(ctas * 64, np.uint32), np.zeros(1, np.uint32)
    launch(ptx, "k", (ctas, 1, 1), (64, 1, 1), [x, y, bar], seed=seed, sanitize=sanitize)
    return y, bar


def test_grid_barrier_with_fences_passes():
    want = np.roll(np.arange(6 * 64) + 7, -64)
    for seed in SEEDS:
        y, bar = grid_barrier("fence.acq_rel.gpu;", seed)
        np.testing.assert_array_equal(y, want)
        assert list(bar) == [2**31]  # arrivals back to 0, the top bit flipped


def test_grid_barrier_without_fences():
    for seed in SEEDS:
        with pytest.raises(SanitizerError, match=r"global-memory race: reads x\[\d+\]"):
            grid_barrier("", seed)
    y, _ = grid_barrier("", sanitize=False)
    assert not np.array_equal(y, np.roll(np.arange(6 * 64) + 7, -64))


# ---- races without any synchronisation ---------------------------------------------------
def test_two_ctas_writing_one_element():
    ptx = module("""
  .reg .b64 %a;
  .reg .b32 %c;
  ld.param.u64 %a, [a];
  mov.u32 %c, %ctaid.x;
  st.global.u32 [%a], %c;   // BUG
  ret;""", ".param .u64 a")
    with pytest.raises(SanitizerError, match=r"global-memory race: overwrites a\[0\], which CTA \(\d,0,0\) wrote"):
        launch(ptx, "k", (2, 1, 1), (1, 1, 1), [np.zeros(1, np.uint32)])


def test_reading_another_ctas_output_without_synchronisation():
    """No atomics or fences at all (lockstep): the read after the other CTA's write is flagged."""
    ptx = module("""
  .reg .b64 %a, %off;
  .reg .b32 %c, %v;
  ld.param.u64 %a, [a];
  mov.u32 %c, %ctaid.x;
  mul.wide.u32 %off, %c, 4;
  add.s64 %off, %a, %off;
  st.global.u32 [%off], %c;
  ld.global.u32 %v, [%a];
  ret;""", ".param .u64 a")
    with pytest.raises(SanitizerError, match=r"reads a\[0\], which CTA \(0,0,0\) wrote .* the writer has not released"):
        launch(ptx, "k", (2, 1, 1), (1, 1, 1), [np.zeros(2, np.uint32)])


# One CTA of 64 threads (two warps): each thread writes its slot of a global scratch array, then
# reads the slot of thread t ^ 32 (the other warp's), {between} the two.
IN_CTA = """
  .reg .b32 %t, %v, %n;
  .reg .b64 %s, %o, %a, %off;
  ld.param.u64 %s, [scratch];
  ld.param.u64 %o, [out];
  mov.u32 %t, %tid.x;
  mul.wide.u32 %off, %t, 4;
  add.s64 %a, %s, %off;
  add.u32 %v, %t, 100;
  {store} [%a], %v;
  {between}
  xor.b32 %n, %t, {partner};
  mul.wide.u32 %off, %n, 4;
  add.s64 %a, %s, %off;
  {load} %v, [%a];   // READ
  mul.wide.u32 %off, %t, 4;
  add.s64 %o, %o, %off;
  st.global.u32 [%o], %v;
  ret;"""


def in_cta(between="bar.sync 0;", store="st.global.u32", load="ld.global.u32", partner=32, seed=0):
    out = np.zeros(64, np.uint32)
    launch(module(IN_CTA.format(between=between, store=store, load=load, partner=partner),
                  ".param .u64 scratch, .param .u64 out"), "k", (1, 1, 1), (64, 1, 1),
           [np.zeros(64, np.uint32), out], seed=seed)
    return out


@pytest.mark.parametrize("change", [dict(), dict(between="", partner=1)], ids=["bar.sync", "same-warp"])
def test_a_ctas_warps_exchanging_through_global_memory(change):
    out = in_cta(**change)
    np.testing.assert_array_equal(out, (np.arange(64) ^ change.get("partner", 32)) + 100)


@pytest.mark.parametrize("strong", ["relaxed.gpu", "volatile"])
def test_strong_accesses_of_a_ctas_warps_do_not_race(strong):
    """No data race (both morally strong), so no finding; each read sees the write or not."""
    for seed in SEEDS[:2]:
        out = in_cta("", f"st.{strong}.global.u32", f"ld.{strong}.global.u32", seed=seed)
        assert np.isin(out, [0, *((np.arange(64) ^ 32) + 100)]).all(), out


@pytest.mark.parametrize("change", [dict(between=""), dict(between="", store="st.relaxed.gpu.global.u32")],
                         ids=["no-barrier", "only-the-store-strong"])
def test_a_read_of_another_warps_write_without_bar_sync_is_a_race(change):
    for seed in SEEDS[:2]:
        with pytest.raises(SanitizerError, match=r"global-memory race: reads scratch\[\d+\], which thread "
                                                 r"\(\d+,0,0\) of this CTA wrote \(line \d+ `st\..*\) with no "
                                                 r"bar.sync in between"):
            in_cta(seed=seed, **change)


# Warp 1 hands a value to warp 0 of its CTA through global memory with CTA-scope release and
# acquire on a flag (no bar.sync): ordered, so no finding.
HANDOFF = """
  .reg .b32 %t, %v, %f;
  .reg .b64 %d, %o;
  .reg .pred %p;
  ld.param.u64 %d, [data];
  ld.param.u64 %o, [out];
  mov.u32 %t, %tid.x;
  setp.ne.u32 %p, %t, 32;
  @%p bra READER;
  st.global.u32 [%d], 99;
  {publish} [%d+4], 1;
  bra.uni END;
READER:
  setp.ne.u32 %p, %t, 0;
  @%p bra END;
SPIN:
  {observe} %f, [%d+4];
  setp.eq.u32 %p, %f, 0;
  @%p bra SPIN;
  ld.global.u32 %v, [%d];
  st.global.u32 [%o], %v;
END:
  ret;"""


@pytest.mark.parametrize("publish, observe", [("st.release.cta.global.u32", "ld.acquire.cta.global.u32"),
                                              ("st.release.gpu.global.u32", "ld.acquire.gpu.global.u32")])
def test_warps_of_a_cta_handing_over_through_a_flag(publish, observe):
    for seed in SEEDS[:2]:
        out = np.zeros(1, np.uint32)
        launch(module(HANDOFF.format(publish=publish, observe=observe), ".param .u64 data, .param .u64 out"), "k",
               (1, 1, 1), (64, 1, 1), [np.zeros(2, np.uint32), out], seed=seed)
        assert out[0] == 99


def test_warps_of_a_cta_storing_to_one_word():
    ptx = module("""
  .reg .b64 %a;
  .reg .b32 %t;
  ld.param.u64 %a, [a];
  mov.u32 %t, %tid.x;
  {store} [%a], %t;
  ret;""", ".param .u64 a")
    with pytest.raises(SanitizerError, match=r"overwrites a\[0\], which thread \(\d+,0,0\) of this CTA writes "
                                             r"in the same instruction"):
        launch(ptx.replace("{store}", "st.global.u32"), "k", (1, 1, 1), (64, 1, 1), [np.zeros(1, np.uint32)])
    for fine in ("st.relaxed.gpu.global.u32", "atom.global.exch.b32 %t,"):   # strong stores do not race
        launch(ptx.replace("{store}", fine).replace("%t, [%a], %t", "%t, [%a], %t"), "k", (1, 1, 1), (64, 1, 1),
               [np.zeros(1, np.uint32)])


SPIN_LOCK = """
  .reg .b32 %t, %v, %old;
  .reg .b64 %lock, %o;
  .reg .pred %p, %q;
  ld.param.u64 %lock, [lock];
  ld.param.u64 %o, [out];
  mov.u32 %t, %tid.x;
  setp.ne.u32 %q, %t, 0;
  @%q bra DONE;
SPIN:
  atom.acquire.gpu.global.cas.b32 %old, [%lock], 0, 1;
  setp.ne.u32 %p, %old, 0;
  @%p bra SPIN;
  ld.global.u32 %v, [%o];
  add.u32 %v, %v, 1;
  st.global.u32 [%o], %v;
  st.release.gpu.global.u32 [%lock], 0;
DONE:
  ret;"""


@pytest.mark.parametrize("ctas", [2, 3, 8])
def test_a_spin_lock_serialises_every_cta(ctas):
    """A failing compare-and-swap is a spin the scheduler parks (as a spinning load): the lock
    holder runs, however many CTAs wait (3 or more spun forever before)."""
    for seed in SEEDS[:2]:
        out = np.zeros(1, np.uint32)
        launch(module(SPIN_LOCK, ".param .u64 lock, .param .u64 out"), "k", (ctas, 1, 1), (32, 1, 1),
               [np.zeros(1, np.uint32), out], seed=seed)
        assert out[0] == ctas


def test_atomic_counters_without_fences_are_fine_on_their_own():
    """Relaxed atomics are morally strong: a histogram needs no fence."""
    ptx = module("""
  .reg .b64 %a;
  .reg .b32 %t;
  ld.param.u64 %a, [a];
  mov.u32 %t, %tid.x;
  and.b32 %t, %t, 3;
  mul.lo.u32 %t, %t, 4;
  cvt.u64.u32 %a, %t;
  ld.param.u64 %a, [a];
  red.global.add.u32 [%a], 1;
  atom.global.add.u32 %t, [%a+4], 1;
  ret;""", ".param .u64 a")
    a = np.zeros(2, np.uint32)
    launch(ptx, "k", (16, 1, 1), (64, 1, 1), [a])
    assert list(a) == [1024, 1024]


def test_bad_ordering_model_inputs():
    with pytest.raises(InterpError, match="2\\^24 CTAs"):
        launch(module("  ret;", ""), "k", (1 << 24, 1, 1), (1, 1, 1), [])


# Each CTA adds its share into a total (an atomic), releases, counts in; the CTA that completes
# the count takes the total and resets it (argmax's cross-CTA merge). The data are atomics, so
# no access races: only the interleaving can show a CTA taking the total too early.
TAKE_TOTAL = """
  .reg .b32 %c, %n, %old, %v;
  .reg .b64 %s, %o;
  .reg .pred %p;
  ld.param.u64 %s, [state];
  ld.param.u64 %o, [out];
  mov.u32 %c, %ctaid.x;
  mov.u32 %n, %nctaid.x;
  mov.u32 %v, %tid.x;
  setp.ne.u32 %p, %v, 0;
  @%p bra DONE;
  add.u32 %v, %c, 1;
  atom.global.add.u32 %old, [%s], %v;
  {release}
  {count} %old, [%s+4], 1;
  sub.u32 %v, %n, {last};
  setp.ne.u32 %p, %old, %v;
  @%p bra DONE;
  membar.gl;
  atom.global.exch.b32 %v, [%s], 0;
  st.relaxed.gpu.global.u32 [%s+4], 0;
  st.global.u32 [%o], %v;
DONE:
  ret;"""


def take_total(seed, grid, *args, **change):
    ptx = module(TAKE_TOTAL.format(**{"release": "membar.gl;", "count": "atom.global.add.u32", "last": 1, **change}),
                 ".param .u64 state, .param .u64 out")
    launch(ptx, "k", grid, (64, 1, 1), list(args), seed=seed)


@pytest.mark.parametrize("ctas", [3, 8])
def test_a_cta_that_counts_in_too_early_misses_later_ctas(ctas):
    """CTAs of a cohort run in lockstep, so every CTA's add landed before any CTA counted in, and
    "the second-to-last CTA takes the total" passed. The scheduler holds back the CTA landing last
    at an atomic of several CTAs (_Cohorts.hold_back): the early taker misses its share. (With 2
    CTAs, often one a cohort, only the cohorts' random quanta can show it.)"""
    want = ctas * (ctas + 1) // 2
    for seed in SEEDS:
        for last in (1, 2):
            state, out = np.zeros(2, np.uint32), np.zeros(1, np.uint32)
            try:
                take_total(seed, (ctas, 1, 1), state, out, last=last)
            except SanitizerError as err:    # (two CTAs taking it with 2 CTAs: both store out)
                assert last == 2 and "overwrites out[0]" in str(err), err
                continue
            assert (out[0] == want and not state.any()) == (last == 1), (seed, last, out, state)


@pytest.mark.parametrize("load", ["ld.global.nc.u32", "ldu.global.u32"])
def test_a_write_to_bytes_a_non_coherent_load_read_earlier(load):
    """.nc needs its bytes read-only for the whole kernel: a write after the read (in another
    interleaving, before it) is a finding naming both instructions, whichever CTA wrote."""
    body = """
  .reg .b32 %c, %n, %v;
  .reg .b64 %a, %off;
  ld.param.u64 %a, [a];
  mov.u32 %c, %ctaid.x;
  mov.u32 %n, %nctaid.x;
  mul.wide.u32 %off, %c, 4;
  add.s64 %off, %a, %off;
  {load} %v, [%off];
  add.u32 %c, %c, 1;
  rem.u32 %c, %c, %n;
  mul.wide.u32 %off, %c, 4;
  add.s64 %off, %a, %off;
  add.u32 %v, %v, 1;
  st.global.u32 [%off], %v;
  ret;"""
    for seed in SEEDS:      # (a plain load: the write after another CTA's read is unordered too)
        with pytest.raises(SanitizerError, match=r"^k: line 21: `st.global.u32 \[%off\], %v;`: global-memory race: "
                           r"overwrites a\[\d\], which CTA \(\d,0,0\) read \(line 15 `ld.global.u32 %v, "
                           r"\[%off\];` by thread \(0,0,0\)\) earlier in this launch"):
            launch(module(body.format(load="ld.global.u32"), ".param .u64 a"), "k", (4, 1, 1), (1, 1, 1),
                   [np.zeros(4, np.uint32)], seed=seed)
    for seed in SEEDS:
        with pytest.raises(SanitizerError, match=r"^k: line 21: `st.global.u32 \[%off\], %v;`: write to a\[\d\], "
                           rf"which a non-coherent load \(line 15 `{load} %v, \[%off\];`\) read earlier in this "
                           r"launch: .* \[CTA \(\d,0,0\), thread \(0,0,0\)\]$"):
            launch(module(body.format(load=load), ".param .u64 a"), "k", (4, 1, 1), (1, 1, 1),
                   [np.zeros(4, np.uint32)], seed=seed)


@pytest.mark.parametrize("ctas", [8, 13])
def test_an_atomic_that_no_release_puts_before_the_count(ctas):
    """All the accesses are atomics (no data race), but without a release between a CTA's add to
    the total and its count, the CTA that completes the count need not see that add: in coherence
    order it may come after the exchange. A finding naming both of that CTA's atomics, once the
    CTA completing the count added early (the scheduler's hold_back makes that happen with two
    CTAs or more counting in lockstep; 3 CTAs, at most 2 in a cohort, leave no such pair)."""
    for change in (dict(), dict(release="", count="atom.release.gpu.global.add.u32"),
                   dict(release="fence.acq_rel.gpu;", count="atom.relaxed.gpu.global.add.u32")):
        for seed in SEEDS:
            state, out = np.zeros(2, np.uint32), np.zeros(1, np.uint32)
            take_total(seed, (ctas, 1, 1), state, out, **change)
            assert out[0] == ctas * (ctas + 1) // 2 and not state.any()
    for count in ("atom.global.add.u32", "atom.acquire.gpu.global.add.u32"):
        for seed in SEEDS:
            with pytest.raises(SanitizerError, match=(
                    r"^k: line 26: `atom.global.exch.b32 %v, \[%s\], 0;`: global-memory ordering: atomically "
                    r"updates state\[0\], relying on CTA \(\d+,0,0\)'s update of it \(line 19 `atom.global.add.u32 "
                    rf"%old, \[%s\], %v;` by thread \(0,0,0\)\) coming first, as this CTA observed a later write "
                    rf"of that thread \(line 21 `{count} %old, \[%s\+4\], 1;`\); .* is missing\) "
                    r"\[CTA \(\d+,0,0\), thread \(0,0,0\)\]$")):
                take_total(seed, (ctas, 1, 1), np.zeros(2, np.uint32), np.zeros(1, np.uint32), release="", count=count)


# ---- write-after-read across CTAs: CTA 0's readers read data[tid % 32], thread 0 raises the
# flag; CTA 1's first warp waits for the flag and overwrites data[tid]. CTA 0 first writes
# data[32] (`first`): reads are tracked in arrays written in the launch, and from the launch's
# start in those it was told the kernel may write (`written`).
WAR = """
  .reg .b32 %c, %t, %v, %g;
  .reg .b64 %d, %f, %o, %off;
  .reg .pred %p, %reader;
  ld.param.u64 %d, [data];
  ld.param.u64 %f, [flag];
  ld.param.u64 %o, [out];
  mov.u32 %c, %ctaid.x;
  mov.u32 %t, %tid.x;
  setp.ne.u32 %p, %c, 0;
  @%p bra WRITER;
  setp.eq.u32 %p, %t, 0;
  {first}
  {readers}
  and.b32 %v, %t, 31;
  mul.wide.u32 %off, %v, 4;
  add.s64 %d, %d, %off;
  mov.u32 %v, 0;
  @%reader {load} %v, [%d];   // READ
  mul.wide.u32 %off, %t, 4;
  add.s64 %o, %o, %off;
  st.global.u32 [%o], %v;
  {between}
  setp.ne.u32 %p, %t, 0;
  @%p bra DONE;
  {publish}
DONE:
  {done}
  ret;
WRITER:
  {wait}
  setp.eq.u32 %p, %g, 0;
  @%p bra WRITER;
  {after}
  setp.ge.u32 %p, %t, 32;
  @%p bra FINISHED;
  mul.wide.u32 %off, %t, 4;
  add.s64 %d, %d, %off;
  mov.u32 %v, 99;
  {store} [%d], %v;   // WRITE
FINISHED:
  ret;
"""
ALL = "setp.lt.u32 %reader, %t, 64;"
RELEASED = dict(publish="fence.acq_rel.gpu; st.relaxed.gpu.global.u32 [%f], 1;",
                wait="ld.acquire.gpu.global.u32 %g, [%f];")
UNORDERED = dict(publish="st.relaxed.gpu.global.u32 [%f], 1;", wait="ld.relaxed.gpu.global.u32 %g, [%f];")


FIRST = "@%p st.global.u32 [%d+128], %t;"


def war(readers=ALL, between="", after="", done="", load="ld.global.u32", store="st.global.u32", seed=0, sanitize=True,
        first=FIRST, written=None, **flags):
    """CTA 0's out (what its readers read: data as the host gave it, 0 for threads that did not
    read) and data after the launch."""
    ptx = module(WAR.format(readers=readers, between=between, after=after, done=done, load=load, store=store,
                            first=first, **{**RELEASED, **flags}),
                 ".param .u64 data, .param .u64 flag, .param .u64 out")
    data, out = np.arange(33, dtype=np.uint32) + 1, np.zeros(64, np.uint32)
    launch(ptx, "k", (2, 1, 1), (64, 1, 1), [data, np.zeros(1, np.uint32), out], seed=seed, sanitize=sanitize,
           kernel_name="war", written=written)
    return out, data


def war_line(marker):
    return next(i + 1 for i, text in enumerate(module(WAR, "").splitlines()) if marker in text)


@pytest.mark.parametrize("readers, between, publish", [
    (ALL, "bar.sync 0;", RELEASED["publish"]),
    (THREAD0.replace("%writer", "%reader"), "", RELEASED["publish"]),
    (THREAD0.replace("%writer", "%reader"), "", "st.release.gpu.global.u32 [%f], 1;"),
    (WARP1.replace("%writer", "%reader"), "bar.sync 0;", "st.release.gpu.global.u32 [%f], 1;"),
], ids=["bar.sync-then-thread-0-releases", "thread-0-releases-its-own-read", "st.release-after-its-own-read",
        "bar.sync-then-st.release"])
def test_a_write_after_a_released_and_acquired_read_passes(readers, between, publish):
    for seed in SEEDS:
        out, data = war(readers, between, publish=publish, seed=seed)
        read = np.tile(np.arange(32, dtype=np.uint32) + 1, 2)
        want = np.where([eval_reader(readers, t) for t in range(64)], read, 0)
        np.testing.assert_array_equal(out, want)
        np.testing.assert_array_equal(data[:32], 99)


def eval_reader(readers, t):
    return {ALL: True, THREAD0.replace("%writer", "%reader"): t == 0}.get(readers, t >= 32)


def test_a_write_after_another_ctas_read_with_nothing_ordering_them():
    """CTA 1 overwrites data CTA 0 read, after a relaxed flag: lockstep ran the read first, but
    on a GPU the write may land first and the read see 99. The finding names both instructions
    and threads; with the sanitizer off values are left alone."""
    for seed in SEEDS:
        with pytest.raises(SanitizerError) as err:
            war(seed=seed, **UNORDERED)
        msg = str(err.value)
        assert re.match(rf"war: line {war_line('// WRITE')}: `st.global.u32 \[%d\], %v;`: global-memory race: "
                        rf"overwrites data\[(\d+)\], which CTA \(0,0,0\) read \(line {war_line('// READ')} "
                        r"`@%reader ld.global.u32 %v, \[%d\];` by thread \((\d+),0,0\)\) earlier in this launch, "
                        r"with nothing ordering that read before this write .* the reader has not released since "
                        r"its read .*\[CTA \(1,0,0\), thread \((\d+),0,0\)\]$", msg), msg
        element, reader, writer = (int(x) for x in re.findall(r"data\[(\d+)\].*by thread \((\d+),.*thread \((\d+),",
                                                              msg)[0])
        assert element == writer and reader % 32 == element, msg
    out, data = war(sanitize=False, **UNORDERED)
    np.testing.assert_array_equal(out, np.tile(np.arange(32, dtype=np.uint32) + 1, 2))   # (as lockstep ran)


def test_a_write_after_a_release_the_writer_never_acquired():
    with pytest.raises(SanitizerError, match=r"overwrites data\[\d+\], which CTA \(0,0,0\) read .* the reader "
                       r"released after its read, but this thread never acquired that release"):
        war(between="bar.sync 0;", wait="ld.relaxed.gpu.global.u32 %g, [%f];")


def test_strong_reads_and_writes_across_ctas_do_not_race():
    for seed in SEEDS[:2]:
        out, data = war(load="ld.relaxed.gpu.global.u32", store="st.relaxed.gpu.global.u32", seed=seed, **UNORDERED)
        np.testing.assert_array_equal(data[:32], 99)


@pytest.mark.parametrize("after", ["", "bar.sync 0;"], ids=["no-bar.sync", "bar.sync-after-the-release"])
def test_a_release_does_not_cover_another_threads_read_without_a_bar_sync_before_it(after):
    """Warp 1 reads, thread 0 fences and raises the flag: no bar.sync puts warp 1's reads before
    the release, so CTA 1's acquire does not order them before its writes."""
    for seed in SEEDS:
        with pytest.raises(SanitizerError) as err:
            war(WARP1.replace("%writer", "%reader"), done=after, seed=seed)
        assert re.search(r"overwrites data\[\d+\], which CTA \(0,0,0\) read \(line \d+ `@%reader ld\.global\.u32 "
                         r"%v, \[%d\];` by thread \((3[2-9]|[4-6]\d),0,0\)\) .*the release of CTA \(0,0,0\) it "
                         r"acquired \(line \d+ `fence\.acq_rel\.gpu;[^`]*` by thread \(0,0,0\)\) does not "
                         r"cover that read", str(err.value)), str(err.value)


# ---- write-after-read of an in-out array before its first write in the launch (a residual
# read, then rewritten in place): the launch says which arrays the kernel may write.
IN_OUT = frozenset({"data", "flag", "out"})


@pytest.mark.parametrize("written", [IN_OUT, None], ids=["told", "any-array"])
def test_a_write_after_a_read_before_the_arrays_first_write(written):
    """No write precedes CTA 0's reads of data: CTA 1 overwriting them after a relaxed flag is a
    finding naming both, as it is once data was written; with release/acquire, none."""
    for seed in SEEDS:
        with pytest.raises(SanitizerError) as err:
            war(first="", written=written, seed=seed, **UNORDERED)
        assert re.search(rf"line {war_line('// WRITE')}: .*overwrites data\[\d+\], which CTA \(0,0,0\) read "
                         rf"\(line {war_line('// READ')} `@%reader ld.global.u32 %v, \[%d\];` by thread "
                         r"\(\d+,0,0\)\) earlier in this launch, .*the reader has not released since its read "
                         r".*\[CTA \(1,0,0\), thread \(\d+,0,0\)\]$", str(err.value)), str(err.value)
        out, data = war(first="", between="bar.sync 0;", written=written, seed=seed)
        np.testing.assert_array_equal(data[:32], 99)
        np.testing.assert_array_equal(out, np.tile(np.arange(32, dtype=np.uint32) + 1, 2))


def test_an_array_the_launch_is_told_is_only_read_is_not_tracked(monkeypatch):
    """Told data is an input, the launch records none of its reads (weights and inputs cost
    nothing), so only CTA 1's first write starts tracking it; an array read only strongly (the
    flag) or only written (out) gets no read records either."""
    made = []

    class Kept(launch_module.Ordering):
        def __init__(self, *args):
            super().__init__(*args)
            made.append(self)

    monkeypatch.setattr(launch_module, "Ordering", Kept)
    war(first="", written=frozenset({"flag", "out"}), **UNORDERED)     # (a race the launch was not told of)
    assert made[-1].reads == {}
    war(first="", between="bar.sync 0;", written=IN_OUT)
    assert list(made[-1].reads) == [0], "only data's reads are recorded"


BYTEWISE = """
  .reg .b32 %c, %t, %v, %g;
  .reg .b64 %d, %f;
  .reg .pred %p;
  ld.param.u64 %d, [data];
  ld.param.u64 %f, [flag];
  mov.u32 %c, %ctaid.x;
  mov.u32 %t, %tid.x;
  setp.ne.u32 %p, %t, 0;
  @%p bra DONE;
  setp.ne.u32 %p, %c, 0;
  @%p bra SECOND;
  st.global.u32 [%d+64], %t;
  ld.global.u8 %v, [%d+1];   // READ
  st.relaxed.gpu.global.u32 [%f], 1;
  bra DONE;
SECOND:
  ld.relaxed.gpu.global.u32 %g, [%f];
  setp.eq.u32 %p, %g, 0;
  @%p bra SECOND;
  ld.global.u32 %v, [%d];
  add.u32 %v, %v, 1;
  st.global.u32 [%d], %v;   // WRITE
DONE:
  ret;
"""


def test_a_wider_read_keeps_each_bytes_other_reader():
    """CTA 0 reads byte 1 of a word, CTA 1 (after a relaxed flag) reads the whole word and then
    rewrites it: CTA 1's read replaces CTA 0's as byte 1's newest, which must stay its other
    CTA's read although byte 0 had none."""
    ptx = module(BYTEWISE, ".param .u64 data, .param .u64 flag")
    line = next(i + 1 for i, text in enumerate(ptx.splitlines()) if "// READ" in text)
    for seed in SEEDS:
        with pytest.raises(SanitizerError, match=rf"overwrites data\[1\], which CTA \(0,0,0\) read \(line {line} "):
            launch(ptx, "k", (2, 1, 1), (32, 1, 1), [np.zeros(128, np.uint8), np.zeros(1, np.uint32)], seed=seed,
                   kernel_name="bytes")
