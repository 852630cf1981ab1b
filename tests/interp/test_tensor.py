"""ldmatrix and mma.sync m16n8k16 against numpy, with the PTX ISA fragment layouts."""
import numpy as np
import pytest

from ptxgen.errors import SanitizerError
from ptxgen.interp import launch
from interp_helpers import module

LDMATRIX_PTX = module("""
  .shared .align 16 .b8 tiles[512];
  .reg .b32 %lane, %s, %r<4>, %x<4>, %d<4>;
  .reg .b64 %src, %dst, %off;
  ld.param.u64 %src, [src];
  ld.param.u64 %dst, [dst];
  mov.u32 %lane, %laneid;
  mul.wide.u32 %off, %lane, 16;
  add.s64 %src, %src, %off;
  ld.global.v4.b32 {%x0, %x1, %x2, %x3}, [%src];
  mov.u32 %s, tiles;
  shl.b32 %r0, %lane, 4;
  add.u32 %r0, %s, %r0;
  st.shared.v4.b32 [%r0], {%x0, %x1, %x2, %x3};
  bar.warp.sync 0xffffffff;
  // lane 8i + r addresses row r of matrix i; matrices are stored one after another
  ldmatrix.sync.aligned.m8n8.x4{trans}.shared.b16 {%d0, %d1, %d2, %d3}, [%r0];
  mul.wide.u32 %off, %lane, 16;
  add.s64 %dst, %dst, %off;
  st.global.v4.b32 [%dst], {%d0, %d1, %d2, %d3};
  ret;
""", ".param .u64 src, .param .u64 dst")


@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_x4_layout(trans):
    mats = np.arange(4 * 64, dtype=np.uint16).reshape(4, 8, 8)      # 4 matrices, 8 rows of 8
    out = np.zeros((32, 4), np.uint32)
    launch(LDMATRIX_PTX.replace("{trans}", ".trans" if trans else ""), "k", (1, 1, 1), (32, 1, 1),
           [mats.copy(), out])
    for lane in range(32):
        row, col = lane // 4, 2 * (lane % 4)
        for i in range(4):
            m = mats[i].T if trans else mats[i]
            want = int(m[row, col]) | int(m[row, col + 1]) << 16
            assert out[lane, i] == want, (lane, i)


def test_ldmatrix_of_a_partial_warp_is_a_finding():
    """Two CTAs of 16 threads make one wave of 32 threads, but no warp of 32: ldmatrix needs one."""
    mats = np.arange(4 * 64, dtype=np.uint16).reshape(4, 8, 8)
    with pytest.raises(SanitizerError, match="ldmatrix: needs a full warp of 32 threads"):
        launch(LDMATRIX_PTX.replace("{trans}", ""), "k", (2, 1, 1), (16, 1, 1),
               [mats.copy(), np.zeros((32, 4), np.uint32)])


MMA_PTX = module("""
  .shared .align 16 .b8 sa[512];
  .shared .align 16 .b8 sb[256];
  .reg .b32 %lane, %g, %t, %s, %r<6>, %x<4>, %a<4>, %b<2>;
  .reg .f32 %c<4>, %d<4>;
  .reg .b64 %A, %B, %C, %D, %off;
  .reg .pred %p;
  ld.param.u64 %A, [pa];
  ld.param.u64 %B, [pb];
  ld.param.u64 %C, [pc];
  ld.param.u64 %D, [pd];
  mov.u32 %lane, %laneid;
  // stage A (16x16, row-major) and B (16x8, k-major) in shared memory, 16 bytes per lane
  mul.wide.u32 %off, %lane, 16;
  add.s64 %A, %A, %off;
  ld.global.v4.b32 {%x0, %x1, %x2, %x3}, [%A];
  mov.u32 %s, sa;
  shl.b32 %r0, %lane, 4;
  add.u32 %r1, %s, %r0;
  st.shared.v4.b32 [%r1], {%x0, %x1, %x2, %x3};
  setp.lt.u32 %p, %lane, 16;
  @%p add.s64 %B, %B, %off;
  @%p ld.global.v4.b32 {%x0, %x1, %x2, %x3}, [%B];
  mov.u32 %s, sb;
  add.u32 %r1, %s, %r0;
  @%p st.shared.v4.b32 [%r1], {%x0, %x1, %x2, %x3};
  bar.warp.sync 0xffffffff;
  // A fragments: lane l addresses row l % 16, column block l / 16
  and.b32 %r2, %lane, 15;
  shl.b32 %r2, %r2, 5;
  shr.u32 %r3, %lane, 4;
  shl.b32 %r3, %r3, 4;
  add.u32 %r2, %r2, %r3;
  mov.u32 %s, sa;
  add.u32 %r2, %s, %r2;
  ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%a0, %a1, %a2, %a3}, [%r2];
  // B fragments: transpose k-major rows, lanes 0..15 address rows k = 0..15
  and.b32 %r4, %lane, 15;
  shl.b32 %r4, %r4, 4;
  mov.u32 %s, sb;
  add.u32 %r4, %s, %r4;
  ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%b0, %b1}, [%r4];
  // C/D fragments: c0,c1 = row g, cols 2t,2t+1; c2,c3 = row g+8
  shr.u32 %g, %lane, 2;
  and.b32 %t, %lane, 3;
  shl.b32 %r5, %g, 3;
  mad.lo.u32 %r5, %t, 2, %r5;
  mul.wide.u32 %off, %r5, 4;
  add.s64 %C, %C, %off;
  add.s64 %D, %D, %off;
  ld.global.v2.f32 {%c0, %c1}, [%C];
  ld.global.v2.f32 {%c2, %c3}, [%C+256];
  mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32 {%d0, %d1, %d2, %d3}, {%a0, %a1, %a2, %a3}, {%b0, %b1}, {%c0, %c1, %c2, %c3};
  st.global.v2.f32 [%D], {%d0, %d1};
  st.global.v2.f32 [%D+256], {%d2, %d3};
  ret;
""", ".param .u64 pa, .param .u64 pb, .param .u64 pc, .param .u64 pd")


def to_bf16_bits(x):
    return (np.asarray(x, np.float32).view(np.uint32) >> 16).astype(np.uint16)   # exact inputs only


def run_mma(kind, a, b, c, **options):
    d = np.zeros((16, 8), np.float32)
    bits = (lambda x: x.astype(np.float16)) if kind == "f16" else to_bf16_bits
    launch(MMA_PTX.replace("{kind}", kind), "k", (1, 1, 1), (32, 1, 1),
           [bits(a), bits(b), c.astype(np.float32), d], **options)
    return d


@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_mma_exact_on_small_integers(kind):
    rng = np.random.default_rng(7)
    a = rng.integers(-4, 5, (16, 16)).astype(np.float32)
    b = rng.integers(-4, 5, (16, 8)).astype(np.float32)
    c = rng.integers(-50, 50, (16, 8)).astype(np.float32)
    d = run_mma(kind, a, b, c)
    assert np.array_equal(d, a @ b + c)


def test_mma_f16_random_within_the_measured_bound():
    """Pessimistic accumulation: |D - (AB + C)| <= 3.6 * 2^-24 * (sum |a b| + |c|) (the H100's
    worst case), and like the H100's, many outputs differ from the exact sum rounded once."""
    rng = np.random.default_rng(8)
    a = rng.standard_normal((16, 16)).astype(np.float16)
    b = rng.standard_normal((16, 8)).astype(np.float16)
    c = rng.standard_normal((16, 8)).astype(np.float32)
    d = run_mma("f16", a, b, c).astype(np.float64)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = a64 @ b64 + c
    bound = 3.6 * 2.0**-24 * (np.abs(a64) @ np.abs(b64) + np.abs(c))
    assert (np.abs(d - want) <= bound).all()
    assert np.mean(d != want.astype(np.float32)) > 0.3
    assert np.array_equal(run_mma("f16", a, b, c, approx="exact"), want.astype(np.float32))
    # a function of the products: a row of A that is zero where B changes gives the same output
    a[0, 8:] = 0
    first = run_mma("f16", a, b, c)
    b[8:, :] = rng.standard_normal((8, 8)).astype(np.float16)
    assert np.array_equal(run_mma("f16", a, b, c)[0], first[0])
