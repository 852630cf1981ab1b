"""Exactly rounded float helpers: fused multiply-add without double rounding, and narrowing
to f32/f16/bf16 under every PTX rounding mode.

Values travel as float64 wherever the narrower source formats are exact in it; bf16 travels
as raw uint16 bits because numpy has no bf16 type.
"""
import numpy as np

_STEP_BITS = {np.dtype(np.float16): np.uint16, np.dtype(np.float32): np.uint32,
              np.dtype(np.float64): np.uint64}


def flush_subnormal(x):
    """The .ftz rule: subnormal inputs and results become zero of the same sign."""
    x = np.asarray(x)
    tiny = np.abs(x) < np.finfo(x.dtype).tiny
    if not tiny.any():
        return x
    return np.where(tiny, np.copysign(np.zeros_like(x), x), x)


def is_subnormal(x):
    x = np.asarray(x)
    return (np.abs(x) < np.finfo(x.dtype).tiny) & (x != 0)


def _round_to_odd(s, err):
    """s + err (exact, s = RN(s + err)) rounded to f64 by round-to-odd.

    Rounding once more to a format with at least two fewer significand bits then gives the
    correctly rounded result, which is why the FMA and the bf16 paths go through here."""
    s = np.asarray(s, np.float64)
    fix = (err != 0) & np.isfinite(s) & ((s.view(np.uint64) & 1) == 0)
    if fix.any():
        s = np.where(fix, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s


def _two_sum(a, b):
    """s = RN(a + b) and the exact error: a + b == s + err."""
    s = a + b
    bv = s - a
    return s, (a - (s - bv)) + (b - bv)


def _exact_sum(a, b, mode):
    """s = RN(a + b) and its exact error, for the rounding by mode. An exact zero sum of
    operands of opposite signs is +0, but -0 under roundTowardNegative (IEEE 754 6.3): under .rm
    the negated operands are summed and the sum negated, which RN's symmetry allows; (+0) + (+0)
    stays +0 that way and (-0) + (-0) -0."""
    if mode == "rm":
        s, err = _two_sum(-a, -b)
        return -s, -err
    return _two_sum(a, b)


def round_sum(s, err, kind, mode):
    """The exact value s + err (s = RN(s + err) in float64) rounded to kind by mode."""
    if kind != "f64":
        return narrow(_round_to_odd(s, err), kind, mode)
    s = np.asarray(s, np.float64)
    if mode == "rn":
        return s
    if mode == "rz":
        step = np.where((s > 0) & (err < 0), -1, np.where((s < 0) & (err > 0), 1, 0))
    else:
        step = np.where(err < 0, -1, 0) if mode == "rm" else np.where(err > 0, 1, 0)
    return np.where(step != 0, np.nextafter(s, np.where(step > 0, np.inf, -np.inf)), s)


def fma(a, b, c, kind, mode="rn"):
    """Correctly rounded a*b+c for f32/f16/bf16 inputs given as exact float64 arrays.

    The float64 product of two such inputs is exact; TwoSum gives the exact error of the
    addition, and round-to-odd keeps the final narrowing from double rounding (the
    counterexample 1+2^-23, 2^-24*(1-2^-23), 1+2^-23 needs exactly this)."""
    p = np.asarray(a, np.float64) * b
    c = np.asarray(c, np.float64)
    if kind == "f32" and mode == "rn":
        # Rounding p + c to f64 first only goes wrong where it lands exactly on a midpoint
        # between f32 neighbours (or in the f32 subnormal range); redo just those exactly.
        # A zero sum is exact (and correctly signed) in f64 already.
        s = np.asarray(p + c)
        out = s.astype(np.float32)
        risky = ((s.view(np.uint64) & 0x1FFFFFFF) == 0x10000000) | ((np.abs(s) < 2.0**-125) & (s != 0))
        if risky.any():
            p, c = np.broadcast_arrays(p, c)
            sub, err = _two_sum(p[risky], c[risky])
            out[risky] = round_sum(sub, np.where(np.isfinite(sub), err, 0.0), kind, mode)
        return out
    s, err = _exact_sum(p, c, mode)
    return round_sum(s, np.where(np.isfinite(s), err, 0.0), kind, mode)


def add(a, b, kind, mode="rn"):
    """Correctly rounded a+b for inputs exact in float64 (f32 and narrower)."""
    s, err = _exact_sum(np.asarray(a, np.float64), np.asarray(b, np.float64), mode)
    return round_sum(s, np.where(np.isfinite(s), err, 0.0), kind, mode)


def int_to_float(x, kind, mode):
    """Any integer array -> kind, correctly rounded by mode (64-bit values included)."""
    x = np.asarray(x)
    wide = x.astype(np.int64 if x.dtype.kind == "i" else np.uint64)
    hi = (wide >> 32).astype(np.float64) * 4294967296.0
    lo = (wide & 0xFFFFFFFF).astype(np.float64)
    s, err = _two_sum(hi, lo)
    return round_sum(s, err, kind, mode)


def _f32_odd(x):
    """float64 -> float32 by round-to-odd (exactness kept in the last bit)."""
    r = x.astype(np.float32)
    back = r.astype(np.float64)
    fix = (back != x) & np.isfinite(back) & ((r.view(np.uint32) & 1) == 0)
    if fix.any():
        r = np.where(fix, np.nextafter(r, np.where(x > back, np.float32(np.inf),
                                                   np.float32(-np.inf))), r)
    return r


def f32_to_bf16_bits(x):
    """float32 -> bf16 bits, round to nearest even; NaNs stay (quiet) NaNs."""
    bits = np.asarray(x, np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)) >> 16
    quiet_nan = (bits >> 16) | np.uint32(0x40)
    return np.where(np.isnan(x), quiet_nan, rounded).astype(np.uint16)


def bf16_bits_to_f32(bits):
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


def _step(bits, up, sign_mask):
    """The next representable value above (up) or below, on sign-magnitude bit patterns."""
    one = bits.dtype.type(1)
    neg = (bits & sign_mask) != 0
    mag = bits & ~sign_mask
    away = neg != up                      # moving away from zero
    from_zero = (mag == 0) & ~away        # +0 down or -0 up crosses to the other sign
    out = np.where(away, bits + one, bits - one)
    return np.where(from_zero, np.where(up, one, sign_mask | one), out).astype(bits.dtype)


def narrow(x, kind, mode):
    """float64 x -> kind ('f64', 'f32', 'f16' as numpy floats; 'bf16' as uint16 bits)
    rounded by mode (rn, rz, rm, rp)."""
    x = np.asarray(x, np.float64)
    if kind == "f64":
        return x
    if kind == "bf16":
        r = f32_to_bf16_bits(_f32_odd(x))
        back = bf16_bits_to_f32(r).astype(np.float64)
        sign_mask = np.uint16(0x8000)
        bits = r
    else:
        r = x.astype(np.float32 if kind == "f32" else np.float16)
        if mode == "rn":
            return r
        back = r.astype(np.float64)
        bits = r.view(_STEP_BITS[r.dtype])
        sign_mask = bits.dtype.type(1 << (8 * bits.dtype.itemsize - 1))
    if mode == "rn":
        return r
    if mode == "rz":
        up_fix, down_fix = (back < x) & (back < 0), (back > x) & (back > 0)
    elif mode == "rm":
        up_fix, down_fix = np.zeros_like(x, bool), back > x
    elif mode == "rp":
        up_fix, down_fix = back < x, np.zeros_like(x, bool)
    else:
        raise ValueError(mode)
    ok = ~np.isnan(x)
    bits = np.where(ok & up_fix, _step(bits, True, sign_mask), bits)
    bits = np.where(ok & down_fix, _step(bits, False, sign_mask), bits)
    return bits if kind == "bf16" else bits.view(r.dtype)


def decode(bits_or_values, kind):
    """A register's value as exact float64 for kind f16/bf16/f32/f64."""
    if kind == "bf16":
        return bf16_bits_to_f32(bits_or_values).astype(np.float64)
    return np.asarray(bits_or_values).astype(np.float64)


def round_integral(x, mode):
    """Round float64 to an integral value: rni (nearest even), rzi, rmi, rpi."""
    return {"rni": np.rint, "rzi": np.trunc, "rmi": np.floor, "rpi": np.ceil}[mode](x)


def float_to_int(x, dtype, mode, nan_value):
    """float64 -> integer dtype: round by mode, saturate to the range, NaN -> nan_value."""
    info = np.iinfo(dtype)
    r = round_integral(np.asarray(x, np.float64), mode)
    nan = np.isnan(r)
    lo, hi = r <= info.min, r >= info.max
    safe = np.where(nan | lo | hi, 0, r)
    out = safe.astype(dtype)
    out = np.where(lo, dtype.type(info.min), out)
    out = np.where(hi, dtype.type(info.max), out)
    return np.where(nan, nan_value, out).astype(dtype)


def finest(values):
    """The largest power of two that each float64 value is an integer multiple of (inf for
    0, inf and NaN; at least 2^-1022). Bit operations: numpy's frexp/ldexp are slow."""
    bits = np.asarray(values, np.float64).view(np.uint64)
    field = (bits >> np.uint64(52)) & np.uint64(0x7FF)
    mantissa = bits & np.uint64((1 << 52) - 1)
    normal = field != 0
    mantissa = np.where(normal, mantissa | np.uint64(1 << 52), mantissa)
    lowest = mantissa & (~mantissa + np.uint64(1))                  # its lowest set bit
    shift = (lowest.astype(np.float64).view(np.uint64) >> np.uint64(52)).astype(np.int64) - 1023
    exponent = np.maximum(np.maximum(field.astype(np.int64), 1) - 1075 + shift, -1022)
    out = ((exponent + 1023).astype(np.uint64) << np.uint64(52)).view(np.float64)
    return np.where((field == 0x7FF) | (mantissa == 0), np.inf, out)
