"""The GPU-free performance model (ptxgen/perf.py): occupancy by CUDA's rules, instruction and
round-trip counts from the interpreter, Little's law, and the report on small kernels whose
every number is worked out by hand below."""

import dataclasses
import json
import math
import re

import numpy as np
import pytest

from ptxgen import perf
from ptxgen.archs import ARCHS
from ptxgen.errors import PtxgenError
from ptxgen.interp import launch
from ptxgen.interp.parser import parse
from ptxgen.abi import Launch

from helpers import make_kernel

H100 = perf.GPUS["h100-sxm"]


# --- occupancy: cases worked out from the occupancy calculator's rules ------------------------
# registers: ceil(regs * 32 / 256) * 256 per warp, from each scheduler's 16384; shared: (bytes +
# 1 KB reserved) rounded up to 128 against the largest carve-out.

@pytest.mark.parametrize("arch, threads, registers, shared, ctas, limiter", [
    # gate_up_proj today (ncu: 2 CTAs by registers, 25%): 92 regs -> 3072 a warp, 5 warps a
    # quarter, 20 an SM, 2 CTAs of 8 warps.
    ("sm_90", 256, 92, 17408, 2, "registers"),
    # decode attention today (ncu: 3 CTAs by registers, 18.75%): 167 -> 5376, 3 a quarter, 12 warps.
    ("sm_90", 128, 167, 11268, 3, "registers"),
    # 255 registers: 8192 a warp, 2 a quarter, 8 warps an SM: one 256-thread CTA.
    ("sm_90", 256, 255, 0, 1, "registers"),
    # 1024 threads x 255 registers need 262144 registers: the CTA cannot launch at all.
    ("sm_90", 1024, 255, 0, 0, "registers"),
    # 96 registers: 3072 a warp, 5 a quarter: 20 one-warp CTAs, not the 21 of 65536 / 3072.
    ("sm_90", 32, 96, 0, 20, "registers"),
    # 100 KB each: 103424 with the reserve, two fit in 228 KB.
    ("sm_90", 256, 32, 100 * 1024, 2, "shared"),
    # 20000 B: 21120 with reserve and rounding, 4 in 100 KB (5 without them).
    ("sm_86", 64, 32, 20000, 4, "shared"),
    # 512 threads x 24 registers: registers allow 5 CTAs, warps 64 / 16 = 4.
    ("sm_80", 512, 24, 0, 4, "warps"),
    # one-warp CTAs: sm_86 holds 16 CTAs, sm_89 24, sm_90 32.
    ("sm_86", 32, 16, 0, 16, "ctas"),
    ("sm_89", 32, 16, 0, 24, "ctas"),
    ("sm_90", 32, 16, 0, 32, "ctas"),
])
def test_occupancy_follows_the_cuda_rules(arch, threads, registers, shared, ctas, limiter):
    result = perf.occupancy(ARCHS[arch], threads, registers, shared)
    warps = ctas * math.ceil(threads / 32)
    assert (result.ctas_per_sm, result.warps_per_sm, result.limiter) == (ctas, warps, limiter), result
    assert result.fraction == pytest.approx(warps / ARCHS[arch].max_warps_per_sm)


def test_occupancy_matches_nsight_compute_block_limits():
    # ncu-decode-kernels.txt, gate_up_proj on the H100: Block Limit Registers 2, Warps 8, SM 32.
    allowed = perf.occupancy(ARCHS["sm_90"], 256, 92, 17408).ctas_allowed
    assert (allowed["registers"], allowed["warps"], allowed["ctas"]) == (2, 8, 32)
    assert perf.occupancy(ARCHS["sm_90"], 128, 167, 11268).ctas_allowed["warps"] == 16
    assert perf.arch_limits("sm_90a") is ARCHS["sm_90"]


# sm_90's 1 KB reserve. From sm_90 on the kernel's .nv.shared section (perf's "shared_bytes", read
# from the cubin) starts with the 1 KB the driver reserves a CTA: a 16-byte array gives a
# 1040-byte section, a kernel with only dynamic shared a 1024-byte one (nvJitLink, sm_90 / sm_90a);
# sm_80-sm_89 sections hold the arrays alone. The driver reports the arrays alone
# (CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: 16 for decode attention's sm_90 cubin, section 1040, and 80
# for the sm_90a prefill's, section 1104, bench/results/H200-2026-11-28-lease) and the occupancy
# calculator adds reservedSharedMemPerBlock (1024) to that: 1040 + dynamic bytes a CTA, not 2064 +.

def test_an_sm90_cubins_section_holds_the_reserve_that_occupancy_adds_once():
    section = {"registers": 32, "shared_bytes": 1040}  # 16 declared bytes, on sm_90
    # 16 + 115000 + 1024 = 116040, 116096 in 128-byte units: 2 in 228 KB (counted twice: 117120, 1)
    launch = Launch((264, 1, 1), (128, 1, 1), dynamic_shared=115000)
    fit = perf.cubin_occupancy("sm_90", launch, section, cubin_arch="sm_90")
    assert (fit.ctas_per_sm, fit.limiter, fit.ctas_allowed["shared"]) == (2, "shared", 2), fit
    assert perf.occupancy_per_arch({"sm_90a": launch}, {"sm_90a": section})["sm_90a"].ctas_per_sm == 2
    # the largest CTA the driver launches: 16 static + 232432 dynamic = the 227 KB opt-in, plus the
    # reserve, 233472 = all of an SM's 228 KB: one CTA (counted twice it could not launch at all)
    largest = Launch((132, 1, 1), (128, 1, 1), dynamic_shared=232448 - 16)
    assert perf.cubin_occupancy("sm_90", largest, section, cubin_arch="sm_90").ctas_per_sm == 1
    # a kernel using no shared memory has no section: the reserve alone, 1024 bytes, 32 CTAs fit by it
    assert perf.cubin_occupancy("sm_90", largest.__class__((1, 1, 1), (32, 1, 1)), {"registers": 16, "shared_bytes": 0},
                                cubin_arch="sm_90").ctas_allowed["shared"] == 228
    # an sm_80 cubin's section is its arrays alone, on an sm_80 GPU and on an sm_90 one: 1040 declared
    # bytes + 115000 + 1024 = 117064, 117120: one CTA in 228 KB
    for limits in ("sm_80", "sm_90"):
        assert perf.cubin_occupancy(limits, launch, section, cubin_arch="sm_80").ctas_per_sm == 1
    assert perf.driver_static_shared("sm_90", 1040) == 16 and perf.driver_static_shared("sm_90a", 1024) == 0
    assert perf.driver_static_shared("sm_80", 1040) == 1040 and perf.driver_static_shared(None, 1040) == 1040


# --- GPU figures, Little's law, issue time ------------------------------------------------------

def test_littles_law_and_issue_time_arithmetic():
    # 2991 GB/s x 600 ns = 1.79 MB in flight on the GPU, 13.6 KB for each of 132 SMs.
    assert H100.bandwidth_gbs == 2991
    assert H100.bytes_in_flight_needed == pytest.approx(2991e9 * 600e-9 / 132)
    # ncu's own count for gate_up_proj (6,836,352 issued warp-instructions in 19.07 us at
    # 1.56 GHz) at one per scheduler per cycle is its measured 43.4% issue-slot utilisation.
    at_ncu_clock = dataclasses.replace(H100, clock_ghz=1.56)
    assert perf.issue_time_us(6_836_352, at_ncu_clock) / 19.07 == pytest.approx(0.4343, abs=0.002)
    assert perf.bandwidth_floor_us(2991 * 1000, H100) == pytest.approx(1.0)


def test_every_gpu_names_a_known_arch_and_a_sane_bandwidth():
    for gpu in perf.GPUS.values():
        assert gpu.arch in ARCHS and gpu.sources
        assert gpu.copy_gbs is None or gpu.copy_gbs < gpu.datasheet_gbs
    with pytest.raises(PtxgenError, match="--gpu"):
        perf.gpu_named("h800")


# --- a small streaming kernel: every count by hand ----------------------------------------------
# Each thread sums its own `trips` x 64 bytes: per trip four 16-byte loads issued together, then
# 16 adds and 4 loop instructions (24); 12 instructions before the loop and 4 after.

STREAM = """
.version 7.0
.target sm_80
.address_size 64
.visible .entry stream(.param .u64 out, .param .u64 x, .param .u32 trips)
{
  .reg .pred %more;
  .reg .b32 %t, %n, %w, %thread, %gid;
  .reg .b64 %o, %p, %off;
  .reg .f32 %a<16>, %acc;
  ld.param.u64 %o, [out];
  ld.param.u64 %p, [x];
  ld.param.u32 %n, [trips];
  mov.u32 %thread, %tid.x;
  mov.u32 %gid, %ctaid.x;
  mov.u32 %w, %ntid.x;
  mad.lo.u32 %gid, %gid, %w, %thread;
  mul.lo.u32 %w, %n, 64;
  mul.wide.u32 %off, %gid, %w;
  add.u64 %p, %p, %off;
  mov.f32 %acc, 0f00000000;
  mov.u32 %t, 0;
LOOP:
  ld.global.nc.v4.f32 {%a0, %a1, %a2, %a3}, [%p];
  ld.global.nc.v4.f32 {%a4, %a5, %a6, %a7}, [%p+16];
  ld.global.nc.v4.f32 {%a8, %a9, %a10, %a11}, [%p+32];
  ld.global.nc.v4.f32 {%a12, %a13, %a14, %a15}, [%p+48];
""" + "".join(f"  add.f32 %acc, %acc, %a{i};\n" for i in range(16)) + """
  add.u64 %p, %p, 64;
  add.u32 %t, %t, 1;
  setp.lt.u32 %more, %t, %n;
  @%more bra LOOP;
  mul.wide.u32 %off, %gid, 4;
  add.u64 %o, %o, %off;
  st.global.f32 [%o], %acc;
  ret;
}
"""
TRIPS = 5
PER_THREAD = 12 + 24 * TRIPS + 4  # issued; the last trip's branch is predicated off, so a thread
EXECUTED = PER_THREAD - 1  # executes one fewer
BLOCK = 48  # two warps, the second partial


def stream_args(ctas: int, rng) -> list:
    x = rng.standard_normal(ctas * BLOCK * TRIPS * 16).astype(np.float32)
    return [np.full(ctas * BLOCK, np.nan, np.float32), x, TRIPS]


def test_the_stream_kernel_sums_what_it_should():
    args = stream_args(3, np.random.default_rng(0))
    launch(STREAM, "stream", (3, 1, 1), (BLOCK, 1, 1), args)
    expected = args[1].astype(np.float64).reshape(3 * BLOCK, -1).sum(axis=1)
    assert np.allclose(args[0], expected, rtol=1e-5, atol=1e-5)


def test_load_rounds_of_the_stream_kernel():
    rounds = perf.load_rounds(parse(STREAM, "stream"))
    code = parse(STREAM, "stream").instructions
    assert [code[i].text.split()[0] for i in rounds.starts] == ["ld.global.nc.v4.f32"]  # the loop's first load
    assert list(rounds.waits.values()) == [64]  # four 16-byte loads in flight at the first add


def test_count_instructions_counts_whole_warps_and_rounds():
    count = perf.count_instructions(STREAM, "stream", Launch((3, 1, 1), (BLOCK, 1, 1)),
                                    stream_args(3, np.random.default_rng(1)))
    assert count.thread_instructions == 3 * BLOCK * EXECUTED
    assert count.warp_instructions == 3 * 2 * PER_THREAD  # the 16-thread warp counts whole
    assert count.rounds_per_warp == TRIPS and count.outstanding_bytes == 64
    assert count.counted == "all 3 CTAs executed"


@pytest.mark.parametrize("grid, max_threads, run", [((40, 1, 1), 8 * BLOCK, 8), ((4, 10, 1), 3 * 4 * BLOCK, 12)])
def test_a_sampled_grid_scales_to_the_full_count(grid, max_threads, run):
    ctas = math.prod(grid)
    full = perf.count_instructions(STREAM, "stream", Launch(grid, (BLOCK, 1, 1)),
                                   stream_args(ctas, np.random.default_rng(2)))
    sampled = perf.count_instructions(STREAM, "stream", Launch(grid, (BLOCK, 1, 1)),
                                      stream_args(ctas, np.random.default_rng(2)), max_threads=max_threads)
    assert sampled.ctas_run == run and f"0..{run - 1} of {ctas}" in sampled.counted
    assert (sampled.thread_instructions, sampled.warp_instructions, sampled.rounds_per_warp) == \
        (full.thread_instructions, full.warp_instructions, full.rounds_per_warp) == \
        (ctas * BLOCK * EXECUTED, ctas * 2 * PER_THREAD, TRIPS)


def test_lanes_a_branch_skips_still_cost_their_warp_one_issue():
    ptx = """
.version 7.0
.target sm_80
.address_size 64
.visible .entry lane0(.param .u64 out)
{
  .reg .pred %p;
  .reg .b32 %l;
  mov.u32 %l, %laneid;
  setp.ne.u32 %p, %l, 0;
  @%p bra SKIP;
  add.u32 %l, %l, 1;
  add.u32 %l, %l, 1;
  add.u32 %l, %l, 1;
SKIP:
  ret;
}
"""
    stats = launch(ptx, "lane0", (1, 1, 1), (64, 1, 1), [np.zeros(1, np.uint32)])
    # mov, setp, bra, ret: 64 threads, 2 warps; the bra runs on the 62 lanes it sends to SKIP;
    # each add: lane 0 of each warp, 2 threads and 2 warps.
    assert stats.thread_instructions == 64 + 64 + 62 + 3 * 2 + 64
    assert stats.warp_instructions == 4 * 2 + 3 * 2


def test_unpacking_a_load_is_not_waiting_for_it():
    ptx = """
.version 7.0
.target sm_80
.address_size 64
.visible .entry pair(.param .u64 out, .param .u64 x)
{
  .reg .b32 %u<2>;
  .reg .b16 %h<2>;
  .reg .f32 %f<2>;
  .reg .b64 %o, %p;
  ld.param.u64 %o, [out];
  ld.param.u64 %p, [x];
  ld.global.u32 %u0, [%p];
  mov.b32 {%h0, %h1}, %u0;
  cvt.f32.f16 %f0, %h0;
  ld.global.u32 %u1, [%p+4];
  cvt.rn.f32.u32 %f1, %u1;
  add.f32 %f0, %f0, %f1;
  st.global.f32 [%o], %f0;
  ret;
}
"""
    rounds = perf.load_rounds(parse(ptx, "pair"))
    assert len(rounds.starts) == 1 and list(rounds.waits.values()) == [8]



def out_x_kernel(name: str, body: str, target: str = "sm_80") -> str:
    """A PTX entry `name`(u64 out, u64 x) of `body`, which finds the two pointers in %o and %p."""
    return f"""
.version 7.8
.target {target}
.address_size 64
.visible .entry {name}(.param .u64 out, .param .u64 x)
{{
  .reg .b64 %o, %p;
  ld.param.u64 %o, [out];
  ld.param.u64 %p, [x];
{body}
}}
"""


@pytest.mark.parametrize("fence, rounds", [("", 1), ("fence.acq_rel.gpu;", 2), ("membar.gl;", 2),
                                           ("fence.proxy.async.shared::cta;", 1),
                                           ("fence.mbarrier_init.release.cluster;", 1)])
def test_a_memory_fence_waits_for_the_loads_issued_before_it(fence, rounds):
    """A load issued ahead (the next task's) overlaps an atomic's round trip, unless a memory
    fence between them holds the warp until it has arrived: then the atomic opens a round of its
    own (phase A's count-in in the persistent decoder). A proxy fence, or mbarrier_init's, orders
    no load."""
    ptx = out_x_kernel("ahead", f"""
  .reg .b32 %u<2>;
  ld.global.u32 %u0, [%p];
  {fence}
  atom.global.add.u32 %u1, [%o], 1;
  add.u32 %u0, %u0, %u1;
  st.global.u32 [%o+4], %u0;
  ret;""", target="sm_90")
    assert len(perf.load_rounds(parse(ptx, "ahead")).starts) == rounds



@pytest.mark.parametrize("depth, rounds", [(1, 1), (0, 2)])
def test_a_wait_group_leaves_the_newer_groups_in_flight(depth, rounds):
    """A ring of copies: two groups committed, cp.async.wait_group N, a third issued. With N = 1 the
    wait leaves the second group in flight, so the third copy joins a round already open (a
    3-stage ring keeps its requests going); with N = 0 nothing is left and it opens another."""
    ptx = out_x_kernel("ring", f"""
  .shared .align 16 .b8 tiles[48];
  .reg .b32 %s, %v;
  mov.u32 %s, tiles;
  cp.async.cg.shared.global [%s], [%p], 16;
  cp.async.commit_group;
  cp.async.cg.shared.global [%s+16], [%p+16], 16;
  cp.async.commit_group;
  cp.async.wait_group {depth};
  cp.async.cg.shared.global [%s+32], [%p+32], 16;
  cp.async.commit_group;
  cp.async.wait_all;
  ld.shared.u32 %v, [%s+32];
  st.global.u32 [%o], %v;
  ret;""")
    found = perf.load_rounds(parse(ptx, "ring"))
    assert len(found.starts) == rounds
    # In flight at the wait_group: both groups; at the wait_all: the third copy, and the second too
    # where the wait_group left it.
    assert list(found.waits.values()) == [32, 16 * (1 + depth)]



@pytest.mark.parametrize("hand_over, rounds, waits", [
    ("", 1, [32]),
    ("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%b];", 0, []),
])
def test_copies_handed_to_an_mbarrier_leave_the_threads_count(hand_over, rounds, waits):
    """A producer's cp.asyncs handed over with cp.async.mbarrier.arrive are waited for by the
    mbarrier's other threads, not this one: they open no round of its own and are not in flight
    at its later waits (Kind.ring_bytes counts them), where before they stayed in flight for
    good. Without the handover the thread's wait_all waits for both."""
    ptx = out_x_kernel("producer", f"""
  .shared .align 16 .b8 tiles[32];
  .shared .align 8 .b64 bar;
  .reg .b32 %s, %b;
  mov.u32 %s, tiles;
  mov.u32 %b, bar;
  cp.async.cg.shared.global [%s], [%p], 16;
  cp.async.cg.shared.global [%s+16], [%p+16], 16;
  {hand_over}
  cp.async.wait_all;
  st.global.u32 [%o], %s;
  ret;""", target="sm_90")
    found = perf.load_rounds(parse(ptx, "producer"))
    assert (len(found.starts), list(found.waits.values())) == (rounds, waits)


def test_a_bulk_copy_is_no_load_of_the_thread():
    """cp.async.bulk completes on its mbarrier (complete_tx): no round, nothing in flight for the
    issuing thread."""
    ptx = out_x_kernel("bulk", """
  .shared .align 128 .b8 tile[128];
  .shared .align 8 .b64 bar;
  .reg .b32 %s, %b;
  mov.u32 %s, tile;
  mov.u32 %b, bar;
  cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%s], [%p], 128, [%b];
  st.global.u32 [%o], %s;
  ret;""", target="sm_90")
    found = perf.load_rounds(parse(ptx, "bulk"))
    assert (found.starts, found.waits) == ((), {})


def test_an_elected_lane_is_a_predicate_the_data_flow_knows():
    """elect.sync writes `lane|pred` with either half a sink `_` (the tma producer's `_|%issuer`):
    the predicate is written, the sink is none (it failed with an AttributeError in `show`)."""
    ptx = out_x_kernel("elect", """
  .reg .b32 %v;
  .reg .pred %issuer;
  elect.sync _|%issuer, 0xffffffff;
  @%issuer ld.global.u32 %v, [%p];
  st.global.u32 [%o], %v;
  ret;""", target="sm_90")
    program = parse(ptx, "elect")
    elect = next(ins for ins in program.instructions if ins.base == "elect")
    reads, writes = perf._reads_writes(elect)
    assert writes and not reads
    assert len(perf.load_rounds(program).starts) == 1


def test_segment_counts_split_rounds_and_instructions_at_labels():
    """perf.segment_counts: one load round before the label FIRST_DONE, two dependent ones after
    it; the instructions of the two stretches add up to the launch's."""
    ptx = out_x_kernel("two", """
  .reg .b32 %u<3>;
  .reg .b64 %q;
  ld.global.u32 %u0, [%p];
  st.global.u32 [%o], %u0;
FIRST_DONE:
  ld.global.u32 %u1, [%p+4];
  mul.wide.u32 %q, %u1, 4;
  add.u64 %q, %p, %q;
  ld.global.u32 %u2, [%q];
  st.global.u32 [%o+4], %u2;
  ret;""")
    args = [np.zeros(2, np.uint32), np.array([5, 2, 7], np.uint32)]
    launch = Launch((3, 1, 1), (64, 1, 1))
    first, second = perf.segment_counts(ptx, "two", launch, args, [("first", "FIRST_DONE"), ("second", None)])
    assert (first.name, first.rounds_per_warp, second.rounds_per_warp) == ("first", 1.0, 2.0)
    assert args[0].tolist() == [5, 7]
    whole = perf.count_instructions(ptx, "two", launch, [np.zeros(2, np.uint32), np.array([5, 2, 7], np.uint32)])
    assert first.warp_instructions + second.warp_instructions == whole.warp_instructions == 6 * (4 + 6)
    with pytest.raises(PtxgenError, match="no label LATER"):
        perf.segment_counts(ptx, "two", launch, args, [("first", "LATER"), ("second", None)])


# --- the report -----------------------------------------------------------------------------------

TOY = perf.Gpu("toy", "sm_90", sms=2, clock_ghz=1.0, datasheet_gbs=100, copy_gbs=None, latency_ns=500,
               launch_us=None, sources="test figures")


def test_evaluate_reports_the_model_of_the_stream_kernel():
    traffic = 3 * BLOCK * TRIPS * 64 + 3 * BLOCK * 4
    cubins = {"sm_86": {"registers": 40, "shared_bytes": 0}, "sm_90": {"registers": 40, "shared_bytes": 0}}
    report = perf.evaluate(STREAM, "stream", Launch((3, 1, 1), (BLOCK, 1, 1)),
                           stream_args(3, np.random.default_rng(3)), cubins, traffic, TOY)
    # 40 registers: 1280 a warp, 12 a quarter, 48 warps: 24 two-warp CTAs (sm_90, 75%); sm_86
    # allows 48 warps too but 16 CTAs, 32 warps (2/3).
    assert report["occupancy"] == {"sm_86": pytest.approx(2 / 3, abs=1e-4), "sm_90": 0.75}
    assert report["thread_instructions_per_byte"] == pytest.approx(3 * BLOCK * EXECUTED / traffic, abs=1e-3)
    assert report["bandwidth_floor_us"] == pytest.approx(traffic / 100e3, abs=1e-3)
    assert report["issue_time_us"] == pytest.approx(3 * 2 * PER_THREAD / (2 * 4 * 1e3), abs=1e-3)
    # 3 CTAs on 2 SMs fit in one generation: 5 rounds of 500 ns.
    assert (report["generations"], report["latency_time_us"]) == (1, 2.5)
    # 64 B a thread x 48 threads x 1.5 CTAs an SM = 4608 B, short of 100 GB/s x 500 ns / 2 SMs.
    assert report["bytes_in_flight"] == {"per_thread": 64, "ring_per_cta": 0, "resident_threads_per_sm": 72.0,
                                         "per_sm": 4608, "needed_per_sm": 25000}
    serialized = traffic / 100e3 + 3 * 2 * PER_THREAD / 8e3 + 2.5
    assert report["estimate_us"] == {"overlapped": 2.5, "serialized": pytest.approx(serialized, abs=1e-3)}
    assert report["verdict"].startswith("latency-bound, too few bytes in flight")
    assert "(launch cost not measured)" in report["verdict"] and report["launch_us"] is None
    assert json.loads(json.dumps(report)) == report  # plain values, for `show --json`
    # A measured launch cost adds to both estimates; where it is most of the time, it is the verdict.
    for launch_us, verdict in ((2.0, "latency-bound, too few bytes in flight"),
                               (100.0, "launch-bound, the fixed cost of a launch is most of the time")):
        gpu = dataclasses.replace(TOY, launch_us=launch_us)
        timed = perf.evaluate(STREAM, "stream", Launch((3, 1, 1), (BLOCK, 1, 1)),
                              stream_args(3, np.random.default_rng(3)), cubins, traffic, gpu)
        assert timed["estimate_us"] == {"overlapped": pytest.approx(2.5 + launch_us, abs=1e-3),
                                        "serialized": pytest.approx(serialized + launch_us, abs=1e-3)}
        assert timed["verdict"].startswith(verdict) and f"launch {launch_us:.1f} us + bytes" in timed["verdict"]


# --- the tail: a last CTA's extra round after everyone else ---------------------------------------
# Each one-warp CTA (lane 0) loads its x (round 1), stores 2x as its partial and counts in with an
# atomic that returns the count (round 2); the CTA that completes the count loads all 4 partials
# at once (round 3, one CTA in 4) and stores their sum.

LAST_SUM = """
.version 7.0
.target sm_80
.address_size 64
.visible .entry last_sum(.param .u64 out, .param .u64 x, .param .u64 partial, .param .u64 counter)
{
  .reg .pred %lead, %last;
  .reg .b32 %t, %cta, %n, %old;
  .reg .b64 %o, %px, %pp, %pc, %a;
  .reg .f32 %v, %p<4>;
  ld.param.u64 %o, [out];
  ld.param.u64 %px, [x];
  ld.param.u64 %pp, [partial];
  ld.param.u64 %pc, [counter];
  mov.u32 %t, %tid.x;
  setp.eq.u32 %lead, %t, 0;
  @!%lead bra DONE;
  mov.u32 %cta, %ctaid.x;
  mul.wide.u32 %a, %cta, 4;
  add.u64 %px, %px, %a;
  ld.global.f32 %v, [%px];
  add.f32 %v, %v, %v;
  add.u64 %a, %pp, %a;
  st.global.f32 [%a], %v;
  atom.acq_rel.gpu.global.add.u32 %old, [%pc], 1;
  mov.u32 %n, %nctaid.x;
  sub.u32 %n, %n, 1;
  setp.eq.u32 %last, %old, %n;
  @!%last bra DONE;
  ld.global.f32 %p0, [%pp];
  ld.global.f32 %p1, [%pp+4];
  ld.global.f32 %p2, [%pp+8];
  ld.global.f32 %p3, [%pp+12];
  add.f32 %p0, %p0, %p1;
  add.f32 %p2, %p2, %p3;
  add.f32 %p0, %p0, %p2;
  st.global.f32 [%o], %p0;
DONE:
  ret;
}
"""


def last_sum_args(rng) -> list:
    return [np.full(1, np.nan, np.float32), rng.standard_normal(4).astype(np.float32),
            np.full(4, np.nan, np.float32), np.zeros(1, np.uint32)]


def test_a_last_ctas_round_is_the_launchs_tail():
    args = last_sum_args(np.random.default_rng(5))
    launch(LAST_SUM, "last_sum", (4, 1, 1), (32, 1, 1), args)  # sanitizer and memory-ordering model on
    assert args[0][0] == pytest.approx(2 * args[1].astype(np.float64).sum(), rel=1e-6) and args[3][0] == 4
    count = perf.count_instructions(LAST_SUM, "last_sum", Launch((4, 1, 1), (32, 1, 1)),
                                    last_sum_args(np.random.default_rng(5)))
    # Rounds: x (all 4 warps), the atomic's count (all 4), the partials (1 warp of 4).
    assert (count.rounds_per_warp, count.critical_rounds) == (2.25, 3)
    report = perf.evaluate(LAST_SUM, "last_sum", Launch((4, 1, 1), (32, 1, 1)),
                           last_sum_args(np.random.default_rng(5)), {"sm_90": {"registers": 16, "shared_bytes": 0}},
                           4 * 4 * 3 + 4, TOY)
    # The tail: 3 - 2.25 rounds of 500 ns after the others are done, on top of both estimates.
    assert report["tail_time_us"] == 0.375 and report["critical_rounds"] == 3
    latency = report["latency_time_us"]
    assert latency == 2.25 * 0.5 and report["estimate_us"]["overlapped"] == pytest.approx(latency + 0.375, abs=1e-3)
    assert "tail 0.4 us (3 rounds the slowest warp)" in report["verdict"]


def test_a_cta_that_cannot_be_resident_gets_no_time():
    x = np.ones(1024 * TRIPS * 16, np.float32)
    report = perf.evaluate(STREAM, "stream", Launch((1, 1, 1), (1024, 1, 1)), [np.zeros(1024, np.float32), x, TRIPS],
                           {"sm_90": {"registers": 255, "shared_bytes": 0}}, x.nbytes, TOY)
    assert report["occupancy"] == {"sm_90": 0.0} and "estimate_us" not in report
    assert report["verdict"] == "cannot launch on sm_90: a CTA needs more registers than an SM has"


def test_evaluate_needs_a_cubin_for_the_gpus_arch():
    with pytest.raises(PtxgenError, match="sm_90"):
        perf.evaluate(STREAM, "stream", Launch((1, 1, 1), (BLOCK, 1, 1)), stream_args(1, np.random.default_rng(4)),
                      {"sm_80": {"registers": 40, "shared_bytes": 0}}, 1, TOY)


def test_q4k_gemv_waits_once_per_unroll_row_steps():
    # k = 8192: 4 warp steps a row, 2 rows a warp (one loop trip each), 2 row-steps of 48 bytes a
    # lane (32 B quants + 16 B header) in flight. Rounds: the first loads (before x is staged),
    # the 3 later staging rounds of 4 warps (512 units of x), and one every 2 row-steps (the model
    # takes a use to wait for every load in flight). 40 rows: 5 CTAs of 4 warps.
    kernel = make_kernel("q4k_gemv", n=40, k=8192, rows_per_warp=2, unroll=2, split_k=1, warps=4)
    resources = {"sm_90": {"registers": 62, "shared_bytes": 0}}
    report = perf.evaluate_kernel(kernel, H100, resources=resources)
    assert report["rounds_per_warp"] == 1 + 3 + 2 * 4 // 2 and report["bytes_in_flight"]["per_thread"] == 96
    assert report["counted"] == "all 5 CTAs executed"
    assert report["occupancy"]["sm_90"] == 0.5  # 62 registers: 32 warps an SM, 8 CTAs of 4


# --- SASS, when the optional nvdisasm wheel is installed ------------------------------------------

def test_sass_counts_find_the_loop():
    if perf.nvdisasm() is None:
        pytest.skip("nvidia-cuda-nvdisasm is not installed (pip install '.[sass]')")
    from ptxgen.assemble import OPTIONS, assemble_nvjitlink

    sass = perf.sass_counts(assemble_nvjitlink(STREAM, "sm_90", OPTIONS).cubin)
    assert len(sass["loop_bodies"]) == 1 and sass["instructions"] > sass["loop_bodies"][0] > 1
    assert perf.ptx_loop_bodies(STREAM, "stream") == [24]
    assert sass["loop_spills"] == 0


def test_show_sass_prints_the_cubin_a_gpu_runs_or_says_why_not(tmp_path):
    """`show --sass`: nvdisasm's listing of the cubin the --gpu runs (or --arch's); one clear
    error, exit 2, for an arch the spec does not build, and beside --ptx or --tune."""
    from helpers import run_cli

    spec = tmp_path / "s.toml"
    spec.write_text('[target]\narchs = ["sm_86", "sm_90"]\n\n[[kernels]]\nname = "norm"\nkind = "rmsnorm"\n'
                    'hidden = 256\n')
    errors = {("--arch", "sm_80"): "--sass: norm has no cubin for --arch sm_80; the spec builds sm_86, sm_90",
              ("--gpu", "a100-80gb"): "--sass: norm has no cubin for the sm_80 of --gpu a100-80gb; the spec builds "
                                      "sm_86, sm_90",
              ("--ptx",): "--ptx prints the PTX, --sass the SASS: give one or the other",
              ("--tune", "warps=1,2"): "--tune: compares the variants' models; --sass prints one kernel's code"}
    for extra, message in errors.items():
        shown = run_cli("show", "norm", "--spec", str(spec), "--sass", *extra)
        assert shown.returncode == 2 and message in shown.stderr and "Traceback" not in shown.stderr, shown.stderr
    if perf.nvdisasm() is None:
        pytest.skip("nvidia-cuda-nvdisasm is not installed (pip install '.[sass]')")
    # an RTX 4090 (sm_89) runs the sm_86 cubin (binary_for), and so does --arch sm_89, as --ptx takes it
    for extra, arch in (((), "sm_90"), (("--arch", "sm_86"), "sm_86"), (("--gpu", "rtx4090"), "sm_86"),
                        (("--arch", "sm_89"), "sm_86")):
        shown = run_cli("show", "norm", "--spec", str(spec), "--sass", *extra)
        assert shown.returncode == 0, shown.stderr
        assert ".text.norm" in shown.stdout and "EXIT" in shown.stdout, shown.stdout[:400]
        assert f"SM{arch[3:]}" in shown.stdout or f"sm_{arch[3:]}" in shown.stdout, shown.stdout[:400]


# --- `ptxgen show`: the model per kernel, table and JSON ----------------------------------------------

def test_show_reports_the_model_as_json_and_as_a_table():
    from helpers import ROOT, run_cli

    spec = str(ROOT / "specs" / "qwen3.toml")
    shown = run_cli("show", "qwen3_8b_decode_attention", "--spec", spec, "--json")
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    assert set(report["occupancy"]) == {"sm_80", "sm_86", "sm_89", "sm_90"}
    registers = report["resources"]["sm_90"]["registers"]
    # the sm_90 cubin's shared section holds the 1 KB reserve that occupancy adds
    expected = perf.occupancy(perf.arch_limits("sm_90"), report["launch"]["block"][0], registers,
                              report["resources"]["sm_90"]["shared_bytes"] - 1024 + report["launch"]["dynamic_shared"])
    assert report["occupancy"]["sm_90"] == round(expected.fraction, 4)
    model = report["model"]
    assert report["thread_instructions_per_byte"] == round(model["thread_instructions"] / report["traffic"]["bytes"], 3)
    assert model["gpu"]["name"] == "h100-sxm" and model["bytes_in_flight"]["needed_per_sm"] > 0
    table = run_cli("show", "qwen3_8b_decode_attention", "--spec", spec, "--gpu", "h200")
    assert table.returncode == 0 and "performance model on h200" in table.stdout
    assert "thread-instructions" in table.stdout and "bytes in flight per SM" in table.stdout
    bad = run_cli("show", "qwen3_8b_decode_attention", "--spec", spec, "--gpu", "h300")
    assert bad.returncode == 2 and "--gpu: expected one of" in bad.stderr


def test_show_reports_the_launch_and_the_model_at_the_runtime_scalars_it_is_given():
    """--set moves the whole report (grid, bytes, roofline, model) to that call: decode attention
    over 1024 keys splits into fewer CTAs and moves a quarter of the bytes of 4096 keys."""
    from helpers import ROOT, run_cli

    spec = str(ROOT / "specs" / "qwen3.toml")
    reports = {}
    for keys in (1024, 4096):
        shown = run_cli("show", "qwen3_8b_decode_attention", "--spec", spec, "--json", "--set", f"seq_len={keys}")
        assert shown.returncode == 0, shown.stderr
        reports[keys] = json.loads(shown.stdout)
    short, long = reports[1024], reports[4096]
    assert short["launch"]["scalars"] == short["model"]["scalars"] == {"seq_len": 1024}
    assert short["launch"]["grid"][0] < long["launch"]["grid"][0]
    kv_bytes = 2 * 8 * 128 * 2  # K and V rows of 8 heads, d128, f16
    assert long["traffic"]["bytes"] - short["traffic"]["bytes"] == 3072 * kv_bytes
    assert long["model"]["bytes"] == long["traffic"]["bytes"]
    assert long["roofline_us"]["memory"] > 3.9 * short["roofline_us"]["memory"]


def test_show_tune_models_each_variant_beside_the_spec_config(tmp_path):
    """show --tune: every buildable combination's show report (launch, resources, model) beside the
    spec's config, ranked by the model's serialized estimate; each variant's report is the one
    `show` gives for that config alone, and the refused combinations are named."""
    from helpers import run_cli_in_process

    spec = tmp_path / "tune.toml"
    spec.write_text('[target]\narchs = ["sm_90"]\n\n[[kernels]]\nname = "small_gemv"\nkind = "q4k_gemv"\n'
                    'n = 96\nk = 4096\n')
    shown = run_cli_in_process("show", "small_gemv", "--spec", str(spec), "--json", "--tune", "rows_per_warp=1,3",
                               "--tune", "split_k=1,3")
    assert shown.returncode == 0, shown.stderr
    section = json.loads(shown.stdout)
    assert section["kernel"] == "small_gemv"
    assert [v["changes"] for v in section["variants"]] == [{}, {"rows_per_warp": 1, "split_k": 1},
                                                           {"rows_per_warp": 3, "split_k": 1}]
    assert [s["changes"] for s in section["skipped"]] == [{"rows_per_warp": 1, "split_k": 3},
                                                         {"rows_per_warp": 3, "split_k": 3}]
    spec.write_text(spec.read_text() + "rows_per_warp = 3\nsplit_k = 1\n")
    alone = json.loads(run_cli_in_process("show", "small_gemv", "--spec", str(spec), "--json").stdout)
    third = section["variants"][2]
    assert third["name"] == "small_gemv_v3" and third["config"] == alone["config"]
    assert third["launch"] == alone["launch"] and third["model"]["estimate_us"] == alone["model"]["estimate_us"]
    table = run_cli_in_process("show", "small_gemv", "--spec", str(spec), "--tune", "rows_per_warp=1,2")
    assert table.returncode == 0 and "ranked by its serialized estimate" in table.stdout
    assert "rows_per_warp=1" in table.stdout and "as in the spec" in table.stdout
    refused = run_cli_in_process("show", "small_gemv", "--spec", str(spec), "--ptx", "--tune", "rows_per_warp=1,2")
    assert refused.returncode == 2 and "--tune: compares the variants' models" in refused.stderr
    from helpers import ROOT  # an sm_90a-only spec: the H100 runs the sm_90a cubin, whose resources are shown
    hopper = run_cli_in_process("show", "prefill_sm90a", "--spec", str(ROOT / "bench/lease/prefill_sm90a.toml"),
                                "--no-model", "--tune", "sm90a.stages=1,2")
    assert hopper.returncode == 0, hopper.stderr
    row = next(line for line in hopper.stdout.splitlines() if "sm90a.stages=1" in line)
    assert re.split(r"\s{2,}", row)[3].isdigit(), row  # registers: plain columns in a pipe, no box
    assert not set("│┃━┏") & set(hopper.stdout), hopper.stdout


def test_a_call_too_large_to_interpret_is_not_counted_and_says_so():
    """20M rows of RMSNorm would need ~38 GiB of sample inputs: the model skips the count (the
    launch, bytes and roofline are still reported) instead of running out of memory."""
    from helpers import ROOT, run_cli

    shown = run_cli("show", "qwen3_8b_rmsnorm", "--spec", str(ROOT / "specs" / "qwen3.toml"), "--json",
                    "--set", "rows=20000000")
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    assert report["traffic"]["bytes"] > perf.MAX_COUNTED_BYTES and report["launch"]["grid"][0] > 0
    assert report["model"]["skipped"].startswith("too large to interpret at these scalars")
    assert report["thread_instructions_per_byte"] is None


def test_show_models_the_lm_head_on_a_few_ctas_of_its_plan():
    """The 151936-row Q6_K lm_head (511 MB, past MAX_COUNTED_BYTES) is counted on MODEL_CTAS CTAs
    of its plan with one and two queued units each and extrapolated to its 132 CTAs
    (Q4kGemv.model_scaling); occupancy, from ptxas's resources alone, per arch as everywhere."""
    from helpers import ROOT, run_cli

    shown = run_cli("show", "qwen3_8b_lm_head", "--spec", str(ROOT / "specs" / "qwen3.toml"), "--json",
                    "--gpu", "h200")
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    model = report["model"]
    assert "skipped" not in model and report["traffic"]["bytes"] == 511_129_088
    assert model["counted"] == ("4 CTAs of its plan interpreted with 1 and 2 queued units of 16 rows each, "
                                "extrapolated to 71.94 units on each of its 132 CTAs"), model["counted"]
    # Q6_K's lane work, ~3 thread-instructions a weight byte (ptxgen/kernels/q6k_gemv.py), staging and sums
    assert 3.0 < report["thread_instructions_per_byte"] < 4.2
    assert 72 < model["rounds_per_warp"] < 74 and model["critical_rounds"] - model["rounds_per_warp"] < 2
    assert set(report["occupancy"]) == {"sm_80", "sm_86", "sm_89", "sm_90"} and report["occupancy"]["sm_90"] > 0
    assert report["occupancy_detail"]["sm_90"]["warps_per_sm"] > 0


@pytest.mark.parametrize("kind, n, schedule", [("q6k_gemv", 1285, None), ("q4k_gemv", 700, "static"),
                                               ("q8_0_gemv", 1500, None)])
def test_a_gemv_counted_on_a_few_ctas_matches_its_whole_count(monkeypatch, kind, n, schedule):
    """model_scaling against the count of the whole launch (8 SMs' grid, units left over on some
    CTAs): the totals within 0.5%, a warp's mean rounds exact, the slowest warp within a round
    (measured: totals 0.9984-1.0000 of the whole count, the slowest warp one round over for Q8_0)."""
    from ptxgen.kernels import config_from_json, kind_of, q4k_gemv
    from ptxgen.pipeline import compile_kernel

    config = config_from_json({"kind": kind, "name": "scaled", "n": n, "k": 4096, "sm_count": 8,
                               **({"schedule": schedule} if schedule else {})})
    whole = perf.launch_count(compile_kernel(config, ("sm_90",), until="ptx"), "sm_90", {}, 0, 1 << 30)
    monkeypatch.setattr(q4k_gemv, "MAX_COUNTED_BYTES", 0)  # as if too large
    scaling = kind_of(config).model_scaling()
    assert scaling.base.n == 4 * kind_of(config).plan.rows_per_cta and len(scaling.steps) == (schedule is None)
    scaled = perf.scaled_count(scaling, "sm_90", {}, 0, 1 << 30)
    for name in ("thread_instructions", "warp_instructions", "instructions_per_warp"):
        assert getattr(scaled, name) == pytest.approx(getattr(whole, name), rel=5e-3), name
    assert scaled.rounds_per_warp == pytest.approx(whole.rounds_per_warp, rel=1e-9)
    assert abs(scaled.critical_rounds - whole.critical_rounds) <= 1
    assert scaled.outstanding_bytes == whole.outstanding_bytes


# --- CTAs of unequal work: a causal prefill's query blocks ---------------------------------------
def test_dispatch_balance_of_equal_and_unequal_ctas():
    assert perf.dispatch_balance(np.ones(528), 264) == 1.0           # two even waves
    assert perf.dispatch_balance(np.ones(265), 264) == pytest.approx(2 * 264 / 265)  # one CTA in a second wave
    assert perf.dispatch_balance(np.array([9.0] + [1.0] * 10), 4) == 1.0  # the largest CTA is the floor
    # work 4, 1, 1, 1, 1 on 2 slots in that order: 4 | 1+1+1+1 -> 4, even 4
    assert perf.dispatch_balance(np.array([4.0, 1, 1, 1, 1]), 2) == 1.0
    # the heavy one last: 1+1 | 1+1, then 4 on a slot at 2 -> 6 over 4
    assert perf.dispatch_balance(np.array([1.0, 1, 1, 1, 4]), 2) == 1.5


@pytest.mark.parametrize("seq_len, block_m, block_n, slots", [
    # the H100 prefills (32 heads): mma.sync, two 128-row CTAs an SM; sm_90a, one
    (2048, 128, 64, 264), (4096, 128, 64, 264), (8192, 128, 64, 264), (1024, 128, 128, 132), (4096, 128, 128, 132),
])
def test_dealing_the_heaviest_causal_blocks_of_every_head_first_evens_the_waves(seq_len, block_m, block_n, slots):
    """query_block (templates/families/prefill.ptx.j2) deals ids rank-major, within 3.2% of an
    even spread at these lengths; dealt block by block within each head, as before it, the last
    heads' heaviest blocks start last: 5.6-60% over (1.604, 1.304, 1.141, 1.5, 1.134 here)."""
    from ptxgen.kernels.flash_attention import causal_cta_work

    work = causal_cta_work(seq_len, 32, block_m, block_n)
    blocks = -(-seq_len // block_m)
    assert work[0] == work[31] == blocks * block_m // block_n + 1 and work[-1] == block_m // block_n + 1
    before = work.reshape(blocks, 32).T.ravel()          # id = head * blocks + rank
    assert sorted(before) == sorted(work)
    assert perf.dispatch_balance(work, slots) <= 1.032
    assert perf.dispatch_balance(before, slots) >= 1.13


def test_a_one_wave_causal_prefill_is_bound_by_its_longest_cta():
    """1k tokens, 32 heads, 128-row CTAs of 64-key tiles on 264 slots: 256 CTAs, one wave, so the
    order costs nothing, but the last block's 16 key tiles (+1) are 1.75x the 80 x 32 / 264 an
    even spread gives a slot (measured on the H100 of 2026-11-27: 168 TFLOP/s there, 320 at 4k)."""
    from ptxgen.kernels.flash_attention import causal_cta_work

    report = perf.dispatch_report(causal_cta_work(1024, 32, 128, 64), 264)
    assert report == {"slots": 264, "makespan_over_even": 1.0, "longest_over_even": round(17 * 264 / 2560, 3),
                      "makespan": 17.0}
    # 4k: 1024 CTAs, the longest (64 tiles + 1) half of a slot's even share, not what bounds it
    assert perf.dispatch_report(causal_cta_work(4096, 32, 128, 64), 264)["longest_over_even"] == round(65 * 264 / 34816, 3)


def test_a_sample_of_unequal_ctas_scales_by_their_work():
    """A causal prefill's first CTAs are its heaviest: scaled by their number they overstate the
    grid by 40%; by their work (Kind.cta_work) they come within 2% of running every CTA."""
    from ptxgen.runner import prepare_arrays

    kernel = make_kernel("flash_attention", num_heads=4, num_kv_heads=2, head_dim=64, causal=True)
    scalars = {"seq_len": 512}
    kind = kernel.definition
    arrays = prepare_arrays(kernel, kind.sample_inputs(np.random.default_rng(0), scalars), scalars)
    args, launch_ = kernel.args(arrays, scalars), kernel.launch(scalars)
    work = kind.cta_work(scalars)
    assert launch_.grid == (8, 4, 1) and len(work) == 32
    full = perf.count_instructions(kernel.portable.ptx, kernel.name, launch_, args, max_threads=1 << 20)
    by_number = perf.count_instructions(kernel.portable.ptx, kernel.name, launch_, args, max_threads=8 * 128)
    by_work = perf.count_instructions(kernel.portable.ptx, kernel.name, launch_, args, max_threads=8 * 128, work=work)
    assert by_number.ctas_run == by_work.ctas_run == 8 and full.ctas_run == 32
    assert by_number.thread_instructions > 1.3 * full.thread_instructions
    assert by_work.thread_instructions == pytest.approx(full.thread_instructions, rel=0.02)
    assert "scaled by the work of all over theirs" in by_work.counted


def test_an_sm90_gpu_is_modelled_on_the_sm90a_cubin_it_runs(tmp_path):
    """A spec building sm_90 and sm_90a: an H100 loads the sm_90a cubin (CompiledKernel.binary_for),
    so the model counts its PTX and takes its occupancy (one 288-thread CTA an SM, 132 slots), not
    the mma.sync cubin's two 128-thread CTAs (it priced one on the other's slots before), and
    show's launch line is that variant's."""
    from ptxgen.pipeline import compile_kernel

    from helpers import make_config, run_cli_in_process

    config = make_config("flash_attention", name="attn", num_heads=2, num_kv_heads=1, head_dim=128,
                         block_m=128, warp_rows=32)
    kernel = compile_kernel(config, ("sm_90", "sm_90a"))
    fits = {arch: perf.occupancy_per_arch(perf.arch_launches(kernel, {"seq_len": 300}, [arch]),
                                          {arch: kernel.binaries[arch].resources})[arch].ctas_per_sm
            for arch in ("sm_90", "sm_90a")}
    assert fits == {"sm_90": 2, "sm_90a": 1}
    report = perf.evaluate_kernel(kernel, H100, scalars={"seq_len": 300})
    assert report["dispatch"]["slots"] == 132
    assert report["bytes_in_flight"]["resident_threads_per_sm"] == pytest.approx(288 * 6 / 132, abs=0.1)
    # Its producer hands each tile's cp.asyncs to an mbarrier: in flight, the K and V rings of the
    # CTAs (2 x 2 stages of 128 keys x 256 bytes), none of them a thread's own round.
    ring = 2 * 2 * 128 * 256
    assert report["bytes_in_flight"]["ring_per_cta"] == ring and report["bytes_in_flight"]["per_thread"] == 0
    assert report["bytes_in_flight"]["per_sm"] == round(ring * 6 / 132) and report["rounds_per_warp"] == 0
    spec = tmp_path / "prefill.toml"
    spec.write_text('[target]\narchs = ["sm_90", "sm_90a"]\n\n[[kernels]]\nname = "attn"\nkind = "flash_attention"\n'
                    'num_heads = 2\nnum_kv_heads = 1\nhead_dim = 128\n')
    shown = run_cli_in_process("show", "attn", "--spec", str(spec), "--no-model", "--json")
    assert shown.returncode == 0, shown.stderr
    launch_ = json.loads(shown.stdout)["launch"]
    assert launch_["ptx_target"] == "sm_90a" and launch_["block"] == [288, 1, 1]


@pytest.mark.parametrize("text, flops", [
    ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f0, %f1, %f2, %f3}, {%r0, %r1, %r2, %r3}, {%r4, %r5}, "
     "{%f0, %f1, %f2, %f3};", 2 * 16 * 8 * 16),
    ("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%r0, %r1, %r2, %r3}, {%r0, %r1, %r2, %r3}, {%r4, %r5}, "
     "{%r0, %r1, %r2, %r3};", 2 * 16 * 8 * 32 / 2),                         # 8-bit operands: twice the f16 rate
    ("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%f0}, %d0, %d1, 1, 1, 1, 0, 0;",
     2 * 64 * 128 * 16 / 4),                                                # a warpgroup's, a quarter each warp
    ("wgmma.fence.sync.aligned;", 0),
    ("fma.rn.f32 %f0, %f1, %f2, %f3;", 0),
])
def test_tensor_flops_of_an_instruction(text, flops):
    class Ins:
        base, *mods = text.split()[0].split(".")
    assert perf.tensor_flops_of(Ins) == flops


@pytest.mark.parametrize("arch", [None, "sm_90a"])
def test_the_model_counts_a_prefills_matrix_work_and_exponentials_and_prices_them(arch):
    """Every key tile of a non-causal prefill whose length is whole tiles is computed whole: the
    executed mma.sync / wgmma FLOPs are the kind's (4 heads x head_dim x seq_len^2) on the sm_90a
    kernel, and 17/16 of them on the portable one, whose row sums are an mma of P with a ones
    block (an eighth more P V); and the model's time has a tensor term of them at the GPU's rate,
    so its estimate is never under the roofline's compute time (the prefill at 4k tokens:
    tensor-bound at 147 us on an H100, where it had put 61-90 us beside a 139 us roofline)."""
    from ptxgen.pipeline import compile_kernel

    from helpers import make_config

    kernel = compile_kernel(make_config("flash_attention", name="attn", num_heads=2, num_kv_heads=1, head_dim=64,
                                        causal=False), ("sm_80", "sm_90a"), until="ptx")
    scalars = {"seq_len": 256}
    count = perf.launch_count(kernel, arch or "sm_80", scalars, seed=1, max_threads=1 << 20)
    exact = kernel.definition.traffic(scalars).flops
    assert exact == 4 * 2 * 64 * 256 * 256
    assert count.tensor_flops == (exact if arch else exact * 17 // 16)
    variant = kernel.variant(arch)
    report = perf.evaluate(variant.ptx, kernel.name, kernel.launch(scalars, arch), [], {"sm_90": {"registers": 128,
                           "shared_bytes": 0}}, 1 << 20, perf.GPUS["h100-sxm"], count=count, arch="sm_90")
    assert report["tensor_time_us"] == pytest.approx(count.tensor_flops / 989e6, abs=1e-3)
    # every score's exponential is one lane of an ex2 (2 x 256^2 / 32 warp-instructions), beside a
    # few for the rows' rescale factors and reciprocals; the unit makes 16 results a clock an SM
    assert 2 * 256 * 256 // 32 <= count.sfu_instructions <= 1.1 * 2 * 256 * 256 // 32
    assert report["sfu_time_us"] == pytest.approx(count.sfu_instructions * 32 / (16 * 132 * 1.98e3), abs=1e-3)
    # as much matrix work as 4k tokens' (x 1e4 here): the term is the estimate's largest, and named
    heavy = dataclasses.replace(count, tensor_flops=count.tensor_flops * 10**4)
    report = perf.evaluate(variant.ptx, kernel.name, kernel.launch(scalars, arch), [], {"sm_90": {"registers": 128,
                           "shared_bytes": 0}}, 1 << 20, perf.GPUS["h100-sxm"], count=heavy, arch="sm_90")
    fixed = perf.GPUS["h100-sxm"].launch_us + report["tail_time_us"]
    assert report["estimate_us"]["overlapped"] == pytest.approx(report["tensor_time_us"] + fixed, abs=2e-3)
    assert report["verdict"].startswith("tensor-bound")
    heavy = dataclasses.replace(count, sfu_instructions=count.sfu_instructions * 10**5)
    report = perf.evaluate(variant.ptx, kernel.name, kernel.launch(scalars, arch), [], {"sm_90": {"registers": 128,
                           "shared_bytes": 0}}, 1 << 20, perf.GPUS["h100-sxm"], count=heavy, arch="sm_90")
    assert report["verdict"].startswith("special-function-bound")
    assert report["estimate_us"]["serialized"] == pytest.approx(sum(report[f"{term}_time_us"] for term in (
        "tensor", "sfu", "issue", "latency")) + report["bandwidth_floor_us"] + fixed, abs=5e-3)


def test_ctas_of_unequal_work_scale_the_sm_throughput_terms_by_the_busiest_slot():
    """A causal prefill's CTAs carry 1..blocks query blocks' key tiles: its issue, matrix and
    special-function times, which spread the work evenly, grow by the busiest resident slot's
    makespan over an even spread (the order's cost x the longest CTA's share). On the H200 of
    2026-11-28 the mma.sync prefill at 1k tokens, one wave whose longest CTA is 1.75x an even share,
    measured 45.34 us, above the unscaled range (10.54..36.98) and inside the scaled one."""
    from ptxgen.pipeline import compile_kernel

    from helpers import make_config

    kernel = compile_kernel(make_config("flash_attention", name="attn", num_heads=2, num_kv_heads=1, head_dim=64,
                                        causal=True), ("sm_80",), until="ptx")
    scalars = {"seq_len": 512}
    count = perf.launch_count(kernel, "sm_80", scalars, seed=1, max_threads=1 << 20)
    work = kernel.definition.cta_work(scalars)
    assert work is not None and work.max() > work.min()
    gpu, launch_ = perf.GPUS["a100-80gb"], kernel.launch(scalars)
    cubins = {"sm_80": {"registers": 128, "shared_bytes": 0}}
    even = perf.evaluate(kernel.ptx, kernel.name, launch_, [], cubins, 1 << 20, gpu, count=count)
    dealt = perf.evaluate(kernel.ptx, kernel.name, launch_, [], cubins, 1 << 20, gpu, count=count, work=work)
    dispatch = dealt["dispatch"]
    factor = dispatch["makespan_over_even"] * max(1.0, dispatch["longest_over_even"])
    assert dispatch["compute_factor"] == pytest.approx(factor, abs=1e-3) and factor > 1
    for term in ("issue", "tensor", "sfu"):
        assert dealt[f"{term}_time_us"] == pytest.approx(even[f"{term}_time_us"] * factor, rel=5e-3, abs=2e-3)  # rounded
    assert dealt["bandwidth_floor_us"] == even["bandwidth_floor_us"]


def test_a_gpu_without_a_matrix_rate_prices_matrix_work_at_the_documented_fallback(tmp_path):
    """l40s and rtx4090 have no datasheet matrix rate here: the roofline and the model both take
    --tensor-tflops' documented fallback, 989 (the model took 0 and the table raised a TypeError)."""
    from helpers import run_cli_in_process

    spec = tmp_path / "fa.toml"
    spec.write_text('[[kernels]]\nname = "fa"\nkind = "flash_attention"\nnum_heads = 2\nnum_kv_heads = 1\n'
                    'head_dim = 64\n')
    for gpu in ("l40s", "rtx4090"):
        shown = run_cli_in_process("show", "fa", "--spec", str(spec), "--gpu", gpu, "--set", "seq_len=256")
        assert shown.returncode == 0 and "at 989 TFLOP/s" in shown.stdout, shown
        report = json.loads(run_cli_in_process("show", "fa", "--spec", str(spec), "--gpu", gpu, "--set",
                                               "seq_len=256", "--json").stdout)
        assert report["model"]["tensor_time_us"] > 0 and report["roofline_us"]["tensor_tflops"] == 989.0


def test_a_gpu_running_an_older_arch_s_cubin_is_held_to_its_own_limits(tmp_path):
    """An L40S (sm_89: 1536 threads an SM) runs a spec's sm_80 cubin: its residency is the cubin's
    resources under sm_89's limits, not sm_80's 2048 threads (which gave 1846 resident threads)."""
    from helpers import run_cli_in_process

    spec = tmp_path / "occ.toml"
    spec.write_text('[target]\narchs = ["sm_80"]\n[[kernels]]\nname = "big"\nkind = "swiglu"\nn = 4194304\n')
    report = json.loads(run_cli_in_process("show", "big", "--spec", str(spec), "--gpu", "l40s", "--json").stdout)
    assert report["model"]["bytes_in_flight"]["resident_threads_per_sm"] <= 1536
