"""launch(contract=True): mul/add and mul/sub pairs without rounding modifiers run as one fma, as
ptxas may contract them (PTX ISA 9.7.3, 9.7.4); an explicit .rn on either keeps them apart."""
import numpy as np
import pytest

from ptxgen.interp.contraction import contractions
from ptxgen.interp.parser import parse
from interp_helpers import elementwise, f32, module

# a = b = 1 + 2^-12: a*b = 1 + 2^-11 + 2^-24 rounds (a tie, to even) to 1 + 2^-11 in f32, so
# a*b - (1 + 2^-11) is 0 rounded twice and 2^-24 fused.
A = f32([1 + 2**-12])
C = f32([1 + 2**-11])
FUSED = np.float32(2**-24)

F32 = """
  .reg .f32 %x, %y, %z, %p, %r;
  mov.b32 %x, %a;
  mov.b32 %y, %b;
  mov.b32 %z, %c;
{body}
  mov.b32 %d, %r;
"""


def run_f32(body, contract, c=C):
    return elementwise(F32.format(body=body), A, A, c, contract=contract).view(np.float32)[0]


@pytest.mark.parametrize("body, fused", [
    ("mul.f32 %p, %x, %y;\n  sub.f32 %r, %p, %z;", FUSED),
    ("mul.f32 %p, %x, %y;\n  sub.f32 %r, %z, %p;", -FUSED),
    ("mul.ftz.f32 %p, %x, %y;\n  sub.ftz.f32 %r, %p, %z;", FUSED),
    # the mul overwrites a factor: the fused sub multiplies the factors as the mul read them
    ("mul.f32 %x, %x, %y;\n  sub.f32 %r, %x, %z;", FUSED),
    # ptxas sees through a copy
    ("mul.f32 %p, %x, %y;\n  mov.f32 %x, %p;\n  sub.f32 %r, %x, %z;", FUSED),
])
def test_a_contractible_pair_rounds_once(body, fused):
    assert run_f32(body, contract=False) == 0
    assert run_f32(body, contract=True) == fused


def test_add_takes_the_product_unrounded():
    body = "mul.f32 %p, %x, %y;\n  add.f32 %r, %p, %z;"
    assert run_f32(body, False, c=-C) == 0 and run_f32(body, True, c=-C) == FUSED


@pytest.mark.parametrize("body", [
    "mul.rn.f32 %p, %x, %y;\n  sub.f32 %r, %p, %z;",          # an explicit rounding: never contracted
    "mul.f32 %p, %x, %y;\n  sub.rn.f32 %r, %p, %z;",
    "mul.sat.f32 %p, %x, %y;\n  sub.f32 %r, %p, %z;",         # the product's clamp would be lost
    "mul.f32 %p, %x, %y;\n  mov.f32 %p, %x;\n  mul.rn.f32 %p, %p, %y;\n  sub.f32 %r, %p, %z;",  # redefined
    "mul.f32 %p, %x, %y;\n  bra.uni NEXT;\nNEXT:\n  sub.f32 %r, %p, %z;",   # another basic block
])
def test_other_pairs_round_twice(body):
    assert run_f32(body, contract=True) == run_f32(body, contract=False)


def test_f16x2_and_f64_contract_too():
    # f16: (1 + 2^-6)^2 = 1 + 2^-5 + 2^-12 rounds to 1 + 2^-5; fused, 2^-12 is left (both halves)
    h = np.array([1 + 2**-6] * 2, np.float16).view(np.uint32)
    hc = np.array([1 + 2**-5] * 2, np.float16).view(np.uint32)
    snippet = "mul.f16x2 %e, %a, %b;\n  sub.f16x2 %d, %e, %c;\n  mov.b32 %e, 0;"
    for contract, want in ((False, 0.0), (True, 2**-12)):
        out = elementwise(snippet, h, h, hc, contract=contract).view(np.float16)
        assert list(out) == [want, want]
    # f64: (1 + 2^-27)^2 = 1 + 2^-26 + 2^-54 rounds to 1 + 2^-26
    x, z = np.array([1 + 2**-27]), np.array([1 + 2**-26])
    snippet = ".reg .f64 %p;\n  mul.f64 %p, %A, %B;\n  sub.f64 %D, %p, %C;"
    for contract, want in ((False, 0.0), (True, 2**-54)):
        assert elementwise(snippet, x, x, z, wide=True, contract=contract).view(np.float64)[0] == want


def test_pairs_need_the_same_guard():
    body = """
  .reg .f32 %x, %y, %z, %p, %r;
  .reg .pred %g, %h;
  @%g mul.f32 %p, %x, %y;
  @%g add.f32 %r, %p, %z;
  @%g mul.f32 %p, %x, %y;
  @%h add.f32 %r, %p, %z;
  @%g mul.f32 %p, %x, %y;
  setp.eq.f32 %g, %x, %y;
  @%g add.f32 %r, %p, %z;
  mul.f32 %p, %x, %y;
  @%h add.f32 %r, %p, %z;
  ret;"""
    prog = parse(module(body), "k")
    assert sorted(contractions(prog)) == [1, 8]     # the first add, and the last (an unguarded mul)
