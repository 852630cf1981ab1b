"""Throughput of the CPU PTX interpreter: thread-instructions per second on a large grid.

Usage: python bench/interp_speed.py [--ctas 512] [--threads 256] [--iters 64] [--spread 0]
                                    [--no-sanitize]
--spread M gives thread t a trip count of iters - (t & M), so loops diverge and reconverge.
"""
import argparse
import time

import numpy as np

from ptxgen.interp import launch

PTX = r"""
.version 8.0
.target sm_80
.address_size 64
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctas", type=int, default=512)
    ap.add_argument("--threads", type=int, default=256)
    ap.add_argument("--iters", type=int, default=64)
    ap.add_argument("--spread", type=int, default=0)
    ap.add_argument("--no-sanitize", action="store_true")
    opts = ap.parse_args()
    out = np.zeros(opts.ctas * opts.threads, np.float32)
    launch(PTX, "loop", (1, 1, 1), (32, 1, 1), [np.zeros(32, np.float32), 1, 0])   # parse once
    start = time.perf_counter()
    stats = launch(PTX, "loop", (opts.ctas, 1, 1), (opts.threads, 1, 1), [out, opts.iters, opts.spread],
                   sanitize=not opts.no_sanitize)
    seconds = time.perf_counter() - start
    rate = stats.thread_instructions / seconds
    print(f"{opts.ctas * opts.threads} threads, {stats.instructions} steps, "
          f"{stats.thread_instructions} thread-instructions in {seconds:.2f} s: "
          f"{rate / 1e6:.1f} M thread-instructions/s (sanitize={not opts.no_sanitize})")


if __name__ == "__main__":
    main()
