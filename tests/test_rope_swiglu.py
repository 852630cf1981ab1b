"""rope and swiglu: the real PTX in the interpreter (sanitizer on, outputs poisoned) vs float64.

rope's x is read and written ("inout"), so it keeps its input instead of poison; every pair is
checked element-wise against the float64 rotation at positions from 0 to the 2^24 limit, where a
naive f32 angle would be off by up to ~0.9 rad. swiglu's out starts NaN-poisoned, so an element
never written shows up as unwritten.
"""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from ptxgen.errors import LaunchError
from ptxgen.kernels.rope import ANGLE_ERROR, MAX_POS, ROPE_TOLERANCE, pair_norms, rotate
from ptxgen.kernels.swiglu import silu_mul
from ptxgen.runner import run
from ptxgen.verify import compare, verify_kernel

from helpers import assert_passes, make_kernel, resources

POSITIONS = (0, 1, 4095, 40959, 2**20 - 1, MAX_POS)
# Every element is also checked by verify.compare against the kinds' own error_bound (rope: the
# kernel's measured arithmetic error 3.7e-7 of a pair's norm + sqrt(2) times the H100's sin/cos.approx
# error 3.4e-7; swiglu: its per-element analysis); assert_pairs_rotated re-checks rope's pairs here.


def assert_pairs_rotated(x_in, x_out, pos, theta, bound=ANGLE_ERROR, style="rotate_half"):
    """Every (x1, x2) pair within bound * |(x1, x2)| of the float64 rotation."""
    x_in = x_in.astype(np.float64)
    reference = rotate(x_in, pos, theta, style)
    error = np.abs(x_out.astype(np.float64) - reference) / pair_norms(x_in, style)
    worst = np.unravel_index(np.argmax(error), error.shape)
    assert error[worst] <= bound, (
        f"pos {pos}: x{list(worst)} = {x_out[worst]!r}, float64 rotation {reference[worst]!r}: "
        f"error {error[worst]:.2e} of the pair's norm > {bound:.1e}")


# --- rope ------------------------------------------------------------------------------------
# head_dim 2 and 6, 10, 130 (odd half: scalar pairs), 12 (8-byte pairs), 64/128/256 (16-byte pairs,
# 2..5 chunk bits); num_heads 1, 3, 5, 8, 32; 3 * 64 / 4 = 48 threads: a partial CTA.
ROPE_SHAPES = [(2, 1), (6, 3), (10, 5), (12, 1), (64, 3), (128, 32), (128, 8), (130, 3), (256, 2)]


@pytest.mark.parametrize("style", ["rotate_half", "interleaved"])
@pytest.mark.parametrize("head_dim, num_heads", ROPE_SHAPES)
def test_rope_matches_float64_at_every_position(head_dim, num_heads, style):
    kernel = make_kernel("rope", head_dim=head_dim, num_heads=num_heads, style=style)
    kind = kernel.definition
    rng = np.random.default_rng(head_dim * 100 + num_heads)
    for pos in POSITIONS:
        scalars = {"pos": pos}
        inputs = kind.sample_inputs(rng, scalars)
        arrays = run(kernel, inputs, scalars)
        assert_passes(compare(kernel, arrays, kind.reference(inputs, scalars), scalars))
        assert_pairs_rotated(inputs["x"], arrays["x"], pos, kernel.config["theta"], style=style)


@pytest.mark.parametrize("theta, head_dim", [(10000.0, 128), (500000.0, 64), (1.0, 6), (1e9, 256)])
def test_rope_other_thetas(theta, head_dim):
    kernel = make_kernel("rope", head_dim=head_dim, num_heads=2, theta=theta)
    for scalars in kernel.definition.verify_scalars():
        assert_passes(verify_kernel(kernel, scalars, seed=int(theta) % 1000))


def test_rope_large_random_positions_stay_accurate():
    """Where a naive f32 angle fails badly: random positions up to 2^24, every pair checked."""
    kernel = make_kernel("rope", head_dim=128, num_heads=1)
    kind = kernel.definition
    rng = np.random.default_rng(7)
    for pos in [int(p) for p in rng.integers(2**16, MAX_POS + 1, size=12)] + [40960, 131071, 2**23 + 1]:
        x = kind.sample_inputs(rng, {"pos": pos})["x"]
        out = run(kernel, {"x": x}, {"pos": pos})["x"]
        assert_pairs_rotated(x, out, pos, kernel.config["theta"])


def test_rope_rotation_is_the_contract_formula():
    """The reference itself against a direct transcription of KERNELS.md."""
    kind = make_kernel("rope", head_dim=4, num_heads=1, theta=100.0).definition
    x = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
    y = kind.reference({"x": x}, {"pos": 3})["x"]
    a = 3 * np.array([1.0, 100.0 ** (-2 / 4)])
    expected = [1 * np.cos(a[0]) - 3 * np.sin(a[0]), 2 * np.cos(a[1]) - 4 * np.sin(a[1]),
                3 * np.cos(a[0]) + 1 * np.sin(a[0]), 4 * np.cos(a[1]) + 2 * np.sin(a[1])]
    np.testing.assert_allclose(y[0], expected, rtol=1e-15)
    assert kind.tolerance(kind.param("x")) == ROPE_TOLERANCE


def test_interleaved_rotation_is_gptj_pairs_and_rotate_half_of_the_permuted_head():
    """The interleaved reference: pairs (2i, 2i+1) by hand, and rotate-half of the same head with
    its elements reordered (what GGUF conversion undoes for llama's Q/K rows)."""
    kind = make_kernel("rope", head_dim=4, num_heads=1, theta=100.0, style="interleaved").definition
    x = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
    y = kind.reference({"x": x}, {"pos": 3})["x"]
    a = 3 * np.array([1.0, 100.0 ** (-2 / 4)])
    expected = [1 * np.cos(a[0]) - 2 * np.sin(a[0]), 2 * np.cos(a[0]) + 1 * np.sin(a[0]),
                3 * np.cos(a[1]) - 4 * np.sin(a[1]), 4 * np.cos(a[1]) + 3 * np.sin(a[1])]
    np.testing.assert_allclose(y[0], expected, rtol=1e-15)
    head = np.random.default_rng(0).standard_normal((3, 128))
    order = np.arange(128).reshape(64, 2).T.reshape(128)  # evens, then odds
    np.testing.assert_allclose(rotate(head, 77, 1e4, "interleaved")[:, order],
                               rotate(head[:, order], 77, 1e4, "rotate_half"), rtol=1e-13, atol=1e-13)


def test_rope_position_limits_are_enforced():
    kernel = make_kernel("rope", head_dim=8, num_heads=1)
    x = np.ones((1, 8), np.float32)
    for bad in (-1, MAX_POS + 1, 2**32, 1.5):
        with pytest.raises(LaunchError, match="pos"):
            run(kernel, {"x": x}, {"pos": bad})
    with pytest.raises(LaunchError, match="pos"):
        run(kernel, {"x": x}, {})


@pytest.mark.parametrize("config", [
    {"head_dim": 7, "num_heads": 1}, {"head_dim": 0, "num_heads": 1}, {"head_dim": 128, "num_heads": 0},
    {"head_dim": 128, "num_heads": 1, "theta": 0.5}, {"head_dim": 128, "num_heads": 1, "theta": 1e10},
    {"head_dim": 2048, "num_heads": 1},
])
def test_rope_rejects_bad_configs(config):
    with pytest.raises(ValidationError):
        make_kernel("rope", **config)


# --- swiglu ----------------------------------------------------------------------------------
# n = 1, 3 (tail only), 4 (one vector), 5, 7 (vector + tail), 1023 (2 CTAs, partial, 3-tail),
# 12288 (Qwen3-8B), 4 * (2^18 + 1) + 2 (the 256-thread, 4-vectors-per-thread plan, guarded).
SWIGLU_SIZES = (1, 3, 4, 5, 7, 1023, 12288, 4 * (2**18 + 1) + 2)


@pytest.mark.parametrize("n", SWIGLU_SIZES)
def test_swiglu_matches_float64(n):
    kernel = make_kernel("swiglu", n=n)
    kind = kernel.definition
    rng = np.random.default_rng(n)
    inputs = kind.sample_inputs(rng, {})
    arrays = run(kernel, inputs, {})
    checks = compare(kernel, arrays, kind.reference(inputs, {}), {})
    assert_passes(checks)
    assert checks[0].element_error is not None, "swiglu declares a per-element bound"


def test_swiglu_extreme_gates_give_the_limits():
    """gate -> -inf: 0 (no NaN from inf * 0); gate -> +inf: gate * up; around 0: smooth."""
    gates = np.array([100, -100, 88, -88, 50, -50, 20, -20, 1e-3, -1e-3, 0, 1e-30, -1e30, 1e30, 1e38, -1e38,
                      87.5, -87.5, 104, -104, 127, -127, 30, -30], dtype=np.float32)
    # 24 gates: six 16-byte vectors; the first 23: five vectors and a 3-element scalar tail.
    for gate in (gates, gates[:23]):
        up = np.linspace(-2.0, 3.0, gate.size).astype(np.float32)
        up[up == 0] = 0.5
        kernel = make_kernel("swiglu", n=gate.size)
        arrays = run(kernel, {"gate": gate, "up": up}, {})
        out = arrays["out"]
        assert_passes(compare(kernel, arrays, {"out": silu_mul(gate, up)}, {}))  # finite, within the bounds
        big = np.abs(gate) >= 100
        assert np.all(out[big & (gate > 0)] == (gate * up)[big & (gate > 0)]), "gate >> 0 must give gate * up"
        assert np.all(out[big & (gate < 0)] == 0), "gate << 0 must give 0"


def test_swiglu_negative_gates_stay_within_the_tolerance():
    """Where the exponent's rounding error is largest (2u |g| relative: up to 1e-5 at g = -86):
    a correct kernel must pass the relative L2 tolerance on every input, not only typical ones."""
    kernel = make_kernel("swiglu", n=1024)
    gate = np.linspace(-86.5, -20.0, 1024).astype(np.float32)
    up = np.random.default_rng(9).standard_normal(1024).astype(np.float32)
    arrays = run(kernel, {"gate": gate, "up": up}, {})
    assert_passes(compare(kernel, arrays, {"out": silu_mul(gate, up)}, {}))


def test_swiglu_reference_is_the_contract_formula():
    g = np.array([-3.0, -0.5, 0.0, 0.5, 3.0], dtype=np.float32)
    u = np.array([1.0, 2.0, 3.0, 4.0, 5.0], dtype=np.float32)
    expected = g.astype(np.float64) / (1 + np.exp(-g.astype(np.float64))) * u
    kind = make_kernel("swiglu", n=5).definition
    np.testing.assert_allclose(kind.reference({"gate": g, "up": u}, {})["out"], expected, rtol=1e-15)


def test_swiglu_rejects_bad_sizes_and_inputs():
    for n in (0, -4, 2**31):
        with pytest.raises(ValidationError):
            make_kernel("swiglu", n=n)
    kernel = make_kernel("swiglu", n=8)
    with pytest.raises(LaunchError, match="'up'"):
        run(kernel, {"gate": np.ones(8, np.float32), "up": np.ones(7, np.float32)}, {})


# --- performance properties and assembly ------------------------------------------------------
def test_vector_accesses_where_the_shape_allows():
    """Performance property (not correctness): 16-byte global accesses on the Qwen3 shapes."""
    rope = make_kernel("rope", head_dim=128, num_heads=32).ptx
    assert rope.count("ld.global.v4.f32") == 2 and rope.count("st.global.v4.f32") == 2
    swiglu = make_kernel("swiglu", n=12288).ptx
    assert swiglu.count("ld.global.nc.v4.f32") == 2 and swiglu.count("st.global.v4.f32") == 1
    assert "ld.global.nc.f32" not in swiglu, "n = 12288 needs no scalar tail"


@pytest.mark.parametrize("kind, config", [
    ("rope", {"head_dim": 128, "num_heads": 32}), ("rope", {"head_dim": 130, "num_heads": 3}),
    ("rope", {"head_dim": 1024, "num_heads": 64}), ("rope", {"head_dim": 2, "num_heads": 1}),
    ("swiglu", {"n": 1023}), ("swiglu", {"n": 4 * (2**18 + 1) + 2}), ("swiglu", {"n": 1}),
])
def test_assembles_for_every_arch_without_spills(kind, config):
    for arch, used in resources(make_kernel(kind, **config)).items():
        assert used["spill_stores"] == used["spill_loads"] == 0, f"{kind} {config} {arch}: {used}"
        assert used["local_bytes"] == 0 and used["stack_bytes"] == 0, f"{kind} {config} {arch}: {used}"
