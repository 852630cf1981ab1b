"""sm_90a instructions against numpy: wgmma with every shared-memory layout and swizzle mode,
mbarrier phases, cp.async.bulk and cp.async handed to mbarriers, setmaxnreg, elect.sync; and
planted bugs in their asynchrony that the sanitizer (or the deadlock check) must catch.

Layouts here are written from the PTX ISA's canonical-layout table in CuTe form (element
units, T = 8 16-bit elements per 16 bytes), independently of the interpreter's formulas."""
import re

import numpy as np
import pytest

from ptxgen.errors import InterpError, SanitizerError
from ptxgen.interp import launch
from interp_helpers import HEADER

SM90A = HEADER.replace("8.0\n.target sm_80", "8.0\n.target sm_90a")
SWIZZLE_MODE = {0: 0, 128: 1, 64: 2, 32: 3}          # descriptor bits 62-63


def cute(coord, shape, stride):
    """Offset of an integer coordinate in a (possibly nested, flat here) CuTe mode."""
    offset = 0
    for extent, step in zip(shape, stride):
        offset += coord % extent * step
        coord //= extent
    return offset


def canonical(mn_major, width, lbo, sbo):
    """(row shape, row stride, k shape, k stride) in elements (PTX ISA, Canonical Layouts)."""
    lbo, sbo = lbo // 2, sbo // 2
    if not mn_major:
        if width == 0:
            return (8, 1 << 20), (8, sbo), (8, 1 << 20), (1, lbo)
        return (8, 1 << 20), (width // 2, sbo), (8, 1 << 20), (1, 8)
    if width == 0:
        return (8, 1 << 20), (1, sbo), (8, 1 << 20), (8, lbo)
    return (8, width // 16, 1 << 20), (1, 8, lbo), (8, 1 << 20), (width // 2, sbo)


def swizzle(byte, width):
    """The 16-byte chunk within each `width`-byte span is XORed with the 128-byte line index
    (mod width/16): Swizzle<log2(width/16), 4, 3> on byte addresses."""
    if width == 0:
        return byte
    chunks = width // 16
    return byte ^ ((byte // 128) % chunks) * 16


def place(image, matrix, base, mn_major, width, lbo, sbo):
    """Store matrix [rows, k] (16-bit) into the shared-memory image at base."""
    row_shape, row_stride, k_shape, k_stride = canonical(mn_major, width, lbo, sbo)
    bits = matrix.view(np.uint16)
    for r in range(matrix.shape[0]):
        for k in range(matrix.shape[1]):
            byte = base + 2 * (cute(r, row_shape, row_stride) + cute(k, k_shape, k_stride))
            image[swizzle(byte, width) // 2] = bits[r, k]


def descriptor(start, lbo, sbo, width):
    return (start >> 4) | (lbo >> 4) << 16 | (sbo >> 4) << 32 | SWIZZLE_MODE[width] << 62


def accumulator_layout(n):
    """(row, col) of accumulator register i of warpgroup thread q (CUTLASS CLayout_64xN)."""
    q, i = np.meshgrid(np.arange(128), np.arange(n // 2), indexing="ij")
    row = q % 32 // 4 + 16 * (q // 32) + 8 * (i // 2 % 2)
    col = 2 * (q % 4) + i % 2 + 8 * (i // 4)
    return row, col


def a_fragments(a):
    """Per warpgroup thread, the four .b32 A-fragment registers of a 64x16 16-bit matrix."""
    q, h = np.meshgrid(np.arange(128), np.arange(8), indexing="ij")
    row = q % 32 // 4 + 16 * (q // 32) + 8 * (h // 2 % 2)
    col = 2 * (q % 4) + h % 2 + 8 * (h // 4)
    return np.ascontiguousarray(a.view(np.uint16)[row, col]).view(np.uint32)


# Where a kernel keeps its tiles (SHARED_LAYOUTS[name]): a static array, or the .extern array
# behind a static mbarrier word, its base used as is or rounded up to 1024 bytes at run time.
ROUND_UP = "\n  add.u32 %s, %s, 1023;\n  and.b32 %s, %s, -1024;"
SHARED_LAYOUTS = {
    "static": ("", "  .shared .align 1024 .b8 smem[SIZE];", ""),
    "extern": (".shared .align 8 .b64 bar;\n.extern .shared .align 1024 .b8 smem[];\n", "", ""),
    "extern rounded up": (".shared .align 8 .b64 bar;\n.extern .shared .align 16 .b8 smem[];\n", "", ROUND_UP),
}
EXTERN_SLACK = 1024 - 16         # what rounding a 16-byte-aligned base up to 1024 may skip


def wgmma_kernel(n, steps, kind, trans_a=0, trans_b=0, registers_a=False, size=16384, scale_a=1, body="",
                 layout="static"):
    """One warpgroup copies a shared-memory image in, then accumulates `steps` wgmmas whose
    descriptors come from a global array (A from registers: per step, from `frags`)."""
    module, declaration, round_up = SHARED_LAYOUTS[layout]
    # the static mbarrier in front of smem[] is used, so that it is laid out there
    init = "\n  setp.eq.u32 %done, %t, 0;\n  @%done mbarrier.init.shared::cta.b64 [bar], 1;" if module else ""
    d = ", ".join(f"%d{i}" for i in range(n // 2))
    loads, mmas = [], []
    for s in range(steps):
        loads.append(f"  ld.global.u64 %da{s}, [%descs+{16 * s}];")
        loads.append(f"  ld.global.u64 %db{s}, [%descs+{16 * s + 8}];")
        loads.append(f"  add.u64 %da{s}, %da{s}, %base;")  # the host encoded offsets from smem
        loads.append(f"  add.u64 %db{s}, %db{s}, %base;")
        a_regs = ", ".join(f"%a{4 * s + j}" for j in range(4))
        if registers_a:
            loads.append(f"  ld.global.v4.b32 {{{a_regs}}}, [%frag+{2048 * s}];")
            a, trans = f"{{{a_regs}}}", f"{trans_b}"
        else:
            a, trans = f"%da{s}", f"{trans_a}, {trans_b}"
        mmas.append(f"  wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{kind}.{kind} {{{d}}}, {a}, %db{s}, "
                    f"{int(s > 0)}, {scale_a}, 1, {trans};")
    stores = "\n".join(f"  st.global.f32 [%out+{4 * i}], %d{i};" for i in range(n // 2))
    return SM90A + module + f""".visible .entry k(.param .u64 img, .param .u64 descs, .param .u64 frags,
                          .param .u64 out, .param .u32 nbytes)
.maxntid 128, 1, 1
{{
{declaration.replace("SIZE", str(size))}
  .reg .b32 %t, %i, %n, %s, %w<4>, %a<{4 * steps}>;
  .reg .b64 %img, %descs, %frag, %out, %p, %base, %da<{steps}>, %db<{steps}>;
  .reg .f32 %d<{n // 2}>;
  .reg .pred %done;
  ld.param.u64 %img, [img];
  ld.param.u64 %descs, [descs];
  ld.param.u64 %frag, [frags];
  ld.param.u64 %out, [out];
  ld.param.u32 %n, [nbytes];
  mov.u32 %s, smem;{round_up}
  cvt.u64.u32 %base, %s;
  shr.u64 %base, %base, 4;  // descriptor start addresses are shared addresses / 16
  mov.u32 %t, %tid.x;{init}
  shl.b32 %i, %t, 4;
COPY:
  setp.ge.u32 %done, %i, %n;
  @%done bra COPIED;
  cvt.u64.u32 %p, %i;
  add.u64 %p, %img, %p;
  ld.global.v4.b32 {{%w0, %w1, %w2, %w3}}, [%p];
  mov.u32 %s, smem;{round_up}
  add.u32 %s, %s, %i;
  st.shared.v4.b32 [%s], {{%w0, %w1, %w2, %w3}};
  add.u32 %i, %i, 2048;
  bra COPY;
COPIED:
  bar.sync 0;
  fence.proxy.async.shared::cta;
  mul.wide.u32 %p, %t, 16;
  add.u64 %frag, %frag, %p;
  mul.wide.u32 %p, %t, {2 * n};
  add.u64 %out, %out, %p;
{chr(10).join(loads)}
{body}
  wgmma.fence.sync.aligned;
{chr(10).join(mmas)}
  wgmma.commit_group.sync.aligned;
  wgmma.wait_group.sync.aligned 0;
{stores}
  ret;
}}
"""


def dtype_of(kind):
    return np.float16 if kind == "f16" else np.uint16


def as_kind(values, kind):
    """float64 values exactly representable in f16 and bf16 (small integers / 8), as kind."""
    if kind == "f16":
        return values.astype(np.float16)
    return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def run_wgmma(kind, n, steps, a_layout, b_layout, registers_a=False, size=16384, scale_a=1, layout="static"):
    """a_layout/b_layout: (mn_major, swizzle width, lbo, sbo, step advance in bytes) of A
    [64, 16 steps] at byte 0 and B [n, 16 steps] in the upper half of shared memory."""
    rng = np.random.default_rng(n * 7 + steps)
    a = rng.integers(-8, 9, (64, 16 * steps)) / 8
    b = rng.integers(-8, 9, (n, 16 * steps)) / 8
    image = np.zeros(size // 2, np.uint16)
    descs = np.zeros((steps, 2), np.uint64)
    frags = np.zeros((steps, 128, 4), np.uint32)
    for operand, matrix, base, col in ((a_layout, a, 0, 0), (b_layout, b, size // 2, 1)):
        mn_major, width, lbo, sbo, advance = operand
        place(image, as_kind(matrix, kind), base, mn_major, width, lbo, sbo)
        for s in range(steps):
            descs[s, col] = descriptor(base + s * advance, lbo, sbo, width)
    for s in range(steps):
        frags[s] = a_fragments(as_kind(a[:, 16 * s:16 * s + 16], kind))
    out = np.full((128, n // 2), np.nan, np.float32)
    ptx = wgmma_kernel(n, steps, kind, trans_a=a_layout[0], trans_b=b_layout[0], registers_a=registers_a,
                       size=size, scale_a=scale_a, layout=layout)
    dynamic = 0 if layout == "static" else size + EXTERN_SLACK
    launch(ptx, "k", (1, 1, 1), (128, 1, 1), [image, descs, frags, out, image.nbytes], dynamic_shared=dynamic)
    row, col = accumulator_layout(n)
    want = scale_a * (a @ b.T)[row, col]
    np.testing.assert_array_equal(out, want.astype(np.float32))


K_MAJOR = {  # (mn_major, width, lbo, sbo, advance per k-step): dense tiles of 8-row groups
    0: (0, 0, 128, 256, 256 * 8),   # core matrices 8 x 16 B; k halves 128 B apart
    32: (0, 32, 16, 256, 256 * 8),
    64: (0, 64, 16, 512, 512 * 8),
    128: (0, 128, 16, 1024, 32),     # k-steps advance 32 B inside the 128-byte row
}
MN_MAJOR = {
    0: (1, 0, 2048, 128, 4096),      # 8x8 cores: MN blocks 128 B apart, k halves 2 KB apart
    32: (1, 32, 512, 256, 512),
    64: (1, 64, 1024, 512, 1024),
    128: (1, 128, 2048, 1024, 2048),
}


@pytest.mark.parametrize("kind", ["f16", "bf16"])
@pytest.mark.parametrize("width", [0, 32, 64, 128])
def test_wgmma_k_major_descriptors(kind, width):
    steps = 4 if width == 128 else 1
    run_wgmma(kind, 64, steps, K_MAJOR[width], K_MAJOR[width])


@pytest.mark.parametrize("width", [0, 32, 64, 128])
def test_wgmma_mn_major_descriptors(width):
    run_wgmma("bf16", 64, 1, MN_MAJOR[width], MN_MAJOR[width])


@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_wgmma_register_a_and_n_major_b(kind):
    # P @ V of attention: A from registers, B = V rows [key][dim] (N-major), 128B swizzle,
    # N = 128 spans two 64-element swizzle atoms (LBO apart)
    run_wgmma(kind, 128, 2, K_MAJOR[128], (1, 128, 8192, 1024, 2048), registers_a=True, size=32768)


@pytest.mark.parametrize("layout", ["extern", "extern rounded up"])
def test_swizzled_tiles_in_the_extern_array_need_its_base_rounded_up(layout):
    """flash_attention_sm90a's bug on an H100: its tiles, 128-byte swizzled, sat in an
    `.extern .shared .align 1024` array behind the mbarriers, which nvJitLink 13.0 placed at 0x450
    (16-byte aligned: the .align was ignored); wgmma swizzles by address bits 7-9 and its
    descriptors carry no base offset, so every row was read with the wrong chunk order. The
    interpreter lays shared memory out the same way (static data from 0x400, the .extern array
    16-byte aligned), so the unrounded form fails here too; rounding the base up to 1024 at run
    time (with the slack in the launch's dynamic shared memory) works on any toolchain."""
    def p_v():  # P V's operands as the kernel has them: P from registers, V rows [key][dim]
        run_wgmma("f16", 64, 2, K_MAJOR[128], (1, 128, 8192, 1024, 2048), registers_a=True, size=8192 * 2,
                  layout=layout)
    if layout == "extern rounded up":
        p_v()
    else:
        with pytest.raises(AssertionError, match="Mismatched elements"):
            p_v()


def test_wgmma_n8_with_negated_a():
    run_wgmma("f16", 8, 1, K_MAJOR[128], K_MAJOR[128], scale_a=-1)


def test_wgmma_accumulates_across_groups_and_regions():
    # two commit groups, the second waited with wait_group 1 then 0, over 128B-swizzled tiles
    run_wgmma("bf16", 16, 3, K_MAJOR[128], K_MAJOR[128])


# ---- planted bugs in wgmma use -----------------------------------------------------------
def planted(ptx, args, what, block=(128, 1, 1), grid=(1, 1, 1)):
    """The launch must fail on the line marked // BUG with a message matching `what`."""
    lines = ptx.splitlines()
    line = next(i + 1 for i, text in enumerate(lines) if "// BUG" in text)
    with pytest.raises(SanitizerError) as err:
        launch(ptx, "k", grid, block, args, kernel_name="planted")
    msg = str(err.value)
    assert msg.startswith(f"planted: line {line}: `{lines[line - 1].split('//')[0].strip()}`"), msg
    assert re.search(what, msg), msg
    return msg


def wgmma_args(n=64):
    image = np.zeros(8192, np.uint16)
    place(image, as_kind(np.ones((64, 16)), "f16"), 0, 0, 128, 16, 1024)
    place(image, as_kind(np.ones((n, 16)), "f16"), 8192, 0, 128, 16, 1024)
    descs = np.array([[descriptor(0, 16, 1024, 128), descriptor(8192, 16, 1024, 128)]], np.uint64)
    return [image, descs, np.zeros((128, 4), np.uint32), np.zeros((128, n // 2), np.float32), image.nbytes]


def test_reading_accumulators_before_wait_group_is_caught():
    ptx = wgmma_kernel(64, 1, "f16")
    ptx = ptx.replace("  wgmma.wait_group.sync.aligned 0;\n", "")
    ptx = ptx.replace("st.global.f32 [%out+0], %d0;", "st.global.f32 [%out+0], %d0;  // BUG")
    planted(ptx, wgmma_args(), r"read of register %d0 while the wgmma.mma_async on line \d+ that "
                               r"uses it is in flight \(no wgmma.wait_group since\)")


def test_writing_an_in_flight_accumulator_is_caught():
    ptx = wgmma_kernel(64, 1, "f16").replace(
        "  wgmma.commit_group.sync.aligned;", "  mov.f32 %d5, 0f00000000;  // BUG\n  wgmma.commit_group.sync.aligned;")
    planted(ptx, wgmma_args(), r"writes %d5, a register operand of the wgmma.mma_async on line \d+ "
                               "that is still in flight")


def test_reading_accumulators_then_a_wgmma_without_wgmma_fence_is_caught():
    """PTX ISA, wgmma.fence: it must separate any register access (a read too, not only a write)
    by the warpgroup's threads from a later wgmma.mma_async using the register. Here the stores
    read %d after wait_group, and a second wgmma accumulates into %d with no fence between."""
    ptx = wgmma_kernel(64, 1, "f16")
    mma = next(line for line in ptx.splitlines() if "wgmma.mma_async" in line)
    again = mma.replace(", 0, 1, 1, 0, 0;", ", 1, 1, 1, 0, 0;  // BUG")
    ptx = ptx.replace("  ret;\n}", f"{again}\n  wgmma.commit_group.sync.aligned;\n"
                      "  wgmma.wait_group.sync.aligned 0;\n  ret;\n}")
    planted(ptx, wgmma_args(), r"wgmma.mma_async uses %d\d+, read by an ordinary instruction after this "
                               "warpgroup's last wgmma.fence")


def test_reading_accumulators_then_a_fenced_wgmma_is_clean():
    ptx = wgmma_kernel(64, 1, "f16")
    mma = next(line for line in ptx.splitlines() if "wgmma.mma_async" in line)
    again = mma.replace(", 0, 1, 1, 0, 0;", ", 1, 1, 1, 0, 0;")
    ptx = ptx.replace("  ret;\n}", f"  wgmma.fence.sync.aligned;\n{again}\n  wgmma.commit_group.sync.aligned;\n"
                      "  wgmma.wait_group.sync.aligned 0;\n  ret;\n}")
    launch(ptx, "k", (1, 1, 1), (128, 1, 1), wgmma_args(), kernel_name="clean")


def test_missing_wgmma_fence_is_caught():
    ptx = wgmma_kernel(64, 1, "f16").replace("  wgmma.fence.sync.aligned;\n", "")
    ptx = ptx.replace(", 0, 1, 1, 0, 0;", ", 0, 1, 1, 0, 0;  // BUG")
    planted(ptx, wgmma_args(), "wgmma.mma_async with no wgmma.fence before it")
    # an accumulator set by an ordinary instruction after the last fence
    body = "  wgmma.fence.sync.aligned;\n  mov.f32 %d3, 0f3F800000;"
    ptx = wgmma_kernel(64, 1, "f16", body=body).replace(", 0, 1, 1, 0, 0;", ", 0, 1, 1, 0, 0;  // BUG")
    ptx = ptx.replace("  wgmma.fence.sync.aligned;\n  wgmma.mma_async", "  wgmma.mma_async")
    planted(ptx, wgmma_args(), "uses %d3, written by an ordinary instruction after this warpgroup's last wgmma.fence")


@pytest.mark.parametrize("fence", ["", "  fence.proxy.async.global;\n"])   # none, or one for global memory only
def test_missing_proxy_fence_after_ordinary_stores_is_caught(fence):
    ptx = wgmma_kernel(64, 1, "f16").replace("  fence.proxy.async.shared::cta;\n", fence)
    ptx = ptx.replace(", 0, 1, 1, 0, 0;", ", 0, 1, 1, 0, 0;  // BUG")
    planted(ptx, wgmma_args(), r"wgmma.mma_async reads shared byte \d+ \(smem\+\d+\), written through the "
                               r"generic proxy by thread \(\d+,0,0\), with no fence.proxy.async in between")


def test_wgmma_reading_shared_memory_nobody_wrote_is_caught():
    ptx = wgmma_kernel(64, 1, "f16").replace("setp.ge.u32 %done, %i, %n;", "setp.ge.u32 %done, %i, 1024;")
    ptx = ptx.replace(", 0, 1, 1, 0, 0;", ", 0, 1, 1, 0, 0;  // BUG")
    planted(ptx, wgmma_args(), r"wgmma.mma_async reads shared byte \d+ \(smem\+\d+\), which no thread of this CTA "
                               r"has written \(shared memory starts undefined\)")


def test_missing_barrier_before_wgmma_reads_other_threads_stores_is_caught():
    ptx = wgmma_kernel(64, 1, "f16").replace("  bar.sync 0;\n", "")
    ptx = ptx.replace(", 0, 1, 1, 0, 0;", ", 0, 1, 1, 0, 0;  // BUG")
    planted(ptx, wgmma_args(), r"written by thread \(\d+,0,0\), with no mbarrier wait or bar.sync")


# ---- a producer/consumer GEMM pipeline: bulk copies or cp.asyncs, mbarriers, wgmma -------
def stage_wait(barriers, reg, label, producer):
    """PTX: stage = round % 2, then wait on barriers[stage] for this round's phase (parity
    round / 2 % 2); the producer waits for the phase before it (the other parity), so its first
    round passes at once."""
    flip = "  xor.b32 %par, %par, 1;\n" if producer else ""
    return f"""  and.b32 %stage, %r, 1;
  shr.u32 %par, %r, 1;
  and.b32 %par, %par, 1;
{flip}  mov.u32 {reg}, {barriers};
  mad.lo.u32 {reg}, %stage, 8, {reg};
{label}:
  mbarrier.try_wait.parity.shared::cta.b64 %ok, [{reg}], %par;
  @!%ok bra {label};
"""


PIPELINE = SM90A + """.visible .entry k(.param .u64 tiles, .param .u64 descs, .param .u64 out, .param .u32 rounds)
.maxntid 256, 1, 1
{
  .shared .align 1024 .b8 buf[8192];
  .shared .align 8 .b64 full[2];
  .shared .align 8 .b64 empty[2];
  .reg .b32 %t, %r, %n, %stage, %par, %f, %e, %dst;
  .reg .b64 %tiles, %descs, %out, %src, %off, %da, %db, %a, %b, %base;
  .reg .f32 %d<32>;
  .reg .pred %p, %ok, %acc;
  ld.param.u64 %tiles, [tiles];
  ld.param.u64 %descs, [descs];
  ld.param.u64 %out, [out];
  ld.param.u32 %n, [rounds];
  mov.u32 %t, %tid.x;
  setp.eq.u32 %p, %t, 0;
  @!%p bra INITIALISED;
  mbarrier.init.shared::cta.b64 [full], ARRIVALS;
  mbarrier.init.shared::cta.b64 [full+8], ARRIVALS;
  mbarrier.init.shared::cta.b64 [empty], 128;
  mbarrier.init.shared::cta.b64 [empty+8], 128;
INITIALISED:
  bar.sync 0;
  mov.u32 %r, 0;
  setp.ge.u32 %p, %t, 128;
  @%p bra CONSUMER;
PRODUCER
  bra DONE;
CONSUMER:
  ld.global.u64 %da, [%descs];
  ld.global.u64 %db, [%descs+8];
  mov.u32 %f, buf;
  cvt.u64.u32 %base, %f;
  shr.u64 %base, %base, 4;  // descriptor start addresses are shared addresses / 16
  add.u64 %da, %da, %base;
  add.u64 %db, %db, %base;
CONSUME:
WAIT_FOR_FULL
  fence.proxy.async.shared::cta;
  mul.wide.u32 %off, %stage, 256;
  add.s64 %a, %da, %off;
  add.s64 %b, %db, %off;
  setp.ne.u32 %acc, %r, 0;
  wgmma.fence.sync.aligned;
  wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {DREGS}, %a, %b, %acc, 1, 1, 0, 0;
  wgmma.commit_group.sync.aligned;
  wgmma.wait_group.sync.aligned 0;
  mov.u32 %e, empty;
  mad.lo.u32 %e, %stage, 8, %e;
  mbarrier.arrive.shared::cta.b64 _, [%e];
  add.u32 %r, %r, 1;
  setp.lt.u32 %p, %r, %n;
  @%p bra CONSUME;
  sub.u32 %t, %t, 128;
  mul.wide.u32 %off, %t, 128;
  add.u64 %out, %out, %off;
  mov.u32 %t, %ctaid.x;
  mul.wide.u32 %off, %t, 16384;  // each CTA its own 128 rows of out
  add.u64 %out, %out, %off;
STORES
DONE:
  ret;
}
""".replace("DREGS", ", ".join(f"%d{i}" for i in range(32))).replace(
    "STORES", "\n".join(f"  st.global.f32 [%out+{4 * i}], %d{i};" for i in range(32))).replace(
    "WAIT_FOR_FULL\n", stage_wait("full", "%f", "WAIT_FULL", producer=False))

WAIT_EMPTY = "PRODUCE:\n" + stage_wait("empty", "%e", "WAIT_EMPTY", producer=True) + """  mov.u32 %f, full;
  mad.lo.u32 %f, %stage, 8, %f;
  mov.u32 %dst, buf;
  mad.lo.u32 %dst, %stage, 4096, %dst;
  mul.wide.u32 %off, %r, 4096;
  add.u64 %src, %tiles, %off;
"""
NEXT_ROUND = """  add.u32 %r, %r, 1;
  setp.lt.u32 %p, %r, %n;
  @%p bra PRODUCE;"""
BULK_PRODUCER = """  setp.ne.u32 %p, %t, 0;
  @%p bra DONE;
""" + WAIT_EMPTY + """  mbarrier.arrive.expect_tx.shared::cta.b64 _, [%f], 4096;
  cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%dst], [%src], 4096, [%f];
""" + NEXT_ROUND
COPY_PRODUCER = WAIT_EMPTY + """  mad.lo.u32 %dst, %t, 16, %dst;
  mul.wide.u32 %off, %t, 16;
  add.u64 %src, %src, %off;
  cp.async.cg.shared.global [%dst], [%src], 16;
  cp.async.cg.shared.global [%dst+2048], [%src+2048], 16;
  cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%f];
""" + NEXT_ROUND


def pipeline(copies):
    if copies == "bulk":
        return PIPELINE.replace("ARRIVALS", "1").replace("PRODUCER", BULK_PRODUCER)
    return PIPELINE.replace("ARRIVALS", "128").replace("PRODUCER", COPY_PRODUCER)


def pipeline_args(rounds=5, ctas=1):
    """Round r streams A_r (64x16) and B_r (64x16), 32B-swizzled K-major, through two stages."""
    rng = np.random.default_rng(rounds)
    a = rng.integers(-8, 9, (rounds, 64, 16)) / 8
    b = rng.integers(-8, 9, (rounds, 64, 16)) / 8
    tiles = np.zeros((rounds, 2048), np.uint16)
    for r in range(rounds):
        place(tiles[r], as_kind(a[r], "bf16"), 0, 0, 32, 16, 256)
        place(tiles[r], as_kind(b[r], "bf16"), 2048, 0, 32, 16, 256)
    descs = np.array([descriptor(0, 16, 256, 32), descriptor(2048, 16, 256, 32)], np.uint64)
    out = np.full((ctas, 128, 32), np.nan, np.float32)
    row, col = accumulator_layout(64)
    want = np.einsum("rmk,rnk->mn", a, b)[row, col]
    return [tiles, descs, out, rounds], want


@pytest.mark.parametrize("copies", ["bulk", "cp.async"])
def test_pipeline_streams_tiles_through_mbarriers(copies):
    args, want = pipeline_args(ctas=2)
    launch(pipeline(copies), "k", (2, 1, 1), (256, 1, 1), args)
    for out in args[2]:  # two CTAs, each its own pipeline
        np.testing.assert_array_equal(out, want.astype(np.float32))


def test_cp_async_arrivals_count_when_their_copies_land():
    # without .noinc each thread's arrive-on is no net arrival: the full phase never completes, and
    # the producer waits forever for the consumers to free the stage
    ptx = mark(pipeline("cp.async").replace("cp.async.mbarrier.arrive.noinc.shared", "cp.async.mbarrier.arrive.shared"),
               "  mbarrier.try_wait.parity.shared::cta.b64 %ok, [%e], %par;")
    planted(ptx, pipeline_args()[0], "deadlock: threads wait on an mbarrier phase that never completes",
            block=(256, 1, 1))
    # 128 producer threads arrive on a phase that expects 64
    ptx = mark(pipeline("cp.async").replace("[full], 128;", "[full], 64;"), "  cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%f];")
    planted(ptx, pipeline_args()[0], r"more arrivals on the mbarrier at shared byte \d+ than its phase expects \(64\)",
            block=(256, 1, 1))


def test_bulk_copies_need_no_proxy_fence():
    args, want = pipeline_args(3)
    launch(pipeline("bulk").replace("  fence.proxy.async.shared::cta;\n", ""), "k", (1, 1, 1), (256, 1, 1), args)
    np.testing.assert_array_equal(args[2][0], want.astype(np.float32))


def mark(ptx, text, new=None):
    """Replace `text` (which must occur) by `new`, marking it as the planted bug."""
    assert text in ptx, text
    return ptx.replace(text, (new or text) + "  // BUG", 1)


@pytest.mark.parametrize("copies", ["bulk", "cp.async"])
def test_consumer_reading_before_its_mbarrier_wait_is_caught(copies):
    ptx = pipeline(copies).replace("  @!%ok bra WAIT_FULL;\n", "").replace(
        "  mbarrier.try_wait.parity.shared::cta.b64 %ok, [%f], %par;\n", "", 1)
    ptx = mark(ptx, "%a, %b, %acc, 1, 1, 0, 0;")       # no wait: the copies have not landed
    planted(ptx, pipeline_args()[0], r"wgmma.mma_async reads shared byte \d+ \(buf\+\d+\),? while the async "
                                     r"copy on line \d+ writing it is in flight", block=(256, 1, 1))


@pytest.mark.parametrize("copies", ["bulk", "cp.async"])
def test_a_consumer_ignoring_its_try_wait_after_a_copy_is_caught(copies):
    """The first wait after a bulk copy or a cp.async.mbarrier.arrive answers false (the copies land,
    and the arrive-on is made, when a wait is retried), so a consumer that polls once and reads on
    is caught even when the producer ran ahead and every arrival instruction has executed."""
    ptx = mark(pipeline(copies).replace("  @!%ok bra WAIT_FULL;\n", ""), "%a, %b, %acc, 1, 1, 0, 0;")
    planted(ptx, pipeline_args()[0], r"wgmma.mma_async reads shared byte \d+ \(buf\+0\) while the async copy on "
                                     r"line \d+ writing it is in flight", block=(256, 1, 1))


def test_relaxed_mbarrier_operations_order_nothing():
    # a relaxed wait acquires nothing: the wgmma reads the copies without having acquired them
    wait = "  mbarrier.try_wait.parity.shared::cta.b64 %ok, [%f], %par;\n"
    ptx = mark(pipeline("bulk").replace(wait, wait.replace("parity.", "parity.relaxed.cta.")), "%a, %b, %acc, 1, 1, 0, 0;")
    planted(ptx, pipeline_args()[0], r"wgmma.mma_async reads shared byte \d+ \(buf\+\d+\), written by the async copy "
                                     r"on line \d+, with no mbarrier wait or bar.sync ordering that write", block=(256, 1, 1))
    # a relaxed arrive releases nothing: the producer's refill is ordered after neither the
    # consumers' reads nor the copy before it
    arrive = "  mbarrier.arrive.shared::cta.b64 _, [%e];\n"
    ptx = pipeline("cp.async").replace(arrive, arrive.replace("arrive.", "arrive.relaxed.cta."))
    ptx = mark(ptx, next(text for text in ptx.splitlines() if "cp.async.cg.shared.global [%dst], [%src], 16;" in text))
    planted(ptx, pipeline_args()[0], r"overwrites shared byte \d+ \(buf\+\d+\), written by the async copy on line "
                                     r"\d+, without waiting on the mbarrier phase that completes it", block=(256, 1, 1))


@pytest.mark.parametrize("copies", ["bulk", "cp.async"])
def test_releasing_a_stage_before_wgmma_wait_group_is_caught(copies):
    ptx = pipeline(copies).replace("  wgmma.wait_group.sync.aligned 0;\n", "")
    ptx = ptx.replace("  mbarrier.arrive.shared::cta.b64 _, [%e];\n",
                      "  mbarrier.arrive.shared::cta.b64 _, [%e];\n  wgmma.wait_group.sync.aligned 0;\n")
    copy = "cp.async.bulk.shared::cluster" if copies == "bulk" else "cp.async.cg.shared.global [%dst], [%src], 16;"
    line = next(text for text in ptx.splitlines() if copy in text)
    ptx = mark(ptx, line)
    planted(ptx, pipeline_args()[0], r"overwrites shared byte \d+ \(buf\+\d+\) which the wgmma.mma_async of "
                                     r"warpgroup 1 read with no mbarrier or bar.sync ordering", block=(256, 1, 1))


def test_missing_proxy_fence_for_cp_async_data_is_caught():
    ptx = mark(pipeline("cp.async").replace("  fence.proxy.async.shared::cta;\n", ""),
               "%a, %b, %acc, 1, 1, 0, 0;")
    planted(ptx, pipeline_args()[0], r"written through the generic proxy by the async copy on line \d+, "
                                     "with no fence.proxy.async", block=(256, 1, 1))


def test_mbarrier_used_without_barrier_after_init_is_caught():
    ptx = pipeline("bulk").replace("INITIALISED:\n  bar.sync 0;\n", "INITIALISED:\n")
    ptx = mark(ptx, "  mbarrier.try_wait.parity.shared::cta.b64 %ok, [%f], %par;")
    planted(ptx, pipeline_args()[0], r"uses the mbarrier at shared byte \d+ \(full\+0\) initialised by "
                                     r"thread \(0,0,0\) with no bar.sync in between", block=(256, 1, 1))


def test_wrong_tx_count_deadlocks():
    ptx = pipeline("bulk").replace("[%f], 4096;", "[%f], 2048;")
    with pytest.raises(SanitizerError, match="deadlock: threads wait on an mbarrier phase that never completes"):
        launch(ptx, "k", (1, 1, 1), (256, 1, 1), pipeline_args()[0])


def test_waiting_on_the_wrong_parity_is_caught():
    """A parity wait for the phase before the current one succeeds at once (as on hardware): the
    consumer reads the stage while its bulk copy is in flight."""
    ptx = pipeline("bulk").replace("WAIT_FULL:\n", "  xor.b32 %par, %par, 1;\nWAIT_FULL:\n")
    with pytest.raises(SanitizerError, match=r"wgmma.mma_async reads shared byte \d+ \(buf\+0\) while the async "
                                             r"copy on line \d+ writing it is in flight"):
        launch(ptx, "k", (1, 1, 1), (256, 1, 1), pipeline_args()[0])


def test_producer_skipping_its_empty_wait_is_caught():
    ptx = pipeline("bulk").replace("  @!%ok bra WAIT_EMPTY;\n", "").replace(
        "  mbarrier.try_wait.parity.shared::cta.b64 %ok, [%e], %par;\n", "", 1)
    ptx = mark(ptx, "  cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%dst], [%src], 4096, [%f];")
    planted(ptx, pipeline_args()[0], r"async copy overwrites shared byte \d+ \(buf\+0\), written by the async "
                                     r"copy on line \d+, without waiting on the mbarrier phase", block=(256, 1, 1))


# ---- mbarrier semantics, one warp ----------------------------------------------------------
MBARRIER = SM90A + """.visible .entry k(.param .u64 src, .param .u64 out)
{
  .shared .align 8 .b64 bar;
  .shared .align 16 .b8 dst[64];
  .reg .b32 %t, %s, %v, %one, %par;
  .reg .b64 %src, %out, %state, %off;
  .reg .pred %p, %leader, %elected;
  ld.param.u64 %src, [src];
  ld.param.u64 %out, [out];
  mov.u32 %t, %ctaid.x;
  mul.wide.u32 %off, %t, 512;  // each CTA its own 32 rows of out
  add.u64 %out, %out, %off;
  mov.u32 %t, %tid.x;
  mul.wide.u32 %off, %t, 16;
  add.u64 %out, %out, %off;
  setp.eq.u32 %leader, %t, 0;
  @%leader mbarrier.init.shared::cta.b64 [bar], 32;
  bar.sync 0;
  // phase 0: 32 plain arrivals; the state of an arrival names its phase
  mbarrier.arrive.shared::cta.b64 %state, [bar];
  mbarrier.test_wait.shared::cta.b64 %p, [bar], %state;
  selp.u32 %v, 1, 0, %p;
  st.global.u32 [%out], %v;
  // phase 1: 16 threads arrive twice each (count operand)
  setp.lt.u32 %p, %t, 16;
  @%p mbarrier.arrive.shared::cta.b64 _, [bar], 2;
  mbarrier.try_wait.parity.shared::cta.b64 %p, [bar], 1;
  selp.u32 %v, 1, 0, %p;
  st.global.u32 [%out+4], %v;
  // phase 2: 64 bytes of transactions (a bulk copy) and 32 arrivals
  @%leader mbarrier.expect_tx.shared::cta.b64 [bar], 64;
  mov.u32 %s, dst;
  @%leader cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%s], [%src], 64, [bar];
  mbarrier.arrive.shared::cta.b64 _, [bar];
WAIT:
  mbarrier.try_wait.parity.shared::cta.b64 %p, [bar], 0;
  @!%p bra WAIT;
  and.b32 %v, %t, 15;
  shl.b32 %v, %v, 2;
  add.u32 %s, %s, %v;
  ld.shared.u32 %v, [%s];
  st.global.u32 [%out+8], %v;
  // elect.sync among lanes 5..31
  mov.u32 %v, 99;
  setp.ne.u32 %elected, %t, %t;
  setp.ge.u32 %p, %t, 5;
  @%p elect.sync %v|%elected, 0xffffffe0;
  selp.u32 %one, 1, 0, %elected;
  shl.b32 %one, %one, 8;
  or.b32 %v, %v, %one;
  st.global.u32 [%out+12], %v;
  ret;
}
"""


def test_mbarrier_phases_counts_transactions_and_elect():
    src = np.arange(16, dtype=np.uint32) * 3 + 1
    out = np.zeros((2, 32, 4), np.uint32)
    launch(MBARRIER, "k", (2, 1, 1), (32, 1, 1), [src, out])
    lane = np.arange(32)
    for cta in out:  # two CTAs, each with its own mbarrier
        np.testing.assert_array_equal(cta[:, 0], 1)
        np.testing.assert_array_equal(cta[:, 1], 1)
        np.testing.assert_array_equal(cta[:, 2], src[lane % 16])
        np.testing.assert_array_equal(cta[:, 3], np.where(lane < 5, 99, 5 + 256 * (lane == 5)))


def test_a_cta_ending_with_a_bulk_copy_in_flight_is_caught():
    """No thread waits for the copy's phase: the CTA ends (ret) while it may still be landing."""
    wait = "WAIT:\n  mbarrier.try_wait.parity.shared::cta.b64 %p, [bar], 0;\n  @!%p bra WAIT;\n"
    read = "  ld.shared.u32 %v, [%s];\n"
    ptx = MBARRIER.replace(wait, "").replace(read, "").replace("  ret;\n}", "  ret;  // BUG\n}")
    src = np.arange(16, dtype=np.uint32)
    planted(ptx, [src, np.zeros((2, 32, 4), np.uint32)], r"the CTA ends while async copies that the mbarrier at "
            r"shared byte 1024 tracks are in flight: no thread waited for the phase", block=(32, 1, 1))


# out += tid * 4 bytes; thread 0 initialises `bar` for 32 arrivals; a bar.sync
ONE_BARRIER_PROLOGUE = """  ld.param.u64 %out, [out];
  mov.u32 %t, %tid.x;
  mul.wide.u32 %off, %t, 4;
  add.u64 %out, %out, %off;
  setp.eq.u32 %leader, %t, 0;
  @%leader mbarrier.init.shared::cta.b64 [bar], 32;
  bar.sync 0;
"""
ARRIVE_DROP = SM90A + """.visible .entry k(.param .u64 out)
{
  .shared .align 8 .b64 bar;
  .reg .b32 %t, %v;
  .reg .b64 %out, %state, %off;
  .reg .pred %p, %q, %leader;
""" + ONE_BARRIER_PROLOGUE + """  setp.ge.u32 %p, %t, 16;
  @%p mbarrier.{leave}.shared::cta.b64 _, [bar];  // lanes 16..31 arrive and leave
  @!%p mbarrier.arrive.shared::cta.b64 _, [bar];
  @%p bra DONE;
  mbarrier.arrive.shared::cta.b64 %state, [bar];  // phase 1: lanes 0..15 alone
  mbarrier.test_wait.shared::cta.b64 %q, [bar], %state;
  selp.u32 %v, 1, 0, %q;
  st.global.u32 [%out], %v;
DONE:
  ret;
}
"""


def test_arrive_drop_lowers_the_count_of_later_phases():
    out = np.zeros(32, np.uint32)
    launch(ARRIVE_DROP.replace("{leave}", "arrive_drop"), "k", (1, 1, 1), (32, 1, 1), [out])
    np.testing.assert_array_equal(out[:16], 1)
    out[:] = 0
    launch(ARRIVE_DROP.replace("{leave}", "arrive"), "k", (1, 1, 1), (32, 1, 1), [out], sanitize=False)
    np.testing.assert_array_equal(out[:16], 0)   # 16 of 32 arrivals: phase 1 still open


def test_one_loop_polling_two_mbarriers_finishes():
    """test_wait on two mbarriers in one loop (each answers false once, then parks the thread),
    while the warp that completes them comes later in the program."""
    ptx = SM90A + """.visible .entry k(.param .u64 out)
{
  .shared .align 8 .b64 bar[2];
  .reg .b32 %t;
  .reg .b64 %out;
  .reg .pred %p, %p1, %p2, %leader;
  ld.param.u64 %out, [out];
  mov.u32 %t, %tid.x;
  setp.eq.u32 %leader, %t, 0;
  @%leader mbarrier.init.shared::cta.b64 [bar], 32;
  @%leader mbarrier.init.shared::cta.b64 [bar+8], 32;
  bar.sync 0;
  setp.ge.u32 %p, %t, 32;
  @%p bra PRODUCER;
POLL:
  mbarrier.test_wait.parity.shared::cta.b64 %p1, [bar], 0;
  mbarrier.test_wait.parity.shared::cta.b64 %p2, [bar+8], 0;
  and.pred %p, %p1, %p2;
  @!%p bra POLL;
  st.global.u32 [%out], 1;
  ret;
PRODUCER:
  mbarrier.arrive.shared::cta.b64 _, [bar];
  mbarrier.arrive.shared::cta.b64 _, [bar+8];
  ret;
}
"""
    out = np.zeros(1, np.uint32)
    launch(ptx, "k", (1, 1, 1), (64, 1, 1), [out])
    assert out[0] == 1


def test_more_arrivals_than_expected_is_caught():
    ptx = mark(MBARRIER, "  @%p mbarrier.arrive.shared::cta.b64 _, [bar], 2;",
               "  mbarrier.arrive.shared::cta.b64 _, [bar], 2;")
    planted(ptx, [np.zeros(16, np.uint32), np.zeros((32, 4), np.uint32)],
            r"more arrivals on the mbarrier at shared byte 1024 than its phase expects \(32\)", block=(32, 1, 1))


def test_reading_a_bulk_copy_destination_in_flight_is_caught():
    ptx = MBARRIER.replace("  mbarrier.arrive.shared::cta.b64 _, [bar];\nWAIT:", "WAIT:")
    ptx = ptx.replace("WAIT:\n  mbarrier.try_wait.parity.shared::cta.b64 %p, [bar], 0;\n  @!%p bra WAIT;\n", "")
    ptx = mark(ptx, "  ld.shared.u32 %v, [%s];")
    planted(ptx, [np.zeros(16, np.uint32), np.zeros((32, 4), np.uint32)],
            r"reads shared byte \d+ \(dst\+\d+\) while the async copy on line \d+ writing it is in flight",
            block=(32, 1, 1))


def test_an_atomic_on_a_bulk_copy_destination_in_flight_is_caught():
    """An atomic reads and writes: on bytes a bulk copy is still writing it races with the copy,
    as an ordinary load or store would; after the wait it is fine."""
    ptx = MBARRIER.replace("  mbarrier.arrive.shared::cta.b64 _, [bar];\nWAIT:", "WAIT:")
    ptx = ptx.replace("WAIT:\n  mbarrier.try_wait.parity.shared::cta.b64 %p, [bar], 0;\n  @!%p bra WAIT;\n", "")
    ptx = mark(ptx, "  ld.shared.u32 %v, [%s];", "  atom.shared.add.u32 %v, [%s], 1;")
    planted(ptx, [np.zeros(16, np.uint32), np.zeros((32, 4), np.uint32)],
            r"overwrites shared byte \d+ \(dst\+\d+\) while the async copy on line \d+ writing it is in flight",
            block=(32, 1, 1))
    src = np.arange(16, dtype=np.uint32)
    out = np.zeros((1, 32, 4), np.uint32)
    launch(MBARRIER.replace("  ld.shared.u32 %v, [%s];", "  atom.shared.add.u32 %v, [%s], 1;"), "k", (1, 1, 1),
           (32, 1, 1), [src, out])
    assert sorted(out[0, :, 2].tolist()) == sorted(v + k for v in src.tolist() for k in (0, 1))


def test_ignoring_try_waits_answer_is_caught():
    """try_wait answers false while the phase is incomplete (the first time it is asked; a retry
    at the same instruction parks until the phase completes): a kernel that goes on regardless
    reads the copy's destination in flight. (The loop in MBARRIER retries, and passes.)"""
    ptx = MBARRIER.replace("  mbarrier.arrive.shared::cta.b64 _, [bar];\nWAIT:", "WAIT:").replace("  @!%p bra WAIT;\n", "")
    ptx = mark(ptx, "  ld.shared.u32 %v, [%s];")
    planted(ptx, [np.zeros(16, np.uint32), np.zeros((32, 4), np.uint32)],
            r"reads shared byte \d+ \(dst\+\d+\) while the async copy on line \d+ writing it is in flight",
            block=(32, 1, 1))


def test_ordinary_access_to_an_mbarrier_is_caught():
    ptx = mark(MBARRIER, "  st.global.u32 [%out], %v;", "  st.global.u32 [%out], %v;\n  st.shared.u32 [bar], %v;")
    ptx = ptx.replace("  st.global.u32 [%out], %v;  // BUG\n  st.shared.u32 [bar], %v;",
                      "  st.global.u32 [%out], %v;\n  st.shared.u32 [bar], %v;  // BUG")
    planted(ptx, [np.zeros(16, np.uint32), np.zeros((32, 4), np.uint32)],
            r"ordinary store to the mbarrier object at shared byte 1024 \(bar\+0\)", block=(32, 1, 1))



def test_every_thread_initialising_an_mbarrier_is_caught():
    """mbarrier.init is a plain write of the object: 32 threads making it at once race."""
    ptx = mark(MBARRIER, "  @%leader mbarrier.init.shared::cta.b64 [bar], 32;",
               "  mbarrier.init.shared::cta.b64 [bar], 32;")
    planted(ptx, [np.zeros(16, np.uint32), np.zeros((32, 4), np.uint32)],
            r"mbarrier.init of the mbarrier at shared byte 1024 \(bar\+0\) by 32 threads of one CTA at once",
            block=(32, 1, 1))


REINIT = SM90A + """.visible .entry k(.param .u64 out)
{
  .shared .align 8 .b64 bar;
  .reg .b32 %t;
  .reg .b64 %out, %off;
  .reg .pred %p, %leader;
""" + ONE_BARRIER_PROLOGUE + """  setp.ge.u32 %p, %t, 32;
  @%p bra SECOND;
  mbarrier.arrive.shared::cta.b64 _, [bar];
WAIT:
  mbarrier.try_wait.parity.shared::cta.b64 %p, [bar], 0;
  @!%p bra WAIT;
SECOND:
  bar.sync 0;
  @%leader mbarrier.init.shared::cta.b64 [bar], 16;  // the same object again, for 16 arrivals
  bar.sync 0;
  setp.lt.u32 %p, %t, 16;
  @!%p bra DONE;
  mbarrier.arrive.shared::cta.b64 _, [bar];
AGAIN:
  mbarrier.try_wait.parity.shared::cta.b64 %p, [bar], 0;
  @!%p bra AGAIN;
  st.global.u32 [%out], 1;
DONE:
  ret;
}
"""


def test_initialising_an_mbarrier_again_after_a_bar_sync_is_clean():
    out = np.zeros(64, np.uint32)
    launch(REINIT, "k", (1, 1, 1), (64, 1, 1), [out])
    np.testing.assert_array_equal(out, np.arange(64) < 16)


def test_initialising_an_mbarrier_while_another_warp_waits_on_it_is_caught():
    """Warp 1 initialises the mbarrier that warp 0 is waiting on, with no bar.sync in between:
    warp 0's phase 0 can then complete on the new object's arrivals, or never."""
    ptx = REINIT.replace("  @%p bra SECOND;", "  @%p bra RACE;").replace(
        "SECOND:\n", "RACE:\n  setp.eq.u32 %p, %t, 32;\n"
        "  @%p mbarrier.init.shared::cta.b64 [bar], 32;  // BUG\n  @%p bra DONE;\nSECOND:\n")
    planted(ptx, [np.zeros(64, np.uint32)], r"mbarrier.init of the mbarrier at shared byte 1024 \(bar\+0\), "
            r"which thread \(0,0,0\) used with no bar.sync in between", block=(64, 1, 1))

# ---- setmaxnreg --------------------------------------------------------------------------
SETMAXNREG = SM90A + """.visible .entry k()
.maxntid 384, 1, 1
{
  .reg .b32 %t;
  .reg .pred %p;
  mov.u32 %t, %tid.x;
  setp.ge.u32 %p, %t, LIMIT;
  @%p bra CONSUMERS;
  setmaxnreg.dec.sync.aligned.u32 40;
  bra DONE;
CONSUMERS:
  setmaxnreg.inc.sync.aligned.u32 INC;
DONE:
  ret;
}
"""


# The consumers reach their inc first (lowest PC first), before the producer has given any back.
SETMAXNREG_PRODUCER_LATE = SM90A + """.visible .entry k()
.maxntid 384, 1, 1
{
  .reg .b32 %t;
  .reg .pred %p;
  mov.u32 %t, %tid.x;
  setp.lt.u32 %p, %t, 128;
  @%p bra PRODUCER;
  setmaxnreg.inc.sync.aligned.u32 232;
  bra DONE;
PRODUCER:
  setmaxnreg.dec.sync.aligned.u32 40;
DONE:
  ret;
}
"""


def test_setmaxnreg_rebalances_registers_by_warpgroup():
    launch(SETMAXNREG.replace("LIMIT", "128").replace("INC", "232"), "k", (2, 1, 1), (384, 1, 1), [])
    # 384 threads launch with at most 168 registers each: the incs wait for the producer's dec
    launch(SETMAXNREG_PRODUCER_LATE, "k", (2, 1, 1), (384, 1, 1), [])


def test_setmaxnreg_misuse_is_caught():
    # half a warpgroup
    ptx = mark(SETMAXNREG.replace("LIMIT", "64").replace("INC", "232"), "  setmaxnreg.dec.sync.aligned.u32 40;")
    planted(ptx, [], r"setmaxnreg: warpgroup 0 \(warps 0..3\) executes it with 64 of its 128 threads",
            block=(384, 1, 1))
    # more registers than the launch gave the CTA: 40 + 2 x 240 > 3 x 168 per thread
    ptx = mark(SETMAXNREG.replace("LIMIT", "128").replace("INC", "240"), "  setmaxnreg.inc.sync.aligned.u32 240;")
    planted(ptx, [], r"deadlock: threads wait on registers that no warpgroup of the CTA gives back "
                     r"\(setmaxnreg.dec\)", block=(384, 1, 1))
    # a producer that never gives its registers back: the consumers' incs can never be met
    ptx = mark(SETMAXNREG_PRODUCER_LATE.replace("  setmaxnreg.dec.sync.aligned.u32 40;\n", ""),
               "  setmaxnreg.inc.sync.aligned.u32 232;")
    planted(ptx, [], r"deadlock: threads wait on registers that no warpgroup", block=(384, 1, 1))
    # .maxnreg caps the launch's registers: 3 x 128 leave no room for 40 + 2 x 232
    ptx = mark(SETMAXNREG.replace("LIMIT", "128").replace("INC", "232").replace(".maxntid 384, 1, 1", ".maxntid 384, 1, 1\n.maxnreg 128"),
               "  setmaxnreg.inc.sync.aligned.u32 232;")
    planted(ptx, [], r"deadlock: threads wait on registers", block=(384, 1, 1))
    # a dec that raises the count
    ptx = mark(SETMAXNREG.replace("LIMIT", "128").replace("INC", "232").replace("dec.sync.aligned.u32 40", "dec.sync.aligned.u32 200"),
               "  setmaxnreg.dec.sync.aligned.u32 200;")
    planted(ptx, [], r"setmaxnreg.dec to 200 registers from 168", block=(384, 1, 1))
    with pytest.raises(InterpError, match="setmaxnreg count 244: it must be a multiple of 8 in 24..256"):
        launch(SETMAXNREG.replace("LIMIT", "128").replace("INC", "244"), "k", (1, 1, 1), (384, 1, 1), [])
