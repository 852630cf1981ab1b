"""Floating-point instructions: exact IEEE results, FMA rounding, conversions."""
import re
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ptxgen.errors import InterpError
from ptxgen.interp.parser import TYPES
from interp_helpers import elementwise, f32


def fbits(x):
    return int(np.float32(x).view(np.uint32))


def test_fma_double_rounding_counterexample():
    a = np.float32(1 + 2**-23)
    b = np.float32(2**-24 * (1 - 2**-23))
    out = elementwise("fma.rn.f32 %d, %a, %b, %c;", f32([a]), f32([b]), f32([a]))
    assert out[0] == 0x3F800001            # 0x1.000002p+0
    naive = np.float32(np.float64(a) * np.float64(b) + np.float64(a))
    assert naive.view(np.uint32) != 0x3F800001   # double rounding would get it wrong
    mad = elementwise("mad.rn.f32 %d, %a, %b, %c;", f32([a]), f32([b]), f32([a]))
    assert mad[0] == 0x3F800001


def test_fma_rounds_once_into_the_subnormal_range():
    """a*b + c = 2^-127 + 2^-149 + 2^-150 - 2^-196, just below the midpoint of two f32 subnormals:
    rounded once it is 2^-127 + 2^-149; rounded to f64 first (70 bits wide) it lands on the
    midpoint and ties to the even 2^-127 + 2^-148."""
    a, b = f32([2.0**-100 * (1 + 2**-23)]), f32([2.0**-50 * (1 - 2**-23)])
    c = f32([2.0**-127 + 2.0**-149])
    for ins in ("fma.rn.f32", "mad.rn.f32"):
        assert elementwise(f"{ins} %d, %a, %b, %c;", a, b, c)[0] == fbits(2.0**-127 + 2.0**-149), ins

def _exact_fma_f32(a, b, c):
    """Reference: exact rational a*b+c rounded to nearest-even float32."""
    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    if exact == 0:
        return np.float32(np.float64(a) * np.float64(b) + np.float64(c))
    # round to float32 through the neighbours of the float64 nearest value
    approx = np.float32(float(exact))
    # compared as float64: NumPy 2 compares a Python float with a float32 in float32
    lo, hi = sorted([approx, np.nextafter(approx, np.float32(np.inf if float(exact) > float(approx) else -np.inf))])
    dlo, dhi = abs(Fraction(float(lo)) - exact), abs(Fraction(float(hi)) - exact)
    if dlo != dhi:
        return lo if dlo < dhi else hi
    return lo if int(lo.view(np.uint32)) % 2 == 0 else hi


finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(finite32, finite32, finite32), min_size=1, max_size=64))
@example([(1.5, -7.120792e16, 1.0)])      # f64 sum on an f32 midpoint; the exact one is not
def test_fma_matches_exact_rational(triples):
    a, b, c = (f32([t[i] for t in triples]) for i in range(3))
    prod = np.abs(a.astype(np.float64) * b)
    keep = (prod < 1e38) & (np.abs(c) < 1e38)
    a, b, c = a[keep], b[keep], c[keep]
    if a.size == 0:
        return
    out = elementwise("fma.rn.f32 %d, %a, %b, %c;", a, b, c).view(np.float32)
    for x, y, z, got in zip(a, b, c, out):
        want = _exact_fma_f32(x, y, z)
        assert got.view(np.uint32) == want.view(np.uint32), (x, y, z)


def test_fma_near_ties_random():
    rng = np.random.default_rng(1)
    a = (1 + rng.integers(0, 2**23, 300) * 2.0**-23).astype(np.float32)
    b = (rng.integers(1, 2**24, 300) * 2.0**-48).astype(np.float32)
    c = (1 + rng.integers(0, 2**23, 300) * 2.0**-23).astype(np.float32)
    out = elementwise("fma.rn.f32 %d, %a, %b, %c;", a, b, c).view(np.float32)
    want = np.array([_exact_fma_f32(x, y, z) for x, y, z in zip(a, b, c)], np.float32)
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("op,fn", [("add", np.add), ("sub", np.subtract), ("mul", np.multiply),
                                   ("div", np.divide)])
def test_basic_ops_bit_exact(op, fn):
    rng = np.random.default_rng(2)
    a = rng.standard_normal(500).astype(np.float32) * np.float32(1e3)
    b = rng.standard_normal(500).astype(np.float32)
    a[:4] = [np.inf, np.nan, 0.0, 1e-40]
    b[:4] = [1.0, 2.0, -0.0, 3.0]
    out = elementwise(f"{op}.rn.f32 %d, %a, %b;", a, b)
    with np.errstate(all="ignore"):
        want = fn(a, b)
    assert np.array_equal(out, want.view(np.uint32))


def test_sqrt_rcp_rn_exact():
    a = np.abs(np.random.default_rng(3).standard_normal(200)).astype(np.float32) + np.float32(1e-3)
    assert np.array_equal(elementwise("sqrt.rn.f32 %d, %a;", a), np.sqrt(a).view(np.uint32))
    assert np.array_equal(elementwise("rcp.rn.f32 %d, %a;", a), (np.float32(1) / a).view(np.uint32))


def test_ftz_and_sat():
    tiny = np.float32(1e-40)
    out = elementwise("add.ftz.f32 %d, %a, %b;", f32([tiny, 1.0]), f32([0.0, 0.0]))
    assert out[0] == 0 and out[1] == fbits(1.0)
    smallest_normal = np.finfo(np.float32).tiny
    out = elementwise("add.ftz.f32 %d, %a, %b;", f32([smallest_normal, -smallest_normal]), f32([0.0, 0.0]))
    assert list(out) == [fbits(smallest_normal), fbits(-smallest_normal)], ".ftz keeps the smallest normal"
    out = elementwise("mul.sat.f32 %d, %a, %b;", f32([3.0, -2.0, np.nan, 0.25]), f32([1.0, 1.0, 1.0, 1.0]))
    assert list(out.view(np.float32)) == [1.0, 0.0, 0.0, 0.25]


def test_exact_zero_sum_is_negative_zero_under_rm_only():
    """IEEE 754 6.3: x + (-x) is +0 in every rounding direction but toward negative, where it is
    -0; x + x keeps the sign of x, zeros included."""
    a = f32([1.5, 0.0, -0.0, 0.0, 2.0**-140])
    b = f32([-1.5, 0.0, -0.0, -0.0, -2.0**-140])
    assert list(elementwise("add.rm.f32 %d, %a, %b;", a, b)) == [0x80000000, 0, 0x80000000, 0x80000000, 0x80000000]
    for mode in ("rn", "rz", "rp"):
        assert list(elementwise(f"add.{mode}.f32 %d, %a, %b;", a, b)) == [0, 0, 0x80000000, 0, 0], mode
    assert list(elementwise("sub.rm.f32 %d, %a, %a;", a)) == [0x80000000] * 5
    for ins in ("fma.rm.f32", "mad.rm.f32"):
        out = elementwise(f"{ins} %d, %a, %b, %c;", f32([2.0, 0.0, 0.0]), f32([3.0, 5.0, -5.0]), f32([-6.0, 0.0, -0.0]))
        assert list(out) == [0x80000000, 0, 0x80000000], ins
    assert list(elementwise("fma.rp.f32 %d, %a, %b, %c;", f32([2.0]), f32([3.0]), f32([-6.0]))) == [0]

def test_min_max_nan_and_setp_orderings():
    a = f32([1.0, np.nan, 2.0])
    b = f32([2.0, 5.0, np.nan])
    assert list(elementwise("min.f32 %d, %a, %b;", a, b).view(np.float32)) == [1.0, 5.0, 2.0]
    assert list(elementwise("max.f32 %d, %a, %b;", a, b).view(np.float32)) == [2.0, 5.0, 2.0]
    cases = {"lt": [1, 0, 0], "ltu": [1, 1, 1], "ne": [1, 0, 0], "neu": [1, 1, 1],
             "ge": [0, 0, 0], "geu": [0, 1, 1], "num": [1, 0, 0], "nan": [0, 1, 1],
             "equ": [0, 1, 1], "eq": [0, 0, 0]}
    for cmp, want in cases.items():
        out = elementwise(f"setp.{cmp}.f32 %p, %a, %b; selp.u32 %d, 1, 0, %p;", a, b)
        assert list(out) == want, cmp



# (type, bits of -0, of +0, of 1.0, of -3.0, of a NaN, the canonical NaN), packed types in both halves
MINMAX_TYPES = {
    "f32": (0x80000000, 0, 0x3F800000, 0xC0400000, 0x7FC00001, 0x7FFFFFFF),
    "f16x2": (0x80008000, 0, 0x3C003C00, 0xC200C200, 0x7E017E01, 0x7FFF7FFF),
    "bf16x2": (0x80008000, 0, 0x3F803F80, 0xC040C040, 0x7FC17FC1, 0x7FFF7FFF),
}


@pytest.mark.parametrize("t", MINMAX_TYPES)
def test_min_max_order_signed_zeros_whatever_the_operand_order(t):
    neg0, pos0 = MINMAX_TYPES[t][:2]
    n = 300                                   # several CTAs: the result must not depend on the launch
    a = np.where(np.arange(n) % 2 == 0, neg0, pos0).astype(np.uint32)
    b = np.where(np.arange(n) % 2 == 0, pos0, neg0).astype(np.uint32)
    for nan in ("", ".NaN"):
        assert set(elementwise(f"max{nan}.{t} %d, %a, %b;", a, b)) == {pos0}, (t, nan)
        assert set(elementwise(f"min{nan}.{t} %d, %a, %b;", a, b)) == {neg0}, (t, nan)
    assert list(elementwise(f"max.{t} %d, %a, %b;", a[:2], a[:2])) == [neg0, pos0]   # x, x is x


def test_min_max_order_signed_zeros_f64():
    a, b = np.array([-0.0, 0.0]), np.array([0.0, -0.0])
    assert list(elementwise("max.f64 %D, %A, %B;", a, b, wide=True)) == [0, 0]
    assert list(elementwise("min.f64 %D, %A, %B;", a, b, wide=True)) == [2**63, 2**63]


@pytest.mark.parametrize("t", MINMAX_TYPES)
def test_min_max_nan_modifier_gives_the_canonical_nan(t):
    one, nan, canonical = (MINMAX_TYPES[t][i] for i in (2, 4, 5))
    a = np.array([nan, one, nan], np.uint32)
    b = np.array([one, nan, nan], np.uint32)
    assert list(elementwise(f"max.NaN.{t} %d, %a, %b;", a, b)) == [canonical] * 3
    assert list(elementwise(f"min.NaN.{t} %d, %a, %b;", a, b)) == [canonical] * 3
    assert list(elementwise(f"max.{t} %d, %a, %b;", a, b))[:2] == [one, one]     # a NaN loses to a number


@pytest.mark.parametrize("t", MINMAX_TYPES)
def test_min_max_xorsign_abs(t):
    """The magnitudes are compared; the result's sign is the XOR of the inputs' signs."""
    _, _, one, minus3, nan, canonical = MINMAX_TYPES[t]
    sign = 0x80000000 if t == "f32" else 0x80008000
    minus1, three = one | sign, minus3 & ~sign
    a = np.array([minus1, minus1, one, nan, nan], np.uint32)
    b = np.array([three, minus3, three, minus3, nan], np.uint32)
    assert list(elementwise(f"max.xorsign.abs.{t} %d, %a, %b;", a, b))[:4] == [minus3, three, three, minus3]
    assert list(elementwise(f"min.xorsign.abs.{t} %d, %a, %b;", a, b))[:4] == [minus1, one, one, minus3]
    assert list(elementwise(f"max.NaN.xorsign.abs.{t} %d, %a, %b;", a, b))[3:] == [canonical, canonical]


@pytest.mark.parametrize("ins,message", [
    ("max.xorsign.f32", ".xorsign and .abs go together"),
    ("min.abs.f32", ".xorsign and .abs go together"),
    ("max.relu.f32", ".relu needs .s32"),
    ("max.relu.u32", ".relu needs .s32"),
    ("max.NaN.f64", "min/max.f64 takes no .ftz, .NaN or .xorsign.abs"),
    ("min.ftz.bf16x2", ".ftz needs .f32, .f16 or .f16x2"),
    ("max.NaN.s32", ".ftz, .NaN and .xorsign.abs need a float type"),
    ("max.b32", "max needs an integer or float type, not .b32"),
    ("max.foo.f32", "unsupported modifier .foo on max"),
])
def test_min_max_forms_it_lacks_are_refused(ins, message):
    with pytest.raises(InterpError, match=re.escape(message)):
        elementwise(f"{ins} %d, %a, %b;", np.zeros(1, np.uint32))

# ---- conversions -----------------------------------------------------------------------
def test_cvt_f16_round_to_nearest_even_ties_nan_overflow():
    inputs = f32([1 + 2**-11, 1 + 3 * 2**-11, 65520.0, 65519.0, np.nan, -np.inf, 2**-25, 2**-25 * 1.5])
    out = elementwise(".reg .b16 %h; cvt.rn.f16.f32 %h, %a; mov.b32 %d, {%h, %h};", inputs)
    h = (out & 0xFFFF).astype(np.uint16)
    assert h[0] == 0x3C00            # tie -> even (1.0)
    assert h[1] == 0x3C02            # tie -> even (1 + 2^-9)
    assert h[2] == 0x7C00            # rounds up to inf
    assert h[3] == 0x7BFF            # 65504
    assert np.isnan(h[4:5].view(np.float16))[0]
    assert h[5] == 0xFC00
    assert h[6] == 0x0000            # 2^-25 is the tie between 0 and 2^-24: even is 0
    assert h[7] == 0x0001
    assert (out >> 16 == out & 0xFFFF).all()     # {lo, hi} packing puts both halves


def test_cvt_bf16_rounding_and_nan():
    inputs = np.array([0x3F808000, 0x3F818000, 0x3F808001, 0x7F7FFFFF, 0x7FC00001, 0xFF800000,
                       0x00008000], np.uint32)
    out = elementwise(".reg .b16 %h; cvt.rn.bf16.f32 %h, %a; cvt.u32.u16 %d, %h;", inputs)
    assert out[0] == 0x3F80          # tie, even stays
    assert out[1] == 0x3F82          # tie, odd rounds up
    assert out[2] == 0x3F81          # above the tie
    assert out[3] == 0x7F80          # overflow to inf
    assert (out[4] & 0x7F80) == 0x7F80 and (out[4] & 0x7F) != 0    # still a NaN
    assert out[5] == 0xFF80
    assert out[6] == 0x0000          # tiny subnormal tie rounds to even zero


def test_cvt_directed_rounding_to_half():
    x = f32([1 + 2**-12, -(1 + 2**-12), 70000.0])
    for mode, want in {"rz": [0x3C00, 0xBC00, 0x7BFF], "rp": [0x3C01, 0xBC00, 0x7C00],
                       "rm": [0x3C00, 0xBC01, 0x7BFF], "rn": [0x3C00, 0xBC00, 0x7C00]}.items():
        out = elementwise(f".reg .b16 %h; cvt.{mode}.f16.f32 %h, %a; cvt.u32.u16 %d, %h;", x)
        assert list(out) == want, mode


def test_cvt_f16x2_and_bf16x2_order():
    out = elementwise("cvt.rn.f16x2.f32 %d, %a, %b;", f32([1.0]), f32([2.0]))
    assert out[0] == (0x3C00 << 16) | 0x4000       # a in the upper half, b in the lower
    out = elementwise("cvt.rn.bf16x2.f32 %d, %a, %b;", f32([1.0]), f32([-2.0]))
    assert out[0] == (0x3F80 << 16) | 0xC000


def test_cvt_packed_round_toward_zero():
    """Just past half an ulp: .rn rounds away from zero, .rz does not (a in the upper half)."""
    a = f32([1 + 2**-11 + 2**-20, 1 + 2**-8 + 2**-20])
    b = -a
    assert list(elementwise("cvt.rn.f16x2.f32 %d, %a, %b;", a, b)) == [0x3C01BC01, 0x3C04BC04]
    assert list(elementwise("cvt.rz.f16x2.f32 %d, %a, %b;", a, b)) == [0x3C00BC00, 0x3C04BC04]
    assert list(elementwise("cvt.rn.bf16x2.f32 %d, %a, %b;", a, b)) == [0x3F80BF80, 0x3F81BF81]
    assert list(elementwise("cvt.rz.bf16x2.f32 %d, %a, %b;", a, b)) == [0x3F80BF80, 0x3F80BF80]


def test_cvt_float_to_int_saturates_and_nan_is_zero():
    x = f32([3.7, -3.7, 2.5, -2.5, 1e10, -1e10, np.nan, np.inf])
    rzi = elementwise("cvt.rzi.s32.f32 %d, %a;", x).view(np.int32)
    assert list(rzi) == [3, -3, 2, -2, 2**31 - 1, -2**31, 0, 2**31 - 1]
    rni = elementwise("cvt.rni.s32.f32 %d, %a;", x).view(np.int32)
    assert list(rni[:4]) == [4, -4, 2, -2]
    rmi = elementwise("cvt.rmi.s32.f32 %d, %a;", x).view(np.int32)
    assert list(rmi[:4]) == [3, -4, 2, -3]
    rpi = elementwise("cvt.rpi.s32.f32 %d, %a;", x).view(np.int32)
    assert list(rpi[:4]) == [4, -3, 3, -2]
    u = elementwise("cvt.rzi.u32.f32 %d, %a;", x)
    assert list(u) == [3, 0, 2, 0, 2**32 - 1, 0, 0, 2**32 - 1]
    u8 = elementwise("cvt.rni.u8.f32 %d, %a;", f32([300.0, -5.0, 254.6]))
    assert list(u8) == [255, 0, 255]


# NaN (bits in the source's width) -> integer: 0 unless the source is .f64 or the destination
# 64-bit, then 1 << (width - 1) (ISA 9.7.9.21)
CVT_NAN = [("s32", "f32", 0), ("u8", "f32", 0), ("s32", "f16", 0), ("u16", "bf16", 0),
           ("s64", "f32", 1 << 63), ("u64", "f32", 1 << 63), ("s64", "f16", 1 << 63),
           ("s32", "f64", 1 << 31), ("u32", "f64", 1 << 31), ("s16", "f64", 1 << 15),
           ("u8", "f64", 0x80), ("s64", "f64", 1 << 63), ("u64", "f64", 1 << 63)]


@pytest.mark.parametrize("dst,src,want", CVT_NAN, ids=[f"{d}.{s}" for d, s, _ in CVT_NAN])
def test_cvt_nan_to_integer_depends_on_the_widths(dst, src, want):
    nan = {"f64": 0x7FF8000000000000, "f32": 0x7FC00000, "f16": 0x7E00, "bf16": 0x7FC0}[src]
    bits, width = 8 * TYPES[src][0], 8 * TYPES[dst][0]
    snippet = (f".reg .b{bits} %x; .reg .b{width} %y; cvt.u{bits}.u64 %x, %A; "
               f"cvt.rzi.{dst}.{src} %y, %x; cvt.u64.u{width} %D, %y;")
    assert elementwise(snippet, np.array([nan], np.uint64), wide=True)[0] == want

def test_cvt_round_to_integral_float():
    x = f32([2.5, 3.5, -2.5, 1.7])
    assert list(elementwise("cvt.rni.f32.f32 %d, %a;", x).view(np.float32)) == [2, 4, -2, 2]
    assert list(elementwise("cvt.rzi.f32.f32 %d, %a;", x).view(np.float32)) == [2, 3, -2, 1]


def test_cvt_sat_clamps_to_0_1_and_nan_to_zero():
    """cvt's .sat on a float destination: the result clamped to [0.0, 1.0], NaN to +0 (ISA 9.7.9.21)."""
    x = f32([-0.5, 1.5, np.nan, 0.25, -np.inf])
    assert list(elementwise("cvt.sat.f32.f32 %d, %a;", x)) == [0, fbits(1.0), 0, fbits(0.25), 0]
    half = elementwise(".reg .b16 %h; cvt.rn.sat.f16.f32 %h, %a; cvt.u32.u16 %d, %h;", x)
    assert list(half) == [0, 0x3C00, 0, 0x3400, 0]
    ints = np.array([-3, 0, 1, 7], np.int32).view(np.uint32)
    assert list(elementwise("cvt.rn.sat.f32.s32 %d, %a;", ints)) == [0, 0, fbits(1.0), fbits(1.0)]


def test_cvt_ftz_flushes_a_subnormal_f32_source_whatever_the_destination():
    """.ftz flushes a subnormal .f32 source to a zero of its sign before converting: to f16 rounding
    up it stays 0 (not the smallest f16 subnormal), to f64 it is 0 (not the exact 1e-40)."""
    x = f32([1e-40, -1e-40])
    out = elementwise(".reg .b16 %h; cvt.rp.ftz.f16.f32 %h, %a; cvt.u32.u16 %d, %h;", x)
    assert list(out) == [0, 0x8000]
    assert list(elementwise(".reg .b16 %h; cvt.rp.f16.f32 %h, %a; cvt.u32.u16 %d, %h;", x)) == [0x0001, 0x8000]
    wide = elementwise("cvt.u32.u64 %a, %A; cvt.ftz.f64.f32 %D, %a;",
                       x.view(np.uint32).astype(np.uint64), wide=True)
    assert list(wide) == [0, 1 << 63]


def test_cvt_int_to_float_rounding():
    x = np.array([2**24 + 1, 2**24 + 3, 0xFFFFFFFF], np.uint32)
    rn = elementwise("cvt.rn.f32.u32 %d, %a;", x).view(np.float32)
    assert list(rn) == [2**24, 2**24 + 4, 2**32]
    rz = elementwise("cvt.rz.f32.u32 %d, %a;", x).view(np.float32)
    assert list(rz) == [2**24, 2**24 + 2, 2**32 - 256]
    big = np.array([2**63 + 2**39 + 1], np.uint64)
    out = elementwise(".reg .f32 %f; cvt.rn.f32.u64 %f, %A; mov.b32 %e, %f; mov.b64 %D, 0;",
                      big, wide=True, extra=True)[1].view(np.float32)
    assert out[0] == np.float32(2**63 + 2**40)     # just above the tie: rounds up
    # to f64 in each direction, both signs: 2^63 - 1 lies 1 below 2^63, 1023 above the double below it
    s64 = np.array([2**63 - 1, -(2**63 - 1)], np.int64).view(np.uint64)
    for mode, want in (("rn", [2.0**63, -2.0**63]), ("rz", [2.0**63 - 1024, -(2.0**63 - 1024)]),
                       ("rm", [2.0**63 - 1024, -2.0**63]), ("rp", [2.0**63, -(2.0**63 - 1024)])):
        got = elementwise(f"cvt.{mode}.f64.s64 %D, %A;", s64, wide=True).view(np.float64)
        assert list(got) == want, mode


def test_f16x2_arithmetic():
    a = np.array([(0x3C00 << 16) | 0x4000], np.uint32)     # {lo 2.0, hi 1.0}
    b = np.array([(0x4200 << 16) | 0x3800], np.uint32)     # {lo 0.5, hi 3.0}
    assert elementwise("add.rn.f16x2 %d, %a, %b;", a, b)[0] == (0x4400 << 16) | 0x4100
    assert elementwise("mul.rn.f16x2 %d, %a, %b;", a, b)[0] == (0x4200 << 16) | 0x3C00
    assert elementwise("fma.rn.f16x2 %d, %a, %b, %b;", a, b)[0] == (0x4600 << 16) | 0x3E00


def test_f16x2_sat_clamps_to_0_1_and_nan_to_zero():
    """.sat on .f16/.f16x2 arithmetic clamps each half to [0, 1], a NaN result to +0 (ISA 9.7.4)."""
    a = np.array([(0x3C00 << 16) | 0xBC00, (0x7E00 << 16) | 0x3800], np.uint32)   # {-1, 1}, {0.5, NaN}
    b = np.array([(0x3C00 << 16) | 0x0000, 0], np.uint32)                         # {0, 1}, {0, 0}
    want = [(0x3C00 << 16) | 0x0000, 0x3800]                                      # {0, 1}, {0.5, 0}
    assert list(elementwise("add.sat.f16x2 %d, %a, %b;", a, b)) == want
    assert list(elementwise("fma.rn.sat.f16x2 %d, %a, %c, %b;", a, b, np.full(2, 0x3C003C00, np.uint32))) == want


def test_f16x2_ftz_flushes_subnormal_inputs_and_results_to_signed_zero():
    """.ftz on .f16x2: a subnormal operand (lo: -2^-24) counts as a zero of its sign, a subnormal
    result (hi: 2^-14 * 0.5) becomes one; without .ftz both are kept."""
    a = np.array([(0x0400 << 16) | 0x8001], np.uint32)
    b = np.array([(0x3800 << 16) | 0x3C00], np.uint32)
    assert list(elementwise("mul.ftz.f16x2 %d, %a, %b;", a, b)) == [0x8000]
    assert list(elementwise("mul.f16x2 %d, %a, %b;", a, b)) == [(0x0200 << 16) | 0x8001]
    assert list(elementwise("fma.rn.ftz.f16x2 %d, %a, %b, %c;", a, b)) == [0x0000]


def test_f64_ops():
    a = np.array([1.0 + 2**-52, 3.0], np.float64)
    b = np.array([1.0 - 2**-53, 7.0], np.float64)
    out = elementwise("mul.rn.f64 %D, %A, %B;", a, b, wide=True).view(np.float64)
    assert np.array_equal(out, a * b)
    out = elementwise("fma.rn.f64 %D, %A, %B, %C;", a, b, -a * b, wide=True).view(np.float64)
    exact = [float(Fraction(x) * Fraction(y) - Fraction(x * y)) for x, y in zip(a, b)]
    assert list(out) == exact
    out = elementwise(".reg .f32 %f; cvt.rn.f32.f64 %f, %A; mov.b32 %e, %f; mov.b64 %D, 0;",
                      np.array([1 + 2**-24 + 2**-50]), wide=True, extra=True)[1]
    assert out[0] == 0x3F800001


def test_fma_f64_overflow_rounds_to_infinity():
    big = np.finfo(np.float64).max                     # odd significand: its tie rounds up, to inf
    a = np.array([1e308, -1e308, big, big, big])
    b = np.array([10.0, 10.0, 1.0, 1.0, 2.0])
    c = np.array([1.0, 1.0, 2.0**970, 2.0**970 * (1 - 2.0**-52), -big])
    for ins in ("fma.rn.f64", "mad.rn.f64"):
        out = elementwise(f"{ins} %D, %A, %B, %C;", a, b, c, wide=True).view(np.float64)
        assert list(out) == [np.inf, -np.inf, np.inf, big, big], ins


def test_bf16x2_arithmetic_rounds_once():
    one, eps = 0x3F80, 0x3B80           # 1.0 and 2^-8 (half an ulp of 1.0 in bf16)
    a = np.array([(one << 16) | one], np.uint32)
    b = np.array([(eps << 16) | 0x3B81], np.uint32)  # lo just above half an ulp
    out = elementwise("add.rn.bf16x2 %d, %a, %b;", a, b)
    assert out[0] == (0x3F80 << 16) | 0x3F81         # tie to even (hi), above tie rounds up (lo)
    out = elementwise("fma.rn.bf16x2 %d, %a, %b, %a;", a, b)
    assert out[0] == (0x3F80 << 16) | 0x3F81


@pytest.mark.parametrize("t,one,nan", [("f16x2", 0x3C00, 0x7E01), ("bf16x2", 0x3F80, 0x7FC1)])
def test_fma_relu_clamps_negative_results_and_canonicalises_nan(t, one, nan):
    a = np.array([(one | 0x8000) << 16 | one, nan << 16 | one], np.uint32)      # {1, -1}, {1, NaN}
    b = np.array([one << 16 | one] * 2, np.uint32)
    out = elementwise(f"fma.rn.relu.{t} %d, %a, %b, %c;", a, b, np.zeros(2, np.uint32))
    assert list(out) == [one, 0x7FFF << 16 | one]      # -1 -> +0, NaN -> the canonical NaN
    out = elementwise(f"fma.rn.relu.{t[:-2]} %d, %a, %b, %c;", a, b, np.zeros(2, np.uint32))  # low halves
    assert list(out & 0xFFFF) == [one, one]


@pytest.mark.parametrize("ins,message", [
    ("fma.rn.oob.f16x2", "unsupported modifier .oob on fma"),
    ("fma.rn.oob.relu.bf16x2", "unsupported modifier .oob on fma"),
    ("fma.rn.relu.f32", ".relu needs .f16, .f16x2, .bf16 or .bf16x2"),
    ("fma.rn.sat.relu.f16x2", "conflicting modifiers ['sat', 'relu']"),
])
def test_fma_forms_it_lacks_are_refused(ins, message):
    with pytest.raises(InterpError, match=re.escape(message)):
        elementwise(f"{ins} %d, %a, %b, %c;", np.zeros(1, np.uint32))


def test_abs_neg_ftz_flush_subnormal_halves_to_signed_zero():
    a = np.array([0x80010001, 0x83FF3C00, 0x7E018001], np.uint32)    # subnormals, -subnormal/1.0, NaN/-subnormal
    assert list(elementwise("abs.ftz.f16x2 %d, %a;", a)) == [0x00000000, 0x00003C00, 0x7E010000]
    assert list(elementwise("neg.ftz.f16x2 %d, %a;", a)) == [0x00008000, 0x0000BC00, 0xFE010000]
    assert list(elementwise("abs.f16x2 %d, %a;", a)) == [0x00010001, 0x03FF3C00, 0x7E010001]   # kept without .ftz
    out = elementwise(".reg .b16 %h; mov.b32 {%h, _}, %a; neg.ftz.f16 %h, %h; cvt.u32.u16 %d, %h;", a)
    assert list(out) == [0x8000, 0xBC00, 0x0000]
    assert list(elementwise("neg.bf16x2 %d, %a;", a)) == [0x00018001, 0x03FFBC00, 0xFE010001]
    with pytest.raises(InterpError, match=re.escape(".ftz needs .f32, .f16 or .f16x2")):
        elementwise("abs.ftz.bf16x2 %d, %a;", a)


def test_setp_ftz_f16_flushes_subnormal_inputs():
    """setp.ftz.f16 compares subnormal inputs as zeros of their sign (ISA, half-precision setp);
    without .ftz they keep their value."""
    h = np.array([0x0001, 0x83FF, 0x0001, 0x0400], np.uint32)     # 2^-24, -subnormal, 2^-24, 2^-14
    z = np.array([0x0000, 0x0000, 0x8000, 0x0000], np.uint32)     # +0, +0, -0, +0
    snippet = (".reg .b16 %h, %g; cvt.u16.u32 %h, %a; cvt.u16.u32 %g, %b; "
               "setp.{cmp}.f16 %p, %h, %g; selp.u32 %d, 1, 0, %p;")
    assert list(elementwise(snippet.format(cmp="gt.ftz"), h, z)) == [0, 0, 0, 1]
    assert list(elementwise(snippet.format(cmp="eq.ftz"), h, z)) == [1, 1, 1, 0]
    assert list(elementwise(snippet.format(cmp="lt.ftz"), h, z)) == [0, 0, 0, 0]
    assert list(elementwise(snippet.format(cmp="gt"), h, z)) == [1, 0, 1, 1]
    assert list(elementwise(snippet.format(cmp="eq"), h, z)) == [0, 0, 0, 0]


def test_cvt_relu_clamps_negatives_and_canonicalises_nan():
    """cvt's .relu (f16/bf16 destinations): a negative result is +0, a NaN result the canonical
    NaN 0x7fff, whatever the input NaN's sign and payload."""
    a = np.array([0x7FC00001, 0xFFC00000, 0xBF800000, 0x3F800000], np.uint32)   # NaN, -NaN, -1, 1
    b = np.array([0xBF800000, 0x7F800001, 0xFFC12345, 0x40000000], np.uint32)   # -1, sNaN, -NaN, 2
    out = elementwise("cvt.rn.relu.f16x2.f32 %d, %a, %b;", a, b)
    assert list(out) == [0x7FFF0000, 0x7FFF7FFF, 0x00007FFF, 0x3C004000]
    out = elementwise("cvt.rn.relu.bf16x2.f32 %d, %a, %b;", a, b)
    assert list(out) == [0x7FFF0000, 0x7FFF7FFF, 0x00007FFF, 0x3F804000]
    for t, one in (("f16", 0x3C00), ("bf16", 0x3F80)):
        out = elementwise(f".reg .b16 %h; cvt.rn.relu.{t}.f32 %h, %a; cvt.u32.u16 %d, %h;", a)
        assert list(out) == [0x7FFF, 0x7FFF, 0x0000, one], t
    with pytest.raises(InterpError, match=re.escape(".relu needs a .f16, .f16x2, .bf16 or .bf16x2 destination")):
        elementwise("cvt.rn.relu.f32.f64 %d, %A;", np.zeros(1, np.uint64))
