"""The test kernels are real PTX: ptxas (through nvJitLink) accepts them for sm_80."""
import pytest

from interp_helpers import elementwise_ptx, module
import test_atomics
import test_control
import test_sanitizer
import test_tensor

cuda_core = pytest.importorskip("cuda.core")

SNIPPETS = {
    "fma": elementwise_ptx("fma.rn.f32 %d, %a, %b, %c;"),
    "cvt": elementwise_ptx(".reg .b16 %h; cvt.rn.bf16.f32 %h, %a; cvt.rn.f16x2.f32 %d, %a, %b; "
                           "cvt.rzi.s32.f32 %e, %c;"),
    "shfl": elementwise_ptx("shfl.sync.down.b32 %d|%p, %a, 1, 0x181f, 0xffffffff; "
                            "vote.sync.ballot.b32 %e, %p, 0xffffffff;"),
    "bits": elementwise_ptx("bfe.s32 %d, %a, 8, 8; prmt.b32 %e, %a, %b, 0x7531; dp4a.u32.s32 %e, %e, %b, %c; "
                            "lop3.b32 %d, %d, %e, %c, 0x96; redux.sync.add.u32 %e, %d, 0xffffffff;"),
    "wide": elementwise_ptx("mul.hi.u64 %D, %A, %B; fma.rn.f64 %D, %A, %B, %D;", wide=True),
    "ldmatrix": test_tensor.LDMATRIX_PTX.replace("{trans}", ".trans"),
    "mma_f16": test_tensor.MMA_PTX.replace("{kind}", "f16"),
    "mma_bf16": test_tensor.MMA_PTX.replace("{kind}", "bf16"),
    "barrier": test_sanitizer.ptx_of(test_sanitizer.CLOBBER.replace("{barrier}", "bar.sync 0;")),
    "divergence": test_sanitizer.ptx_of(test_sanitizer.DIVERGENT_SHUFFLE),
    "atomics": module(test_atomics.PROLOGUE + "  mov.u32 %r2, 0;\n  atom.global.cas.b32 %old, [%cell], %r2, %lin;\n"
                      "  red.global.add.u32 [%cell+4], %lin;\n  ret;", test_atomics.PARAMS),
    "loops": module(test_control.PROLOGUE + """
  mov.u32 %r0, 0;
  mov.u32 %m, 0;
""" + test_control.STORE, test_control.OUT_PARAMS),
}


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_ptx_assembles_for_sm80(name):
    from cuda.core import Linker, LinkerOptions, ObjectCode
    ptx = SNIPPETS[name].encode()
    cubin = Linker(ObjectCode.from_ptx(ptx), options=LinkerOptions(arch="sm_80")).link("cubin")
    assert len(cubin.code) > 0
