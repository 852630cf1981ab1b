"""Planted-bug kernels the sanitizer must catch, each beside a clean twin that must pass.

The offending instruction carries a `// BUG` comment; each test checks that the message
names the kernel, that line (number and text), the CTA and the first offending thread."""
import importlib
import re

import numpy as np
import pytest

from ptxgen.errors import SanitizerError
from ptxgen.interp import launch
from interp_helpers import module

PROLOGUE = """
  .reg .b32 %lin, %s, %slot, %next, %v, %w, %r<4>;
  .reg .b64 %out, %a, %off;
  .reg .f32 %f<4>;
  .reg .pred %p, %q;
  ld.param.u64 %out, [out];
  mov.u32 %lin, %tid.x;
"""


def ptx_of(body, prelude=""):
    return module(PROLOGUE + body + "\n  ret;", ".param .u64 out", prelude=prelude)


def expect(body, what, cta, thread, args=None, block=(64, 1, 1), grid=(2, 1, 1), **kw):
    ptx = ptx_of(body)
    lines = ptx.splitlines()
    line = next(i + 1 for i, text in enumerate(lines) if "// BUG" in text)
    with pytest.raises(SanitizerError) as err:
        launch(ptx, "k", grid, block, args or [np.zeros(1024, np.float32)], kernel_name="planted", **kw)
    msg = str(err.value)
    assert msg.startswith(f"planted: line {line}: `{lines[line - 1].split('//')[0].strip()}`"), msg
    assert re.search(what, msg), msg
    assert f"CTA ({cta[0]},{cta[1]},{cta[2]})" in msg, msg
    assert f"thread ({thread[0]},{thread[1]},{thread[2]})" in msg, msg
    return msg


def clean(body, args=None, block=(64, 1, 1), grid=(2, 1, 1), **kw):
    launch(ptx_of(body.replace("// BUG", "")), "k", grid, block,
           args or [np.zeros(1024, np.float32)], **kw)


# Thread t stores {value} to word t % 32 of a shared array: threads t and t + 32 (two warps) store
# to the same word; then every thread reads its word back.
SHARED_SAME_WORD = """
  .shared .align 4 .b32 words[32];
  mov.u32 %s, words;
  and.b32 %slot, %lin, 31;
  shl.b32 %slot, %slot, 2;
  add.u32 %slot, %s, %slot;
  {first}
  st.shared.u32 [%slot], {value};  // BUG
  bar.sync 0;
  ld.shared.u32 %v, [%slot];
"""


def test_two_warps_storing_different_values_to_a_word_race():
    """Write-after-write: in one instruction, or in two with no barrier between; the same value
    stored twice is no race (nothing can tell the orders apart; racecheck agrees)."""
    expect(SHARED_SAME_WORD.format(first="", value="%lin"),
           r"shared-memory race: overwrites shared byte 10\d\d \(words\+\d+\) which thread \(\d+,0,0\) writes in "
           r"the same instruction", (0, 0, 0), (0, 0, 0))
    staggered = SHARED_SAME_WORD.format(first="setp.lt.u32 %p, %lin, 32;\n  @%p st.shared.u32 [%slot], 7;",
                                        value="%lin")
    expect(staggered.replace("@%p st.shared.u32 [%slot], 7;", "@%p bra SKIP;\n  st.shared.u32 [%slot], 7;\nSKIP:")
           .replace("st.shared.u32 [%slot], %lin;  // BUG", "@%p st.shared.u32 [%slot], %lin;  // BUG"),
           r"shared-memory race: overwrites shared byte \d+ \(words\+\d+\) written by thread \(\d+,0,0\) with no "
           r"barrier in between \(write-after-write\)", (0, 0, 0), (0, 0, 0))
    clean(SHARED_SAME_WORD.format(first="", value="7"))
    clean(SHARED_SAME_WORD.format(first="", value="%lin").replace("st.shared.u32 [%slot], %lin;",
                                                                   "setp.lt.u32 %p, %lin, 32;\n  @%p st.shared.u32 [%slot], %lin;"))


def test_atomics_and_plain_accesses_of_one_shared_word_race():
    counter = """
  .shared .align 4 .b32 count;
  setp.eq.u32 %q, %lin, 0;
  @%q st.shared.u32 [count], 0;
  bar.sync 0;
  {before}
  atom.shared.add.u32 %v, [count], 1;  {bug}
  {after}
  bar.sync 0;
  ld.shared.u32 %v, [count];
"""
    clean(counter.format(before="", bug="", after=""))          # atomics alone: ordered among themselves
    expect(counter.format(before="setp.eq.u32 %p, %lin, 33;\n  @%p bra SKIP;", bug="",
                          after="SKIP:\n  @%p st.shared.u32 [count], 5;  // BUG"),
           r"overwrites shared byte \d+ \(count\+0\) written by thread \(\d+,0,0\) with no barrier", (0, 0, 0),
           (33, 0, 0))
    expect(counter.format(before="setp.eq.u32 %p, %lin, 32;\n  @%p ld.shared.u32 %w, [count];\n  @%p bra SKIP;",
                          bug="// BUG", after="SKIP:"),
           r"overwrites shared byte \d+ \(count\+0\) which thread \(32,0,0\) read with no barrier", (0, 0, 0),
           (0, 0, 0))


def test_a_read_of_unwritten_local_memory():
    body = """
  .local .align 4 .b32 scratch[4];
  st.local.u32 [scratch], %lin;
  {more}
  ld.local.u32 %v, [scratch+4];  // BUG
"""
    expect(body.format(more=""), r"read of local byte 4, which this thread has not written \(local memory starts "
                                 r"undefined\)", (0, 0, 0), (0, 0, 0))
    clean(body.format(more="st.local.u32 [scratch+4], %lin;"))


SHARED_NEIGHBOUR = """
  .shared .align 4 .b32 slots[64];
  mov.u32 %s, slots;
  shl.b32 %slot, %lin, 2;
  add.u32 %slot, %s, %slot;
  add.u32 %next, %lin, 1;
  and.b32 %next, %next, 63;
  shl.b32 %next, %next, 2;
  add.u32 %next, %s, %next;
  st.shared.u32 [%slot], %lin;
  {barrier}
  ld.shared.u32 %v, [%next];
"""


def test_missing_barrier_between_write_and_other_threads_read():
    bug = SHARED_NEIGHBOUR.replace("{barrier}", "").replace("ld.shared.u32 %v, [%next];",
                                                              "ld.shared.u32 %v, [%next];  // BUG")
    msg = expect(bug, r"shared-memory race: reads shared byte 1028 \(slots\+4\) written by thread "
                      r"\(1,0,0\)", (0, 0, 0), (0, 0, 0))
    assert "no barrier" in msg
    clean(SHARED_NEIGHBOUR.replace("{barrier}", "bar.sync 0;"))


def test_unsanitized_run_skips_race_checks():
    bug = SHARED_NEIGHBOUR.replace("{barrier}", "")
    launch(ptx_of(bug), "k", (2, 1, 1), (64, 1, 1), [np.zeros(4, np.float32)], sanitize=False)


BYTES_OF_A_WORD = """
  .shared .align 4 .b8 word[64];
  mov.u32 %s, word;
  add.u32 %slot, %s, %lin;
  st.shared.u8 [%slot], %lin;          // thread t writes byte t only: no conflict
  {barrier}
  and.b32 %next, %lin, 60;
  add.u32 %next, %s, %next;
  ld.shared.u32 %v, [%next];  // BUG
"""


def test_races_are_tracked_per_byte():
    expect(BYTES_OF_A_WORD.replace("{barrier}", ""), r"reads shared byte 1025 \(word\+1\) written by "
           r"thread \(1,0,0\)", (0, 0, 0), (0, 0, 0), grid=(1, 1, 1))
    clean(BYTES_OF_A_WORD.replace("{barrier}", "bar.sync 0;"), grid=(1, 1, 1))


CLOBBER = SHARED_NEIGHBOUR.replace("{barrier}", "bar.sync 0;") + """
  add.u32 %v, %v, %v;
  {barrier}
  st.shared.u32 [%slot], %v;  // BUG
  bar.sync 0;
"""


def test_write_after_read_clobber():
    expect(CLOBBER.replace("{barrier}", ""),
           r"overwrites shared byte 1024 \(slots\+0\) which thread \(63,0,0\) read .*write-after-read",
           (0, 0, 0), (0, 0, 0))
    clean(CLOBBER.replace("{barrier}", "bar.sync 0;"))


def test_broadcast_read_is_not_a_race():
    clean("""
  .shared .align 4 .b32 cell;
  mov.u32 %s, cell;
  setp.eq.u32 %p, %lin, 0;
  @%p st.shared.u32 [%s], %lin;
  bar.sync 0;
  ld.shared.u32 %v, [%s];
  ld.shared.u32 %w, [%s];
""")


GLOBAL_READ = """
  mul.wide.u32 %off, %lin, 4;
  add.s64 %a, %out, %off;
  ld.global.f32 %f0, [%a];  // BUG
"""


def test_out_of_bounds_global_read():
    msg = expect(GLOBAL_READ, r"out-of-bounds 4-byte global access: address 0x[0-9a-f]+ is outside "
                              r"every array", (0, 0, 0), (31, 0, 0),
                 args=[np.zeros(31, np.float32)], block=(32, 1, 1), grid=(1, 1, 1))
    assert "byte 124 of out, which holds 124 (out at [" in msg, msg  # thread 31's 4 bytes just past the end
    clean(GLOBAL_READ, args=[np.zeros(32, np.float32)], block=(32, 1, 1), grid=(1, 1, 1))


def test_a_vector_load_that_runs_past_the_end_of_its_array():
    """Thread 31's 16 bytes start at the array's last 8 (504 of 504 + 8): still out of bounds."""
    body = VECTOR_LOAD.replace("{offset}", "0")
    expect(body, r"out-of-bounds 16-byte global access: address 0x[0-9a-f]+ is outside every array",
           (0, 0, 0), (31, 0, 0), args=[np.zeros(126, np.float32)], block=(32, 1, 1), grid=(1, 1, 1))
    clean(body, args=[np.zeros(128, np.float32)], block=(32, 1, 1), grid=(1, 1, 1))


def test_a_shared_vector_load_that_runs_past_the_end_of_shared_memory():
    """8 bytes from byte 16 of 20: the first 4 are shared memory's last, the rest past its end."""
    body = """
  .shared .align 8 .b8 buf[20];
  mov.u32 %s, buf;
  st.shared.v2.u32 [%s+8], {%lin, %lin};
  st.shared.u32 [%s+16], %lin;
  ld.shared.v2.u32 {%v, %w}, [%s+16];  // BUG
"""
    expect(body, r"out-of-bounds 8-byte shared access at address 0x410 \(shared memory is \[0x400, 0x414\)\)",
           (0, 0, 0), (0, 0, 0), block=(1, 1, 1), grid=(1, 1, 1))
    clean(body.replace("[%s+16];", "[%s+8];"), block=(1, 1, 1), grid=(1, 1, 1))

VECTOR_LOAD = """
  mul.wide.u32 %off, %lin, 16;
  add.s64 %a, %out, %off;
  ld.global.v4.f32 {%f0, %f1, %f2, %f3}, [%a+{offset}];  // BUG
"""


def test_misaligned_vector_load():
    expect(VECTOR_LOAD.replace("{offset}", "8"), r"misaligned 16-byte global access .*16-byte alignment",
           (0, 0, 0), (0, 0, 0), args=[np.zeros(600, np.float32)], block=(32, 1, 1))
    clean(VECTOR_LOAD.replace("{offset}", "16"), args=[np.zeros(600, np.float32)], block=(32, 1, 1))


def test_shared_out_of_range_and_misaligned():
    body = """
  .shared .align 4 .b32 buf[16];
  mov.u32 %s, buf;
  shl.b32 %r0, %lin, 2;
  add.u32 %r0, %s, %r0;
  st.shared.u32 [%r0], %lin;  // BUG
"""
    expect(body, r"out-of-bounds 4-byte shared access at address 0x440 \(shared memory is \[0x400, 0x440\)\)",
           (0, 0, 0), (16, 0, 0))
    clean(body, block=(16, 1, 1))
    expect(body.replace("[%r0]", "[%r0+2]"), "misaligned 4-byte shared access", (0, 0, 0), (0, 0, 0),
           block=(16, 1, 1))


EARLY_EXIT = """
  setp.ge.u32 %p, %lin, 48;
  @%p {leave};
  bar.sync 0;  // BUG
SKIP:
"""


def test_exit_before_barrier_by_some_threads():
    expect(EARLY_EXIT.replace("{leave}", "ret"), r"divergent barrier: 16 threads of this CTA already "
                                                 "exited", (0, 0, 0), (0, 0, 0))
    clean(EARLY_EXIT.replace("{leave}", "bra SKIP").replace("bar.sync 0;  // BUG\nSKIP:", "SKIP:\n  bar.sync 0;"))


DIVERGENT_BARRIER = """
  setp.ge.u32 %p, %lin, 32;
  @%p bra ELSE;
  bar.sync 0;
  bra END;
ELSE:
  bar.sync 0;  // BUG
END:
"""


def test_barrier_inside_divergent_branch():
    expect(DIVERGENT_BARRIER, r"divergent barrier: other threads of this CTA wait at the "
                                    r"bar.sync on line \d+", (0, 0, 0), (32, 0, 0))
    clean("""
  setp.ge.u32 %p, %lin, 32;
  @%p bra ELSE;
  mov.u32 %v, 1;
  bra END;
ELSE:
  mov.u32 %v, 2;
END:
  bar.sync 0;
""")


def test_a_uniform_branch_that_diverges_within_a_warp():
    """bra.uni promises the guard is the same for a warp's threads: lane 5 going its own way is a
    finding; a guard that differs only between warps is what .uni is for."""
    expect("""
  and.b32 %v, %lin, 31;
  setp.eq.u32 %p, %v, 5;
  @%p bra.uni SKIP;  // BUG
  mov.u32 %v, 1;
SKIP:
""", r"bra.uni whose guard differs between threads of a warp", (0, 0, 0), (5, 0, 0))
    clean("""
  setp.ge.u32 %p, %lin, 32;
  @%p bra.uni SKIP;
  mov.u32 %v, 1;
SKIP:
""")


def test_one_sided_barrier_with_exiting_threads():
    expect("""
  setp.ge.u32 %p, %lin, 32;
  @%p bra SKIP;
  bar.sync 0;
SKIP:
  ret;  // BUG
""", r"thread exits while other threads of its CTA wait at bar.sync on line \d+", (0, 0, 0), (32, 0, 0))


@pytest.mark.parametrize("body, message", [
    ("  bar.sync 0, 48;  // BUG", r"barrier thread count 48: expected a multiple of 32 up to the CTA's 64 threads"),
    ("  bar.sync 0, 128;  // BUG", r"barrier thread count 128: expected a multiple of 32 up to the CTA's 64 threads"),
    ("  bar.sync 16;  // BUG", r"barrier id 16: expected 0\.\.15"),
    ("  setp.lt.u32 %p, %lin, 32;\n  @%p bra LOW;\n  bar.sync 1, 64;\n  bra.uni END;\nLOW:\n  bar.sync 1, 32;  // BUG\n"
     "END:", r"barrier 1: threads arrive with thread count 32, others with 64"),
])
def test_barrier_ids_and_thread_counts(body, message):
    expect(body, message, (0, 0, 0), (0, 0, 0), grid=(1, 1, 1))


# Named barriers in a CTA of 4 warps: warp w writes its slot, then the warps of a pair (0-1 on
# barrier 1, 2-3 on barrier 2) meet at {meet}, and each reads the slot of warp {partner}.
NAMED = """
  .shared .align 4 .b32 slots[128];
  mov.u32 %s, slots;
  shl.b32 %slot, %lin, 2;
  add.u32 %slot, %s, %slot;
  st.shared.u32 [%slot], %lin;
  shr.u32 %w, %lin, 6;
  add.u32 %w, %w, 1;
  {meet}
  xor.b32 %next, %lin, {partner};
  shl.b32 %next, %next, 2;
  add.u32 %next, %s, %next;
  ld.shared.u32 %v, [%next];  // BUG
  shl.b32 %slot, %lin, 2;
  cvt.u64.u32 %off, %slot;
  add.u64 %a, %out, %off;
  st.global.u32 [%a], %v;
"""


def named(meet, partner, seed=0):
    out = np.zeros(128, np.uint32)
    launch(ptx_of(NAMED.format(meet=meet, partner=partner).replace("// BUG", "")), "k", (1, 1, 1), (128, 1, 1),
           [out], seed=seed)
    return out


def test_named_barriers_order_the_threads_that_take_part():
    """bar.sync id, count with ids per warp pair; bar.arrive by a producer warp (it does not wait);
    barrier.sync (not aligned) reached at two instructions; bar.sync 0, 32 by every warp alone."""
    lanes = np.arange(128)
    np.testing.assert_array_equal(named("bar.sync %w, 64;", 32), lanes ^ 32)
    apart = ("setp.lt.u32 %p, %lin, 32;\n  @%p bra FIRST;\n  barrier.sync %w, 64;\n  bra.uni MET;\nFIRST:\n"
             "  barrier.sync %w, 64;\nMET:")
    np.testing.assert_array_equal(named(apart, 32), lanes ^ 32)
    np.testing.assert_array_equal(named("bar.sync 0, 32;", 1), lanes ^ 1)


# A tile of 32 words in shared memory, a slot a lane: warp 0 (the producer) goes on, the others
# (consumers) branch to CONSUMER.
TILE_SLOTS = """
  .shared .align 4 .b32 tile[32];
  mov.u32 %s, tile;
  and.b32 %slot, %lin, 31;
  shl.b32 %slot, %slot, 2;
  add.u32 %slot, %s, %slot;
  setp.ge.u32 %p, %lin, 32;
  @%p bra CONSUMER;
"""

# Warp 0 produces a tile and arrives at barrier 1 without waiting; warp 1 waits there, then reads.
PRODUCER_CONSUMER = TILE_SLOTS + """  mul.lo.u32 %v, %lin, 3;
  st.shared.u32 [%slot], %v;
  {produced}
  bra.uni END;
CONSUMER:
  {consume}
  ld.shared.u32 %v, [%slot];  // BUG
  sub.u32 %w, %lin, 32;
  mul.wide.u32 %off, %w, 4;
  add.u64 %a, %out, %off;
  st.global.u32 [%a], %v;
END:
"""


@pytest.mark.parametrize("threads", [64, 96])
def test_a_producer_warp_arrives_and_a_consumer_warp_waits(threads):
    """The producer arrives on a barrier counting the whole CTA and exits: the consumers' wait
    still completes (its arrival counted before it left)."""
    out = np.zeros(threads - 32, np.uint32)
    launch(ptx_of(PRODUCER_CONSUMER.format(produced=f"bar.arrive 1, {threads};", consume=f"bar.sync 1, {threads};")
                  .replace("// BUG", "")), "k", (1, 1, 1), (threads, 1, 1), [out])
    np.testing.assert_array_equal(out, np.arange(threads - 32) % 32 * 3)


def test_a_consumer_reading_the_producers_tile_without_its_barrier_races():
    expect(PRODUCER_CONSUMER.format(produced="", consume=""),
           r"shared-memory race: reads shared byte \d+ \(tile\+\d+\) written by thread \(\d+,0,0\) with no "
           r"barrier in between", (0, 0, 0), (32, 0, 0), args=[np.zeros(32, np.uint32)], grid=(1, 1, 1))


def test_a_thread_outside_a_named_barrier_is_not_ordered_by_it():
    """Warps 0 and 1 meet at barrier 1; warps 2 and 3 meet none, and read what warps 0 and 1 wrote."""
    expect(NAMED.format(meet="setp.lt.u32 %p, %lin, 64;\n  @%p bar.sync 1, 64;", partner=64),
           r"shared-memory race: reads shared byte \d+ \(slots\+\d+\) written by thread \(\d+,0,0\) with no "
           r"barrier in between", (0, 0, 0), (64, 0, 0), block=(128, 1, 1), grid=(1, 1, 1))


# Every warp writes its slot and all meet at bar.sync 0; then warps 2-3 write their slots again
# while warps 0-1 meet at barrier 1 only and read the slot of warp w + 2: no barrier orders the
# second writes with those reads, whichever comes first.
OUTSIDE_WRITER = """
  .shared .align 4 .b32 slots[128];
  mov.u32 %s, slots;
  shl.b32 %slot, %lin, 2;
  add.u32 %slot, %s, %slot;
  st.shared.u32 [%slot], %lin;
  bar.sync 0;
  setp.ge.u32 %p, %lin, 64;
  @%p bra WRITER;
  bar.sync 1, 64;
  ld.shared.u32 %v, [%slot+256];
  {freed}
  bra.uni END;
WRITER:
  add.u32 %v, %lin, 1;
  {wait}
  st.shared.u32 [%slot], %v;  // BUG
END:
"""


def test_a_writer_outside_a_named_barrier_is_not_ordered_with_its_readers():
    """The readers' barrier came after the writers' last one (a newer epoch), yet the writers
    did not take part in it."""
    expect(OUTSIDE_WRITER.format(freed="", wait=""),
           r"shared-memory race: overwrites shared byte 1280 \(slots\+256\) which thread \(0,0,0\) read with no "
           r"barrier in between \(write-after-read\)", (0, 0, 0), (64, 0, 0), block=(128, 1, 1), grid=(1, 1, 1))
    # the writers wait for the readers: ordered
    clean(OUTSIDE_WRITER.format(freed="bar.arrive 2, 128;", wait="bar.sync 2, 128;"), block=(128, 1, 1),
          grid=(1, 1, 1))


# Warp 0 fills a tile and hands it to warp 1 with bar.arrive 1; warp 1 waits at bar.sync 1 and
# reads it. {after}: what warp 0 does next.
ARRIVE_THEN_WRITE = TILE_SLOTS + """  st.shared.u32 [%slot], %lin;
  bar.arrive 1, 64;
  add.u32 %v, %lin, 7;
  {after}
  bra.uni END;
CONSUMER:
  bar.sync 1, 64;
  ld.shared.u32 %v, [%slot];  {bug}
  {free}
END:
"""


def test_a_producer_writing_after_its_bar_arrive_races_with_the_consumer():
    """bar.arrive orders the producer's accesses before it, not those after it: refilling the
    tile without waiting for the consumer to free it races with the consumer's reads."""
    expect(ARRIVE_THEN_WRITE.format(after="st.shared.u32 [%slot], %v;", bug="// BUG", free=""),
           r"shared-memory race: reads shared byte 1024 \(tile\+0\) written by thread \(0,0,0\) with no barrier "
           r"in between", (0, 0, 0), (32, 0, 0), grid=(1, 1, 1))
    clean(ARRIVE_THEN_WRITE.format(after="bar.sync 2, 64;\n  st.shared.u32 [%slot], %v;", bug="",
                                   free="bar.arrive 2, 64;"), grid=(1, 1, 1))
    # the consumer frees the tile before it reads it
    expect(ARRIVE_THEN_WRITE.format(after="bar.sync 2, 64;\n  st.shared.u32 [%slot], %v;", bug="// BUG",
                                    free="").replace("  bar.sync 1, 64;\n", "  bar.sync 1, 64;\n  bar.arrive 2, 64;\n"),
           r"shared-memory race: reads shared byte 1024 \(tile\+0\) written by thread \(0,0,0\) with no barrier "
           r"in between", (0, 0, 0), (32, 0, 0), grid=(1, 1, 1))


DIVERGENT_SHUFFLE = """
  setp.lt.u32 %p, %lin, 16;
  @%p bra SKIP;
  shfl.sync.down.b32 %v, %lin, 1, 0x1f, 0xffffffff;  // BUG
SKIP:
"""


def test_shuffle_in_divergent_code():
    expect(DIVERGENT_SHUFFLE, r"shfl.sync.down: lanes \[0, 1, .*15\] of member mask 0xffffffff are "
                              "not executing this instruction together", (0, 0, 0), (16, 0, 0),
           block=(32, 1, 1), grid=(1, 1, 1))
    clean(DIVERGENT_SHUFFLE.replace("0xffffffff", "0xffff0000"), block=(32, 1, 1), grid=(1, 1, 1))
    clean(DIVERGENT_SHUFFLE.replace("@%p bra SKIP;", ""), block=(32, 1, 1), grid=(1, 1, 1))


def test_collectives_need_their_lanes():
    expect("""
  setp.lt.u32 %p, %lin, 8;
  @%p vote.sync.ballot.b32 %v, %p, 0xffffffff;  // BUG
""", "vote.sync.ballot: lanes", (0, 0, 0), (0, 0, 0), block=(32, 1, 1), grid=(1, 1, 1))
    expect("""
  setp.lt.u32 %p, %lin, 8;
  @%p bar.warp.sync 0xff;
  @!%p bar.warp.sync 0xff;  // BUG
""", "executing lane 8 is not in its member mask 0x000000ff", (0, 0, 0), (8, 0, 0),
           block=(32, 1, 1), grid=(1, 1, 1))


UNWRITTEN = """
  setp.lt.u32 %p, %lin, 10;
  {init}
  @%p mov.u32 %v, 5;
  add.u32 %w, %v, 1;  // BUG
"""


def test_read_of_unwritten_register():
    expect(UNWRITTEN.replace("{init}", ""), r"read of register %v before this thread wrote it",
           (0, 0, 0), (10, 0, 0))
    expect("  add.u32 %w, %r3, 1;  // BUG", r"read of register %r3 which no thread has written",
           (0, 0, 0), (0, 0, 0))
    clean(UNWRITTEN.replace("{init}", "mov.u32 %v, 0;"))
    # predicated-off lanes do not read their operands
    clean(UNWRITTEN.replace("{init}", "").replace("add.u32 %w", "@%p add.u32 %w"))


def test_finding_names_cta_in_later_wave(monkeypatch):
    monkeypatch.setattr(importlib.import_module("ptxgen.interp.launch"), "MAX_WAVE_THREADS", 128)
    body = """
  mov.u32 %r0, %ctaid.y;
  setp.eq.u32 %p, %r0, 2;
  mov.u32 %r2, %ctaid.x;
  setp.eq.u32 %q, %r2, 1;
  and.pred %p, %p, %q;
  @%p ld.global.f32 %f0, [%out+4096];  // BUG
"""
    expect(body, "out-of-bounds", (1, 2, 0), (0, 0, 0), grid=(2, 3, 1))


DOUBLE_BUFFER = """
  .shared .align 16 .b8 stage[2048];
  mov.u32 %s, stage;
  shl.b32 %slot, %lin, 4;
  add.u32 %slot, %s, %slot;            // this thread's 16 bytes of buffer 0
  add.u32 %next, %lin, 1;
  and.b32 %next, %next, 63;
  shl.b32 %next, %next, 4;
  add.u32 %next, %s, %next;            // its neighbour's
  mul.wide.u32 %off, %lin, 16;
  add.s64 %a, %out, %off;
  cp.async.cg.shared.global [%slot], [%a], 16;
  cp.async.commit_group;
  mov.u32 %r0, 0;                      // tile; it sits in buffer tile & 1
LOOP:
  setp.lt.u32 %q, %r0, 3;
  and.b32 %r1, %r0, 1;
  shl.b32 %r1, %r1, 10;
  xor.b32 %r2, %r1, 1024;
  @!%q bra WAIT;
  add.s64 %a, %a, 1024;
  add.u32 %r3, %slot, %r2;
  cp.async.cg.shared.global [%r3], [%a], 16;
WAIT:
  cp.async.commit_group;
  cp.async.wait_group 1;               // this tile's group is done, the prefetch may not be
  bar.sync 0;                          // and so is everyone's
  add.u32 %r3, %next, %r1;
  ld.shared.u32 %v, [%r3];
  bar.sync 0;                          // all reads done before the buffer is refilled
  add.u32 %r0, %r0, 1;
  setp.lt.u32 %p, %r0, 4;
  @%p bra LOOP;
"""
NEIGHBOUR_READ = "ld.shared.u32 %v, [%r3];"
PENDING = (r"read of shared memory whose cp.async \(line {line}\) has not been waited for: shared "
           r"byte 1040 \(stage\+16\) is copied by thread \(1,0,0\) in its commit group 0, and its "
           r"cp.async waits have completed 0 group\(s\)")


def first_line(text, body):
    return next(i + 1 for i, t in enumerate(ptx_of(body).splitlines()) if text in t)


def test_double_buffered_cp_async_is_clean():
    clean(DOUBLE_BUFFER)
    clean(DOUBLE_BUFFER.replace("cp.async.wait_group 1;", "cp.async.wait_all;"))


def test_cp_async_wait_group_count_too_high():
    bug = DOUBLE_BUFFER.replace("cp.async.wait_group 1;", "cp.async.wait_group 2;").replace(
        NEIGHBOUR_READ, NEIGHBOUR_READ + "  // BUG")
    line = first_line("cp.async.cg", bug)
    expect(bug, PENDING.format(line=line), (0, 0, 0), (0, 0, 0))


def test_cp_async_never_waited_for():
    bug = DOUBLE_BUFFER.replace("cp.async.wait_group 1;", "").replace(
        NEIGHBOUR_READ, NEIGHBOUR_READ + "  // BUG")
    expect(bug, PENDING.format(line=first_line("cp.async.cg", bug)), (0, 0, 0), (0, 0, 0))


def test_a_cta_ending_with_a_cp_async_in_flight_is_caught():
    """Nothing reads the copy, but its CTA's shared memory is gone while it may still be landing."""
    bug = OVERWRITE_PENDING.replace("{wait}", "").replace("  st.shared.u32 [%slot+12], %lin;  // BUG\n", "")
    bug = bug.replace("  ld.shared.u32 %v, [%slot];\n", "  exit;  // BUG\n")
    expect(bug, r"the CTA ends while this thread's cp.async on line \d+ is in flight: neither waited for "
                r"\(cp.async.wait_group/wait_all\) nor handed to an mbarrier", (0, 0, 0), (0, 0, 0))
    clean(bug.replace("  exit;", "  cp.async.wait_all;\n  exit;"))


def test_cp_async_waited_for_but_no_barrier_before_other_threads_read():
    bug = DOUBLE_BUFFER.replace("bar.sync 0;                          // and so", "// and so").replace(
        NEIGHBOUR_READ, NEIGHBOUR_READ + "  // BUG")
    expect(bug, r"shared-memory race: reads shared byte 1040 \(stage\+16\) written by thread \(1,0,0\) "
                r"with no barrier in between", (0, 0, 0), (0, 0, 0))


def test_cp_async_refill_races_with_earlier_readers():
    bug = DOUBLE_BUFFER.replace("bar.sync 0;                          // all reads", "// all reads").replace(
        "[%r3], [%a], 16;", "[%r3], [%a], 16;  // BUG")
    expect(bug, r"overwrites shared byte 1024 \(stage\+0\) which thread \(63,0,0\) read with no "
                r"barrier in between \(write-after-read\)", (0, 0, 0), (0, 0, 0))


OVERWRITE_PENDING = """
  .shared .align 16 .b8 stage[1024];
  mov.u32 %s, stage;
  shl.b32 %slot, %lin, 4;
  add.u32 %slot, %s, %slot;
  mul.wide.u32 %off, %lin, 16;
  add.s64 %a, %out, %off;
  cp.async.ca.shared.global [%slot], [%a], 16;
  cp.async.commit_group;
  {wait}
  st.shared.u32 [%slot+12], %lin;  // BUG
  ld.shared.u32 %v, [%slot];
"""


def test_store_over_pending_cp_async():
    bug = OVERWRITE_PENDING.replace("{wait}", "")
    expect(bug, r"overwrite of shared memory whose cp.async \(line {}\) has not been waited for: "
                r"shared byte 1036 \(stage\+12\) is copied by thread \(0,0,0\) in its commit group 0"
                .format(first_line("cp.async.ca", bug)), (0, 0, 0), (0, 0, 0))
    clean(OVERWRITE_PENDING.replace("{wait}", "cp.async.wait_group 0;"))
    clean(OVERWRITE_PENDING.replace("{wait}", "cp.async.wait_all;").replace(
        "cp.async.commit_group;", ""))


def test_unsanitized_run_skips_cp_async_checks():
    bug = DOUBLE_BUFFER.replace("cp.async.wait_group 1;", "")
    launch(ptx_of(bug), "k", (2, 1, 1), (64, 1, 1), [np.zeros(1024, np.float32)], sanitize=False)


# ---- undefined values instead of silent zeros --------------------------------------------
UNINITIALISED = """
  .shared .align 4 .b32 slots[64];
  mov.u32 %s, slots;
  shl.b32 %slot, %lin, 2;
  add.u32 %slot, %s, %slot;
  setp.lt.u32 %p, %lin, 32;
  @%p st.shared.u32 [%slot], %lin;
  bar.sync 0;
  ld.shared.u32 %v, [%slot];  // BUG
"""


def test_read_of_never_written_shared_memory():
    expect(UNINITIALISED, r"read of shared byte 1152 \(slots\+128\), which no thread of this CTA has written "
                          r"\(shared memory starts undefined\)", (0, 0, 0), (32, 0, 0))
    clean(UNINITIALISED.replace("@%p st.shared", "st.shared"))
    # a byte of a word written is not the word written
    expect(UNINITIALISED.replace("st.shared.u32 [%slot], %lin;", "st.shared.u8 [%slot], %lin;").replace(
        "setp.lt.u32 %p, %lin, 32;", "setp.lt.u32 %p, %lin, 64;"), r"read of shared byte 1025 \(slots\+1\)",
           (0, 0, 0), (0, 0, 0))
    expect(UNINITIALISED.replace("ld.shared.u32 %v, [%slot];", "atom.shared.add.u32 %v, [%slot], 1;"),
           r"atomic update of shared byte 1152 \(slots\+128\), which no thread", (0, 0, 0), (32, 0, 0))


SHUFFLE_SOURCE = """
  setp.lt.u32 %p, %lin, 16;
  @%p shfl.sync.idx.b32 %v, %lin, 20, 0x1f, 0x0000ffff;  // BUG
"""


def test_shuffle_from_a_lane_outside_the_member_mask_or_inactive():
    expect(SHUFFLE_SOURCE, r"shfl.sync.idx: lane 0 reads lane 20, which is not in the member mask: "
                           "the value is undefined", (0, 0, 0), (0, 0, 0), block=(32, 1, 1), grid=(1, 1, 1))
    clean(SHUFFLE_SOURCE.replace(", 20,", ", 5,"), block=(32, 1, 1), grid=(1, 1, 1))
    # past the end of a partial warp (48 threads: lanes 16..31 of warp 1 do not exist)
    expect("  shfl.sync.bfly.b32 %v, %lin, 16, 0x1f, 0xffffffff;  // BUG",
           r"lane 0 reads lane 16, which does not execute this shfl", (0, 0, 0), (32, 0, 0),
           block=(48, 1, 1), grid=(1, 1, 1))
    # out of range (clamped, or past the segment) is defined: the lane's own value
    clean("  shfl.sync.down.b32 %v, %lin, 8, 0xf, 0xffffffff;", block=(48, 1, 1), grid=(1, 1, 1))


FLOAT_ATOMIC = """
  cvt.rn.f32.u32 %f0, %lin;
  mul.f32 %f0, %f0, {scale};
  atom.global.add.f32 %f1, [%out], %f0;  // BUG
"""


def test_order_dependent_float_atomics_when_determinism_is_asked():
    inexact = FLOAT_ATOMIC.format(scale="0f3DCCCCCD")      # lin * 0.1: the sum rounds
    expect(inexact, "float atomic add whose result depends on the order", (0, 0, 0), (0, 0, 0),
           deterministic=True)
    clean(inexact)                                              # not asked
    clean(FLOAT_ATOMIC.format(scale="0f3F000000"), deterministic=True)   # lin / 2: every sum exact
    clean(inexact.replace("[%out]", "[%a]").replace("  cvt.rn", "  mul.wide.u32 %off, %lin, 4;\n"
                                                     "  add.s64 %a, %out, %off;\n  cvt.rn"),
          deterministic=True, grid=(1, 1, 1))                  # one thread per element
