"""Integer, bit-manipulation, predicate and data-movement instructions."""
import numpy as np
import pytest

from interp_helpers import elementwise

U32 = np.array([0, 1, 7, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 123456789, 0xDEADBEEF], np.uint32)
V32 = np.array([3, 0xFFFFFFFF, 2, 2, 0xFFFFFFFF, 0x10, 0, 77], np.uint32)


def s32(x):
    return np.asarray(x, np.uint32).view(np.int32)


def test_add_sub_mul_wrap():
    assert np.array_equal(elementwise("add.u32 %d, %a, %b;", U32, V32), U32 + V32)
    assert np.array_equal(elementwise("sub.s32 %d, %a, %b;", U32, V32), U32 - V32)
    assert np.array_equal(elementwise("mul.lo.u32 %d, %a, %b;", U32, V32), U32 * V32)
    hi = (U32.astype(np.uint64) * V32.astype(np.uint64)) >> np.uint64(32)
    assert np.array_equal(elementwise("mul.hi.u32 %d, %a, %b;", U32, V32), hi.astype(np.uint32))
    shi = (s32(U32).astype(np.int64) * s32(V32).astype(np.int64)) >> 32
    assert np.array_equal(elementwise("mul.hi.s32 %d, %a, %b;", U32, V32).view(np.int32), shi.astype(np.int32))
    wide = elementwise("mul.wide.s32 %C, %a, %b; mov.b64 {%d, %e}, %C;", U32, V32, extra=True)
    got = wide[0].astype(np.uint64) | (wide[1].astype(np.uint64) << np.uint64(32))
    assert np.array_equal(got.view(np.int64), s32(U32).astype(np.int64) * s32(V32).astype(np.int64))
    sat = elementwise("add.sat.s32 %d, %a, %b;", np.array([0x7FFFFFFF, 0x80000000], np.uint32),
                      np.array([5, 0xFFFFFFFF], np.uint32))
    assert list(sat.view(np.int32)) == [2**31 - 1, -2**31]


def test_mad_and_64bit_mul_hi():
    out = elementwise("mad.lo.s32 %d, %a, %b, %c;", U32, V32, U32)
    assert np.array_equal(out, U32 * V32 + U32)
    a = np.array([2**64 - 1, 2**63, 12345678901234567], np.uint64)
    b = np.array([2**64 - 1, 3, 98765432109876543], np.uint64)
    got = elementwise("mul.hi.u64 %D, %A, %B;", a, b, wide=True)
    assert [int(x) for x in got] == [(int(x) * int(y)) >> 64 for x, y in zip(a, b)]
    got = elementwise("mul.hi.s64 %D, %A, %B;", a, b, wide=True).view(np.int64)
    sa, sb = a.view(np.int64), b.view(np.int64)
    assert [int(x) for x in got] == [(int(x) * int(y)) >> 64 for x, y in zip(sa, sb)]


def test_mad_wide_adds_all_64_bits_of_its_addend():
    """mad.wide.{u32,s32} d, a, b, c: c and d are 64-bit (ISA 9.7.1.4), so an addend past 2^32
    counts in full (mutation: c read as a 32-bit register)."""
    a = np.array([0xFFFFFFFF, 3, 0x80000000], np.uint64)
    b = np.array([0xFFFFFFFF, 5, 2], np.uint64)
    c = np.array([(1 << 40) + 5, 2**64 - 1, 1 << 63], np.uint64)
    snippet = "cvt.u32.u64 %a, %A; cvt.u32.u64 %b, %B; mad.wide.{} %D, %a, %b, %C;"
    got = elementwise(snippet.format("u32"), a, b, c, wide=True)
    assert [int(x) for x in got] == [(int(x) * int(y) + int(z)) % 2**64 for x, y, z in zip(a, b, c)]
    got = elementwise(snippet.format("s32"), a, b, c, wide=True)
    sa, sb = a.astype(np.uint32).view(np.int32), b.astype(np.uint32).view(np.int32)
    assert [int(x) for x in got] == [(int(x) * int(y) + int(z)) % 2**64 for x, y, z in zip(sa, sb, c)]


def test_mul24_multiplies_the_low_24_bits_and_hi_is_bits_16_to_47():
    """mul24.lo: the low 32 bits of the 48-bit product of the operands' low 24 bits; mul24.hi its
    high 32 bits (bits 47..16, ISA 9.7.1.6); .s32 sign-extends the 24-bit operands."""
    a = np.array([0xFFFFFF, 0x1000003, 0x800000, 0xFFFFFF, 0x123456], np.uint32)
    b = np.array([0xFFFFFF, 3, 0x800000, 2, 0xABCDEF], np.uint32)

    def product(x, y, signed):
        x, y = int(x) & 0xFFFFFF, int(y) & 0xFFFFFF
        if signed:
            x, y = (x - (1 << 24) if x >> 23 else x), (y - (1 << 24) if y >> 23 else y)
        return x * y

    for t, signed in (("u32", False), ("s32", True)):
        lo = [product(x, y, signed) % 2**32 for x, y in zip(a, b)]
        hi = [(product(x, y, signed) >> 16) % 2**32 for x, y in zip(a, b)]
        assert list(elementwise(f"mul24.lo.{t} %d, %a, %b;", a, b)) == lo, t
        assert list(elementwise(f"mul24.hi.{t} %d, %a, %b;", a, b)) == hi, t
        mad = [(h + 7) % 2**32 for h in hi]
        assert list(elementwise(f"mad24.hi.{t} %d, %a, %b, %c;", a, b, np.full(5, 7, np.uint32))) == mad, t


def test_div_rem_truncate_toward_zero():
    a = np.array([7, -7, 7, -7, -2**31], np.int32).view(np.uint32)
    b = np.array([2, 2, -2, -2, -1], np.int32).view(np.uint32)
    assert list(elementwise("div.s32 %d, %a, %b;", a, b).view(np.int32)) == [3, -3, -3, 3, -2**31]
    assert list(elementwise("rem.s32 %d, %a, %b;", a, b).view(np.int32)) == [1, -1, 1, -1, 0]
    assert list(elementwise("div.u32 %d, %a, %b;", np.array([7, 9], np.uint32),
                            np.array([2, 0], np.uint32))) == [3, 0xFFFFFFFF]


def test_min_max_abs_neg_signedness():
    a = np.array([-5, 3], np.int32).view(np.uint32)
    b = np.array([2, -8], np.int32).view(np.uint32)
    assert list(elementwise("min.s32 %d, %a, %b;", a, b).view(np.int32)) == [-5, -8]
    assert list(elementwise("min.u32 %d, %a, %b;", a, b).view(np.int32)) == [2, 3]
    assert list(elementwise("max.s32 %d, %a, %b;", a, b).view(np.int32)) == [2, 3]
    assert list(elementwise("abs.s32 %d, %a;", a).view(np.int32)) == [5, 3]
    assert list(elementwise("neg.s32 %d, %a;", a).view(np.int32)) == [5, -3]


def test_min_max_relu_clamps_negative_results_to_zero():
    a = np.array([-5, 3, -1, 4], np.int32).view(np.uint32)
    b = np.array([-3, -8, 0, 2], np.int32).view(np.uint32)
    assert list(elementwise("max.relu.s32 %d, %a, %b;", a, b).view(np.int32)) == [0, 3, 0, 4]
    assert list(elementwise("min.relu.s32 %d, %a, %b;", a, b).view(np.int32)) == [0, 0, 0, 2]


def test_shifts_clamp():
    a = np.array([0x80000001] * 4, np.uint32)
    n = np.array([1, 31, 32, 100], np.uint32)
    assert list(elementwise("shl.b32 %d, %a, %b;", a, n)) == [2, 0x80000000, 0, 0]
    assert list(elementwise("shr.u32 %d, %a, %b;", a, n)) == [0x40000000, 1, 0, 0]
    assert list(elementwise("shr.s32 %d, %a, %b;", a, n)) == [0xC0000000, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF]


def test_bit_field_and_permute():
    a = np.array([0xDEADBEEF] * 4, np.uint32)
    assert list(elementwise("bfe.u32 %d, %a, 8, 8;", a)) == [0xBE] * 4
    assert list(elementwise("bfe.s32 %d, %a, 8, 8;", a).view(np.int32)) == [np.int8(-66)] * 4
    assert list(elementwise("bfe.u32 %d, %a, 28, 8;", a)) == [0xD] * 4
    assert list(elementwise("bfe.s32 %d, %a, 28, 8;", a).view(np.int32)) == [-3] * 4
    assert list(elementwise("bfe.u32 %d, %a, 4, 0;", a)) == [0] * 4
    assert list(elementwise("bfi.b32 %d, %a, %b, 8, 8;", np.full(1, 0x12, np.uint32),
                            np.full(1, 0xFFFFFFFF, np.uint32))) == [0xFFFF12FF]
    a, b = np.full(1, 0x33221100, np.uint32), np.full(1, 0x77665544, np.uint32)
    assert list(elementwise("prmt.b32 %d, %a, %b, 0x7531;", a, b)) == [0x77553311]
    assert list(elementwise("prmt.b32 %d, %a, %b, 0x8880;", a, np.full(1, 0x000000F0, np.uint32))) == [0x00000000]
    assert list(elementwise("prmt.b32 %d, %a, %b, 0x0004;", a, np.full(1, 0x000000F0, np.uint32))) == [0x000000F0]
    assert list(elementwise("prmt.b32 %d, %a, %b, 0x000C;", a, np.full(1, 0x000000F0, np.uint32))) == [0x000000FF]


def _prmt(a, b, selector):
    """prmt.b32's default mode: byte i of the result is byte (nibble i & 7) of {b, a}, or with
    the nibble's top bit set that byte's sign bit replicated (ISA 9.7.8.7)."""
    pool = int(a).to_bytes(4, "little") + int(b).to_bytes(4, "little")
    out = 0
    for i in range(4):
        nibble = selector >> 4 * i & 0xF
        byte = pool[nibble & 7]
        out |= ((0xFF if byte & 0x80 else 0) if nibble & 8 else byte) << 8 * i
    return out


@pytest.mark.parametrize("selector", [0x3210, 0x8888, 0xBA98, 0xF7E6, 0x40C8])
def test_prmt_picks_and_sign_replicates_every_byte(selector):
    a = np.array([0x80FF7F01, 0x00F08001, 0x12345678], np.uint32)
    b = np.array([0x7F80FE02, 0x80000080, 0x9ABCDEF0], np.uint32)
    want = [_prmt(x, y, selector) for x, y in zip(a, b)]
    assert list(elementwise(f"prmt.b32 %d, %a, %b, {selector:#x};", a, b)) == want, "immediate selector"
    assert list(elementwise("prmt.b32 %d, %a, %b, %c;", a, b, np.full(3, selector, np.uint32))) == want, "register"


def test_popc_clz_brev_lop3():
    a = np.array([0, 1, 0xF0F0, 0x80000000, 0xFFFFFFFF], np.uint32)
    assert list(elementwise("popc.b32 %d, %a;", a)) == [0, 1, 8, 1, 32]
    assert list(elementwise("clz.b32 %d, %a;", a)) == [32, 31, 16, 0, 0]
    assert list(elementwise("brev.b32 %d, %a;", a)) == [0, 0x80000000, 0x0F0F0000, 1, 0xFFFFFFFF]
    assert list(elementwise("mov.b64 %A, {%a, %b}; clz.b64 %d, %A;", np.array([0, 1], np.uint32),
                            np.array([0, 0], np.uint32))) == [64, 63]
    wide = np.array([0, 1, 1 << 32, 1 << 63, (1 << 40) | 5, 2**64 - 1], np.uint64)   # the high word counts too
    assert list(elementwise("clz.b64 %d, %A; cvt.u64.u32 %D, %d;", wide, wide=True)) == [64, 63, 31, 0, 23, 0]
    assert list(elementwise("popc.b64 %d, %A; cvt.u64.u32 %D, %d;", wide, wide=True)) == [0, 1, 1, 1, 3, 64]
    x, y, z = (np.array([v], np.uint32) for v in (0xF0F0F0F0, 0xCCCCCCCC, 0xAAAAAAAA))
    assert list(elementwise("lop3.b32 %d, %a, %b, %c, 0x96;", x, y, z)) == [0xF0F0F0F0 ^ 0xCCCCCCCC ^ 0xAAAAAAAA]


def test_setp_combinations_and_predicate_logic():
    a = np.array([1, 5, 0xFFFFFFFF], np.uint32)
    b = np.array([2, 5, 1], np.uint32)
    out = elementwise("setp.lt.s32 %p|%q, %a, %b; selp.u32 %d, 1, 0, %p; selp.u32 %e, 1, 0, %q;",
                      a, b, extra=True)
    assert list(out[0]) == [1, 0, 1] and list(out[1]) == [0, 1, 0]
    out = elementwise("setp.lo.u32 %p, %a, %b;  selp.u32 %d, 1, 0, %p;", a, b)
    assert list(out) == [1, 0, 0]
    out = elementwise("setp.ne.u32 %q, %c, 0; setp.eq.and.u32 %p, %a, %b, !%q; selp.u32 %d, 1, 0, %p;",
                      a, b, np.array([0, 0, 0], np.uint32))
    assert list(out) == [0, 1, 0]
    # setp.cmp.bop p|q, a, b, c: p = (a cmp b) bop c, q = !(a cmp b) bop c (ISA 9.7.6.1)
    a4, b4, c4 = (np.array(v, np.uint32) for v in ([1, 5, 7, 1], [2, 5, 3, 2], [1, 1, 1, 0]))
    for bop, want_p, want_q in (("and", [1, 0, 0, 0], [0, 1, 1, 0]), ("or", [1, 1, 1, 1], [1, 1, 1, 0])):
        out = elementwise(f".reg .pred %r; setp.ne.u32 %r, %c, 0; setp.lt.{bop}.u32 %p|%q, %a, %b, %r; "
                          "selp.u32 %d, 1, 0, %p; selp.u32 %e, 1, 0, %q;", a4, b4, c4, extra=True)
        assert list(out[0]) == want_p and list(out[1]) == want_q, bop
    out = elementwise("setp.gt.u32 %p, %a, 1; setp.gt.u32 %q, %b, 1; xor.pred %p, %p, %q; "
                      "not.pred %q, %p; or.pred %p, %p, %q; selp.u32 %d, 7, 9, %p; "
                      "selp.u32 %e, 1, 0, %q;", a, b, extra=True)
    assert list(out[0]) == [7, 7, 7] and list(out[1]) == [0, 1, 0]


def test_predicated_execution():
    a = np.array([1, 2, 3, 4], np.uint32)
    out = elementwise("mov.u32 %d, 100; setp.gt.u32 %p, %a, 2; @%p add.u32 %d, %d, %a; "
                      "@!%p sub.u32 %d, %d, %a;", a)
    assert list(out) == [99, 98, 103, 104]


def test_mov_pack_unpack_and_cvt_int():
    a = np.array([0x11223344], np.uint32)
    out = elementwise(".reg .b16 %lo, %hi; mov.b32 {%lo, %hi}, %a; mov.b32 %d, {%hi, %lo};", a)
    assert out[0] == 0x33441122
    out = elementwise("mov.b64 %A, {%a, %b}; mov.b64 {%e, %d}, %A;", a, np.array([7], np.uint32), extra=True)
    assert out[0][0] == 7 and out[1][0] == 0x11223344
    x = np.array([0xFFFFFF80, 0x1FF, 0x80000000], np.uint32)
    assert list(elementwise("cvt.s32.s8 %d, %a;", x).view(np.int32)) == [-128, -1, 0]
    assert list(elementwise("cvt.u32.u8 %d, %a;", x)) == [0x80, 0xFF, 0]
    assert list(elementwise("cvt.sat.u8.s32 %d, %a;", x)) == [0, 255, 0]
    assert list(elementwise("cvt.sat.s16.s32 %d, %a;", x).view(np.int32)) == [-128, 0x1FF, -32768]
    out = elementwise("cvt.u64.s32 %A, %a; mov.b64 {%d, %e}, %A;", x, extra=True)
    assert list(out[1]) == [0xFFFFFFFF, 0, 0xFFFFFFFF]


def test_dp4a_byte_products_by_signedness():
    rng = np.random.default_rng(4)
    a = rng.integers(0, 2**32, 64, dtype=np.uint64).astype(np.uint32)
    b = rng.integers(0, 2**32, 64, dtype=np.uint64).astype(np.uint32)
    c = rng.integers(0, 2**32, 64, dtype=np.uint64).astype(np.uint32)
    for atype, btype in (("u32", "s32"), ("s32", "s32"), ("u32", "u32"), ("s32", "u32")):
        x = a.view(np.int8 if atype == "s32" else np.uint8).reshape(-1, 4).astype(np.int64)
        y = b.view(np.int8 if btype == "s32" else np.uint8).reshape(-1, 4).astype(np.int64)
        want = ((x * y).sum(axis=1) + c.view(np.int32 if "s32" in (atype, btype) else np.uint32)) % 2**32
        got = elementwise(f"dp4a.{atype}.{btype} %d, %a, %b, %c;", a, b, c)
        assert np.array_equal(got, want.astype(np.uint32)), (atype, btype)
