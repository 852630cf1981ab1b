"""Approximate instructions: in the default pessimistic mode every result lies within the error
the H100 was measured to make (approx.py), is moved there for most inputs, depends only on the
input bits and the seed, and keeps the ISA's special values; .ftz flushes; approx="exact"
rounds the exact result once."""
import numpy as np
import pytest

from ptxgen.errors import InterpError, LaunchError
from ptxgen.interp import approx as model
from interp_helpers import elementwise, f32

RNG = np.random.default_rng(11)
N = 2048


def run(snippet, x, y=None, **options):
    out = elementwise(snippet, f32(x), None if y is None else f32(y), **options)
    return out.view(np.float32).astype(np.float64)


def sin_cos_bound(x):
    return np.select([np.abs(x) < limit for limit, _ in model.SIN_COS_ABS], [b for _, b in model.SIN_COS_ABS])


# (instruction, inputs, exact function, allowed |error| as a function of (x, exact))
CASES = {
    "sin": ("sin.approx.f32 %d, %a;", RNG.uniform(-np.pi, np.pi, N), np.sin, lambda x, e: sin_cos_bound(x)),
    "sin-far": ("sin.approx.f32 %d, %a;", RNG.uniform(-1e4, 1e4, N), np.sin, lambda x, e: sin_cos_bound(x)),
    "cos": ("cos.approx.f32 %d, %a;", RNG.uniform(-100, 100, N), np.cos, lambda x, e: sin_cos_bound(x)),
    "tanh": ("tanh.approx.f32 %d, %a;", RNG.uniform(-5, 5, N), np.tanh, lambda x, e: model.TANH_REL * np.abs(e)),
    "ex2": ("ex2.approx.ftz.f32 %d, %a;", RNG.uniform(-30, 30, N), np.exp2, lambda x, e: model.EX2_REL * e),
    "lg2": ("lg2.approx.f32 %d, %a;", np.exp2(RNG.uniform(-2, 2, N)), np.log2, lambda x, e: model.LG2_ABS + 0 * x),
    "rsqrt": ("rsqrt.approx.f32 %d, %a;", np.exp(RNG.uniform(-20, 20, N)), lambda x: 1 / np.sqrt(x),
              lambda x, e: model.RSQRT_REL * e),
    "rcp": ("rcp.approx.ftz.f32 %d, %a;", RNG.standard_normal(N) * 1e3, lambda x: 1 / x,
            lambda x, e: model.RCP_REL * np.abs(e)),
    "sqrt": ("sqrt.approx.f32 %d, %a;", np.exp(RNG.uniform(-20, 20, N)), np.sqrt, lambda x, e: model.SQRT_REL * e),
}


@pytest.mark.parametrize("name", CASES)
def test_pessimistic_results_lie_within_the_measured_bound_and_move(name):
    snippet, x, fn, bound = CASES[name]
    x = f32(x).astype(np.float64)
    exact = fn(x)
    got = run(snippet, x)
    error = np.abs(got - exact)
    # an f32 result is at least rounded: where the bound is below half an ulp, the rounded exact value
    allowed = np.maximum(bound(x, exact), 0.5 * np.spacing(np.abs(exact).astype(np.float32)))
    worst = np.argmax(error / allowed)
    assert (error <= allowed).all(), f"{name}({x[worst]!r}) = {got[worst]!r}, exact {exact[worst]!r}: error {error[worst]:.3g} > {allowed[worst]:.3g}"
    rounded = exact.astype(np.float32).astype(np.float64)
    moved = np.mean(got != rounded)
    assert moved > 0.3, f"{name}: only {moved:.0%} of the results differ from the exact result rounded once"
    assert np.max(error / allowed) > 0.5, f"{name}: the errors never come near the bound"
    assert np.array_equal(run(snippet, x, approx="exact"), rounded), f"{name}: approx='exact' is the rounded exact result"


def test_results_depend_on_the_input_and_seed_only():
    x = RNG.permutation(np.repeat(f32(RNG.uniform(-3, 3, 64)), 8))   # each input in 8 threads, several CTAs
    b = run("sin.approx.f32 %d, %a;", x)
    same_input = {}
    for value, result in zip(x, b):
        same_input.setdefault(value, set()).add(result)
    assert all(len(results) == 1 for results in same_input.values()), "one input, several results"
    assert np.array_equal(b, run("sin.approx.f32 %d, %a;", x)), "not deterministic"
    assert not np.array_equal(b, run("sin.approx.f32 %d, %a;", x, seed=5)), "the seed changes nothing"


def test_special_values_follow_the_isa_tables():
    inf, nan = np.inf, np.nan
    ex2 = run("ex2.approx.ftz.f32 %d, %a;", [-inf, 0.0, -0.0, inf, nan])
    assert ex2[0] == 0 and not np.signbit(ex2[0]) and ex2[1] == ex2[2] == 1 and ex2[3] == inf and np.isnan(ex2[4])
    lg2 = run("lg2.approx.f32 %d, %a;", [0.0, -1.0, inf, nan])
    assert lg2[0] == -inf and np.isnan(lg2[1]) and lg2[2] == inf and np.isnan(lg2[3])
    rsqrt = run("rsqrt.approx.f32 %d, %a;", [0.0, -0.0, inf, -1.0])
    assert rsqrt[0] == inf and rsqrt[1] == -inf and rsqrt[2] == 0 and np.isnan(rsqrt[3])
    rcp = run("rcp.approx.f32 %d, %a;", [0.0, -0.0, inf, -inf])
    assert list(rcp) == [inf, -inf, 0.0, -0.0] and np.signbit(rcp[3])
    sin = run("sin.approx.f32 %d, %a;", [0.0, -0.0, inf])
    assert sin[0] == 0 and np.signbit(sin[1]) and np.isnan(sin[2])
    tanh = run("tanh.approx.f32 %d, %a;", [0.0, inf, -inf, 30.0])
    assert list(tanh) == [0.0, 1.0, -1.0, 1.0]
    assert list(run("sqrt.approx.f32 %d, %a;", [0.0, inf])) == [0.0, inf]
    assert np.abs(run("cos.approx.f32 %d, %a;", RNG.uniform(-1e5, 1e5, 512))).max() <= 1


def test_tanh_passes_subnormal_inputs_through():
    x = np.concatenate([np.arange(1, 2**23, 4099), np.arange(1, 2**23, 4099) | 0x80000000]).astype(np.uint32)
    for seed in (0, 1, 2):
        assert np.array_equal(elementwise("tanh.approx.f32 %d, %a;", x, seed=seed), x)
    normal = f32(RNG.uniform(1, 2, 256) * 2.0**-126).astype(np.float64)       # still moved within the bound
    assert np.mean(run("tanh.approx.f32 %d, %a;", normal) != normal) > 0.3


def test_rcp_rsqrt_approx_ftz_f64_compute_on_the_upper_word():
    """ISA 9.7.3.14 and 9.7.3.17: the result's upper word approximates the function of the input's
    upper word (a 1.11.20 float; subnormals flushed), its low word is zero. Modelled as either
    1.11.20 neighbour of the exact value, the nearest in exact mode."""
    nan, inf = "0x7fffffff00000000", "0x7ff0000000000000"
    special = np.array([-np.inf, -1e-310, -0.0, 0.0, 1e-310, np.inf, np.nan, 1e308, -4.0])
    rcp = elementwise("rcp.approx.ftz.f64 %D, %A;", special, wide=True)
    assert [hex(v) for v in rcp] == ["0x8000000000000000", "0xfff0000000000000", "0xfff0000000000000", inf, inf,
                                     "0x0", nan, "0x0", "0xbfd0000000000000"]
    rsqrt = elementwise("rsqrt.approx.ftz.f64 %D, %A;", special, wide=True)
    assert [hex(v) for v in rsqrt] == [nan, "0xfff0000000000000", "0xfff0000000000000", inf, inf,
                                       "0x0", nan, "0x1ff573d700000000", nan]
    x = np.exp(RNG.uniform(-700, 700, N)) * np.where(np.arange(N) % 2 == 0, 1.0, -1.0)
    upper = (x.view(np.uint64) & np.uint64(0xFFFFFFFF00000000)).view(np.float64)
    for name, fn in (("rcp", lambda v: 1 / v), ("rsqrt", lambda v: 1 / np.sqrt(v))):
        positive = np.ones(N, bool) if name == "rcp" else x > 0
        exact = fn(upper[positive])
        spacing = np.spacing(np.abs(exact)) * 2.0**32       # of the 20-bit significand
        got = {}
        for mode in ("pessimistic", "exact"):
            out = elementwise(f"{name}.approx.ftz.f64 %D, %A;", x, wide=True, approx=mode)
            assert (out & np.uint64(0xFFFFFFFF) == 0).all(), f"{name}: the low word is not zero"
            got[mode] = out.view(np.float64)[positive]
        assert (np.abs(got["pessimistic"] - exact) <= spacing).all(), name
        assert (np.abs(got["exact"] - exact) <= spacing / 2).all(), name
        assert np.mean(got["pessimistic"] != got["exact"]) > 0.2, f"{name}: the pessimistic results never move"
        no_low_word = elementwise(f"{name}.approx.ftz.f64 %D, %A;", upper, wide=True).view(np.float64)[positive]
        assert np.array_equal(no_low_word, got["pessimistic"]), f"{name}: the input's low word matters"


@pytest.mark.parametrize("ins,message", [("rcp.approx.f64", "rcp.approx.f64 needs .ftz"),
                                         ("sin.approx.f64", "sin.approx.f64 is not a PTX instruction"),
                                         ("rsqrt.rn.f64", "rsqrt.rn.f64 is not a PTX instruction")])
def test_f64_approximations_the_isa_lacks_are_refused(ins, message):
    with pytest.raises(InterpError, match=message):
        elementwise(f"{ins} %D, %A;", np.ones(1), wide=True)

def test_ftz_flushes_inputs_and_results():
    tiny = 1e-40                   # an f32 subnormal
    assert run("ex2.approx.ftz.f32 %d, %a;", [tiny, -200.0]).tolist() == [1.0, 0.0]    # 2^-200: flushed
    assert run("ex2.approx.f32 %d, %a;", [-140.0])[0] > 0                              # subnormal kept
    assert run("rcp.approx.ftz.f32 %d, %a;", [tiny, 2.0**127]).tolist() == [np.inf, 0.0]
    assert 0 < run("rcp.approx.f32 %d, %a;", [2.0**127])[0] < 2.0**-126
    assert run("sqrt.approx.ftz.f32 %d, %a;", [tiny])[0] == 0
    assert run("rsqrt.approx.ftz.f32 %d, %a;", [tiny])[0] == np.inf
    assert run("lg2.approx.ftz.f32 %d, %a;", [tiny])[0] == -np.inf
    assert run("sin.approx.ftz.f32 %d, %a;", [tiny])[0] == 0
    assert run("div.full.ftz.f32 %d, %a, %b;", [tiny, 1.0], [1.0, 2.0**127]).tolist() == [0.0, 0.0]
    assert run("div.approx.ftz.f32 %d, %a, %b;", [1.0], [tiny])[0] == np.inf


@pytest.mark.parametrize("mode", ["full", "approx"])
def test_division_within_two_ulps(mode):
    a, b = RNG.standard_normal(N) * 100, RNG.standard_normal(N) * 100
    a, b = f32(a).astype(np.float64), f32(b).astype(np.float64)
    got = run(f"div.{mode}.f32 %d, %a, %b;", a, b)
    exact = a / b
    ulp = np.spacing(np.abs(exact.astype(np.float32))).astype(np.float64)
    assert (np.abs(got - exact) <= model.DIV_ULPS * ulp).all()
    assert np.mean(got != exact.astype(np.float32)) > 0.3
    assert np.array_equal(run(f"div.{mode}.f32 %d, %a, %b;", a, b, approx="exact"), exact.astype(np.float32))


def test_div_approx_of_a_huge_divisor_is_zero():
    # d = a * (1/b): past 2^126 the reciprocal underflows to a zero of b's sign; div.full scales instead
    a = f32([1.0, -1.0, 1.0, -3.0, np.inf, np.nan])
    b = f32([2.0**127, 2.0**127, -2.0**127, -1.5 * 2.0**126, 2.0**127, 2.0**127])
    for options in ({}, {"approx": "exact"}):
        out = elementwise("div.approx.f32 %d, %a, %b;", a, b, **options)
        assert list(out[:4]) == [0, 0x80000000, 0x80000000, 0] and np.isnan(out[4:].view(np.float32)).all()
    assert abs(run("div.full.f32 %d, %a, %b;", [2.0**100], [2.0**127])[0] - 2.0**-27) <= 2 * 2.0**-50


@pytest.mark.parametrize("mode", ["full", "approx"])
def test_division_overflow_is_a_signed_infinity(mode):
    for options in ({}, {"approx": "exact"}):
        out = run(f"div.{mode}.f32 %d, %a, %b;", [3e38, -3e38, 3e38], [0.5, 0.5, -0.25], **options)
        assert list(out) == [np.inf, -np.inf, -np.inf], options


def test_unknown_mode_is_refused():
    with pytest.raises(LaunchError, match="approx: expected one of pessimistic, exact"):
        run("sin.approx.f32 %d, %a;", [1.0], approx="fast")
