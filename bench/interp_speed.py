"""Throughput of the CPU PTX interpreter: thread-instructions per second on a large grid.

Usage: python bench/interp_speed.py [--kernel loop|reduce|publish] [--ctas 512]
                                    [--threads 256] [--iters 64] [--spread 0] [--no-sanitize]
loop: a register-only fma loop; --spread M gives thread t a trip count of iters - (t & M),
so loops diverge and reconverge.
reduce: iters rounds of a shared-memory tree reduction per CTA (bar.sync, shrinking active
set), which exercises the sanitizer's race tracking and the merging of thread groups.
publish: iters rounds of "every thread stores a value, the CTA releases (membar.gl) and counts
in on a global atomic counter; the last CTA to count in sums every CTA's values": global
stores, cross-CTA reads, fences and atomics, so the ordering model and the interleaved
scheduling of CTAs (launch.py) are in the measurement.
Times are wall-clock and CPU seconds of this process (CPU time is the steadier figure on a
shared machine).
"""
import argparse
import time

import numpy as np

from ptxgen.interp import launch

HEADER = """
.version 8.0
.target sm_80
.address_size 64
"""

LOOP = HEADER + r"""
.visible .entry loop(.param .u64 out, .param .u32 iters, .param .u32 spread)
{
  .reg .b32 %r<8>;
  .reg .b64 %rd<4>;
  .reg .f32 %f<4>;
  .reg .pred %p<2>;
  ld.param.u64 %rd1, [out];
  ld.param.u32 %r1, [iters];
  ld.param.u32 %r7, [spread];
  mov.u32 %r2, %ctaid.x;
  mov.u32 %r3, %ntid.x;
  mov.u32 %r4, %tid.x;
  mad.lo.s32 %r5, %r2, %r3, %r4;
  and.b32 %r7, %r4, %r7;          // per-thread trip count: iters - (tid & mask)
  sub.u32 %r1, %r1, %r7;
  cvt.rn.f32.u32 %f1, %r5;
  mov.f32 %f2, 0f00000000;
  mov.u32 %r6, 0;
LOOP:
  fma.rn.f32 %f2, %f1, 0f3F000000, %f2;
  mul.rn.f32 %f1, %f1, 0f3F7FF000;
  add.s32 %r6, %r6, 1;
  setp.lt.u32 %p1, %r6, %r1;
  @%p1 bra LOOP;
  mul.wide.u32 %rd2, %r5, 4;
  add.s64 %rd3, %rd1, %rd2;
  st.global.f32 [%rd3], %f2;
  ret;
}
"""

REDUCE = HEADER + r"""
.visible .entry reduce(.param .u64 out, .param .u32 iters, .param .u32 spread)
{
  .reg .b32 %r<12>;
  .reg .b64 %rd<4>;
  .reg .f32 %f<4>;
  .reg .pred %p<3>;
  .shared .align 4 .f32 partial[1024];
  ld.param.u64 %rd1, [out];
  ld.param.u32 %r1, [iters];
  mov.u32 %r2, %ctaid.x;
  mov.u32 %r3, %ntid.x;
  mov.u32 %r4, %tid.x;
  mov.u32 %r8, partial;
  shl.b32 %r9, %r4, 2;
  add.u32 %r9, %r8, %r9;          // &partial[tid]
  cvt.rn.f32.u32 %f1, %r4;
  mov.f32 %f3, 0f00000000;
  mov.u32 %r6, 0;
ROUND:
  st.shared.f32 [%r9], %f1;
  shr.u32 %r5, %r3, 1;            // stride
TREE:
  bar.sync 0;
  setp.lt.u32 %p2, %r4, %r5;
  @!%p2 bra SKIP;
  shl.b32 %r10, %r5, 2;
  add.u32 %r10, %r9, %r10;
  ld.shared.f32 %f2, [%r10];
  ld.shared.f32 %f0, [%r9];
  add.f32 %f0, %f0, %f2;
  st.shared.f32 [%r9], %f0;
SKIP:
  shr.u32 %r5, %r5, 1;
  setp.ne.u32 %p1, %r5, 0;
  @%p1 bra TREE;
  bar.sync 0;
  ld.shared.f32 %f2, [%r8];       // every thread reads the CTA's sum
  add.f32 %f3, %f3, %f2;
  add.f32 %f1, %f1, 0f3F800000;
  bar.sync 0;
  add.s32 %r6, %r6, 1;
  setp.lt.u32 %p1, %r6, %r1;
  @%p1 bra ROUND;
  mad.lo.s32 %r7, %r2, %r3, %r4;
  mul.wide.u32 %rd2, %r7, 4;
  add.s64 %rd3, %rd1, %rd2;
  st.global.f32 [%rd3], %f3;
  ret;
}
"""

PUBLISH = HEADER + r"""
.visible .entry publish(.param .u64 out, .param .u32 iters, .param .u32 spread)
{
  .reg .b32 %r<12>;
  .reg .b64 %rd<10>;
  .reg .f32 %f<4>;
  .reg .pred %p<4>;
  .shared .align 4 .u32 last;
  ld.param.u64 %rd1, [out];            // out: [iters] counters, then [iters][ctas * threads] values
  ld.param.u32 %r1, [iters];
  mov.u32 %r2, %ctaid.x;
  mov.u32 %r3, %ntid.x;
  mov.u32 %r4, %tid.x;
  mov.u32 %r10, %nctaid.x;
  mad.lo.s32 %r5, %r2, %r3, %r4;
  mul.lo.u32 %r11, %r10, %r3;          // values per round
  mul.wide.u32 %rd7, %r11, 4;          // bytes per round
  mul.wide.u32 %rd8, %r1, 4;
  add.s64 %rd8, %rd1, %rd8;            // this round's values
  mul.wide.u32 %rd2, %r5, 4;
  setp.eq.u32 %p1, %r4, 0;
  cvt.rn.f32.u32 %f1, %r5;
  mov.u32 %r6, 0;
ROUND:
  add.s64 %rd3, %rd8, %rd2;
  st.global.f32 [%rd3], %f1;
  membar.gl;
  bar.sync 0;
  @%p1 atom.global.add.u32 %r7, [%rd1], 1;     // this round's counter
  @%p1 st.shared.u32 [last], %r7;
  bar.sync 0;
  ld.shared.u32 %r7, [last];
  sub.u32 %r8, %r10, 1;
  setp.ne.u32 %p2, %r7, %r8;           // not the last CTA of this round
  @%p2 bra NEXT;
  membar.gl;
  mov.f32 %f2, 0f00000000;
  mov.u32 %r9, %r4;
SUM:                                   // the last CTA sums column tid of every CTA's values
  mul.wide.u32 %rd5, %r9, 4;
  add.s64 %rd6, %rd8, %rd5;
  ld.global.cg.f32 %f3, [%rd6];
  add.f32 %f2, %f2, %f3;
  add.u32 %r9, %r9, %r3;
  setp.lt.u32 %p3, %r9, %r11;
  @%p3 bra SUM;
NEXT:
  add.s64 %rd1, %rd1, 4;
  add.s64 %rd8, %rd8, %rd7;
  add.f32 %f1, %f1, 0f3F800000;
  add.s32 %r6, %r6, 1;
  setp.lt.u32 %p0, %r6, %r1;
  @%p0 bra ROUND;
  ret;
}
"""

KERNELS = {"loop": LOOP, "reduce": REDUCE, "publish": PUBLISH}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", choices=sorted(KERNELS), default="loop")
    ap.add_argument("--ctas", type=int, default=512)
    ap.add_argument("--threads", type=int, default=256)
    ap.add_argument("--iters", type=int, default=64)
    ap.add_argument("--spread", type=int, default=0)
    ap.add_argument("--no-sanitize", action="store_true")
    opts = ap.parse_args()
    ptx = KERNELS[opts.kernel]
    out = np.zeros((opts.ctas * opts.threads + 1) * opts.iters, np.float32)
    launch(ptx, opts.kernel, (1, 1, 1), (32, 1, 1), [np.zeros(33, np.float32), 1, 0])   # parse once
    start, cpu = time.perf_counter(), time.process_time()
    stats = launch(ptx, opts.kernel, (opts.ctas, 1, 1), (opts.threads, 1, 1),
                   [out, opts.iters, opts.spread], sanitize=not opts.no_sanitize)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    print(f"{opts.kernel}: {opts.ctas * opts.threads} threads, {stats.instructions} steps, "
          f"{stats.thread_instructions} thread-instructions in {seconds:.2f} s ({cpu:.2f} s CPU): "
          f"{stats.thread_instructions / cpu / 1e6:.1f} M thread-instructions per CPU second "
          f"(sanitize={not opts.no_sanitize})")


if __name__ == "__main__":
    main()
