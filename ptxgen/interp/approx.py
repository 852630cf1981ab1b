"""Results of the approximate instructions (.approx functions, div.full, mma.sync accumulation).

Mode "exact": the exact result rounded once to f32 (what the hardware approximates).
Mode "pessimistic" (launch's default): the exact result moved by up to the hardware's error
bound, then rounded to an f32 that still lies within the bound. The move is a fixed function of
the instruction, its input bits and the launch seed (splitmix64 of them, uniform in the bound):
like the hardware, the same input always gives the same output, whatever thread, CTA or grid
computes it, so runs are deterministic and bit-comparisons across grids stay meaningful. A
kernel that passes must tolerate any error the GPU may make, not rely on exact functions.

Special inputs keep the results the PTX ISA tables give (0, infinities, NaN, sin(+-0) = +-0,
ex2(+-0) = 1, ...); .ftz flushes inputs and results as the instruction says (ops.py).
"""
import numpy as np

from ..errors import LaunchError
# The error bounds (measured on an H100, else the PTX ISA's), shared with the kinds' error analyses.
from ..hardware_errors import (DIV_ULPS, EX2_REL, LG2_ABS, MMA_SUM, RCP_REL, RSQRT_REL, SIN_COS_ABS, SQRT_REL,
                               TANH_REL)
from . import numerics as nm

_MODES = ("pessimistic", "exact")
_KEYS = (np.uint64(0xD6E8FEB86659FD93), np.uint64(0xA0761D6478BD642F))   # odd: bijective products
_SALT = {name: np.uint64(0x9E3779B97F4A7C15 * (i + 1) & (2**64 - 1)) for i, name in enumerate(
    ("sin", "cos", "tanh", "ex2", "lg2", "rsqrt", "rcp", "sqrt", "div", "mma"))}


def _mix(x):
    """splitmix64's finaliser: a well-spread 64-bit hash of each uint64 (wrapping arithmetic;
    in place on a fresh copy, as fresh arrays are costly)."""
    x = np.array(x, np.uint64)
    shifted = np.empty_like(x)
    for shift, factor in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB), (31, None)):
        np.right_shift(x, np.uint64(shift), out=shifted)
        np.bitwise_xor(x, shifted, out=x)
        if factor is not None:
            np.multiply(x, np.uint64(factor), out=x)
    return x


def _uniform(h):
    """uint64 hashes -> floats uniform in [-1, 1)."""
    return (h >> np.uint64(11)).astype(np.float64) * 2.0**-52 - 1.0


def _within(exact, moved, bound):
    """f32 nearest to `moved`, stepped toward `exact` where rounding left the bound (the exact
    result rounded once where even that step does not fit)."""
    r = moved.astype(np.float32)
    out = np.abs(r.astype(np.float64) - exact) > bound
    if out.any():
        target = exact.astype(np.float32)
        r = np.where(out, np.nextafter(r, target), r)
        r = np.where(np.abs(r.astype(np.float64) - exact) > bound, target, r)
    return r


class Approx:
    """The approximate-instruction model of one launch."""

    def __init__(self, mode, seed):
        if mode not in _MODES:
            raise LaunchError(f"approx: expected one of {', '.join(_MODES)}, got {mode!r}")
        self.exact = mode == "exact"
        self.seed = _mix(np.array([(seed + 0x632BE59BD9B4E019) & (2**64 - 1)], np.uint64))[0]

    def _u(self, name, *bits):
        """Uniform in [-1, 1), a hash of the instruction, the seed and the input bits."""
        h = np.bitwise_xor(bits[0], _SALT[name] ^ self.seed, dtype=np.uint64)
        for key, more in zip(_KEYS, bits[1:]):
            h ^= np.multiply(more, key, dtype=np.uint64)
        return _uniform(_mix(h))

    def unary(self, name, x):
        """name.approx.f32 of float32 inputs x (already flushed if .ftz) -> float32."""
        x = np.atleast_1d(np.asarray(x, np.float32))
        x64 = x.astype(np.float64)
        exact = EXACT[name](x64)
        if self.exact:
            return exact.astype(np.float32)
        u = self._u(name, x.view(np.uint32))
        if name in ("sin", "cos"):
            bound = np.select([np.abs(x64) < limit for limit, _ in SIN_COS_ABS],
                              [b for _, b in SIN_COS_ABS], np.nan)
            r = np.clip(_within(exact, exact + u * bound, bound), -1, 1)
            keep = ~np.isfinite(x64) | ((x64 == 0) if name == "sin" else False)
        elif name == "lg2":
            r = _within(exact, exact + u * LG2_ABS, LG2_ABS)
            keep = ~np.isfinite(exact) | np.isnan(x64)
        else:
            rel = {"tanh": TANH_REL, "ex2": EX2_REL, "rsqrt": RSQRT_REL, "rcp": RCP_REL,
                   "sqrt": SQRT_REL}[name]
            bound = np.abs(exact) * rel
            r = _within(exact, exact + u * bound, bound)
            keep = ~np.isfinite(exact) | (exact == 0) | ~np.isfinite(x64) | ((x64 == 0) & (name == "ex2"))
            if name == "tanh":      # subnormal inputs pass through (ISA 9.7.3.22): tanh(x) rounds to x
                r = np.clip(r, -1, 1)
                keep |= np.abs(x) < np.finfo(np.float32).tiny
        return np.where(keep, exact.astype(np.float32), r)

    def upper_word(self, name, x):
        """rcp/rsqrt.approx.ftz.f64 of float64 x (ISA 9.7.3.14, 9.7.3.17): the function of the
        1.11.20 float in x's upper word (the low word ignored, a subnormal flushed to a zero of
        its sign), as a 1.11.20 float in the result's upper word (the low word zero; a subnormal
        result flushed, a NaN the canonical 0x7fffffff00000000). The ISA gives no error bound
        for this "gross approximation": assumed faithful, either 1.11.20 neighbour of the exact
        value (the nearest in exact mode); special values are exact."""
        low = np.uint64(0xFFFFFFFF)
        word = np.atleast_1d(np.asarray(x, np.float64)).view(np.uint64) & ~low
        exact = EXACT[name](nm.flush_subnormal(word.view(np.float64))).view(np.uint64)
        toward_zero = exact & ~low
        if self.exact:      # to nearest, ties to even
            up = (exact & low) > np.uint64(0x80000000) - ((toward_zero >> np.uint64(32)) & np.uint64(1))
        else:
            up = ((exact & low) != 0) & (self._u(name, word) >= 0)
        r = nm.flush_subnormal((toward_zero + (up.astype(np.uint64) << np.uint64(32))).view(np.float64))
        return np.where(np.isnan(r), np.uint64(0x7FFFFFFF00000000).view(np.float64), r)

    def divide(self, a, b, approx):
        """div.full.f32 / div.approx.f32 of float32 arrays -> float32."""
        a, b = np.broadcast_arrays(np.atleast_1d(np.asarray(a, np.float32)), np.asarray(b, np.float32))
        exact = a.astype(np.float64) / b.astype(np.float64)
        if approx:      # d = a * (1/b): for 2^126 < |b| the reciprocal underflows to +-0
            huge = np.abs(b) > np.float32(2.0**126)
            exact = np.where(huge & np.isfinite(b), exact * 0.0, exact)     # +-0, inf * 0 = NaN
        if self.exact:
            return exact.astype(np.float32)
        nearest = exact.astype(np.float32)
        bound = DIV_ULPS * np.spacing(np.abs(nearest)).astype(np.float64)
        u = self._u("div", a.view(np.uint32), b.view(np.uint32))
        r = _within(exact, exact + u * bound, bound)
        # zeros, infinities, NaNs and quotients past the f32 range (their bound is NaN) as rounded
        return np.where(np.isfinite(nearest) & (exact != 0), r, nearest)

    def mma(self, A, B, C):
        """D = A B + C of one m16n8k16 per warp: A [w, 16, 16], B [w, 16, 8] exact float64
        values of the halves, C [w, 16, 8] float32 -> float32 [w, 16, 8]."""
        c64 = C.astype(np.float64)
        exact = np.matmul(A, B) + c64          # products exact in f64, sums to 53 bits
        rounded = exact.astype(np.float32)
        if self.exact:
            return rounded
        total = np.matmul(np.abs(A), np.abs(B)) + np.abs(c64)
        # the move is a function of the exact sum, sum |a b| and c: of the addends alone, like
        # the hardware's result (a product by zero counts the same whatever the other factor)
        u = self._u("mma", exact.view(np.uint64), total.view(np.uint64), (c64 + 0.0).view(np.uint64))
        bound = MMA_SUM * total
        r = _within(exact, exact + u * bound, bound)
        # The tensor core aligns the addends to the largest one: where the result and the sum of
        # the magnitudes are both f32 values, no addend lost a bit (small integers, a zero A
        # row), so the result is exact. A function of the products alone, as the hardware's is.
        keep = ~np.isfinite(exact) | ((rounded == exact) & (total.astype(np.float32) == total))
        return np.where(keep, rounded, r)


# float64 functions of the approximated instructions (computed in float64, rounded once)
EXACT = {"ex2": np.exp2, "lg2": np.log2, "sin": np.sin, "cos": np.cos, "tanh": np.tanh,
         "rsqrt": lambda x: 1.0 / np.sqrt(x), "rcp": lambda x: 1.0 / x, "sqrt": np.sqrt}
