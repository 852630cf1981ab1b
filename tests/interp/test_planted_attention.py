"""The attention kinds' per-element error bounds (Kind.error_bound, graded by verify.compare) are
derived, not loose: the worst element of a correct kernel comes within a small factor of its
bound, and numeric bugs planted in the rendered PTX fail the same checks the clean PTX passes
on the same inputs.

Bugs no sound bound catches, because a correct kernel may err as much (measured, worst element /
bound, clean vs planted): incremental_attention's ex2 argument 1 ulp off (0.02-0.05 vs the same;
the score's own error bound is ~100x larger) or 2^-16 off (0.4-1.2: caught at bf16 only); its P
parts rounded toward zero (the 2- or 3-part split keeps the residual: unchanged); flash_attention
sm_80's P rounded toward zero (0.4-0.9: l sums the same rounded P, so the bias is common to O and l
and cancels, leaving a rounding of at most u around it, as round-to-nearest has)."""
import dataclasses

import numpy as np
import pytest
from ptxgen.dtypes import from_float, to_float64
from ptxgen.runner import run
from ptxgen.verify import compare

from helpers import assert_passes, make_kernel
from test_flash_attention_sm90a import attention_kernel as hopper_attention
from test_planted_kernels import edit
from test_planted_numerics import assert_caught, checks_of


def one_split(kv_dtype):
    """Decode attention with one split (one SM, one CTA an SM): a CTA walks several ring tiles,
    so its running maxima move and O is rescaled."""
    return make_kernel("incremental_attention", num_heads=4, num_kv_heads=1, head_dim=128, max_seq_len=256,
                       kv_dtype=kv_dtype, sm_count=1, ctas_per_sm=1)


def three_tiles(kernel, seed=1):
    kind = kernel.definition
    scalars = {"seq_len": 3 * kind.plan.tile}
    assert kind.splits(scalars["seq_len"]) == 1
    return kind.sample_inputs(np.random.default_rng(seed), scalars), scalars


def worst(checks) -> float:
    return max(check.element_error for check in checks)


# ---- the bounds are tight ----------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(8, 2, 128, "f16", 160), (4, 1, 64, "bf16", 160), (2, 2, 128, "f32", 160)])
def test_incremental_bound_is_not_loose(shape):
    """Measured 0.01-0.26 over the test shapes (0.1-0.26 at 2 keys, less with more keys: the
    per-key errors partly cancel); at 1 key the result is exact."""
    num_heads, num_kv_heads, head_dim, kv_dtype, max_seq_len = shape
    kernel = make_kernel("incremental_attention", num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                         max_seq_len=max_seq_len, kv_dtype=kv_dtype)
    ratios = []
    for seq_len in (2, 37):
        scalars = {"seq_len": seq_len}
        inputs = kernel.definition.sample_inputs(np.random.default_rng(seq_len), scalars)
        checks = checks_of(kernel, kernel.ptx, inputs, scalars)
        assert_passes(checks)
        ratios.append(worst(checks))
    assert max(ratios) >= 0.05, f"worst element only {max(ratios):.3g}x its bound"


def test_flash_attention_bounds_are_not_loose_and_sm90a_has_its_own():
    """sm_80 (l sums the rounded P): worst element 0.3-0.94 of its bound over the tests' shapes;
    sm_90a (l sums the unrounded P): 0.25-0.79 of its own, and up to 36x over sm_80's where a
    row's visible values agree in a dimension (its rounding of P reaches O alone)."""
    kernel = hopper_attention(4, 2, 64, True, "bf16", "f32", {"overlap": False})
    kind, scalars = kernel.definition, {"seq_len": 130}
    inputs = kind.sample_inputs(np.random.default_rng(194), scalars)
    reference = kind.reference(inputs, scalars)
    portable = compare(kernel, run(kernel, inputs, scalars), reference, scalars)
    assert_passes(portable)
    assert worst(portable) >= 0.3
    hopper = run(kernel, inputs, scalars, arch="sm_90a")
    own = compare(kernel, hopper, reference, scalars, "sm_90a")
    assert_passes(own)
    assert worst(own) >= 0.3
    assert worst(compare(kernel, hopper, reference, scalars)) > 10, "sm_90a's results should break sm_80's bound"


# ---- planted bugs --------------------------------------------------------------------------------------
def test_incremental_probabilities_as_one_f16_part():
    """P rounded to f16 before P V (the low part of the 22-bit split dropped): 4.6x its bound."""
    kernel = one_split("f16")
    inputs, scalars = three_tiles(kernel)
    planted = edit(kernel.ptx, r"cvt\.rn\.f16x2\.f32 (%pf\d+), %rest_hi, %rest_lo;", r"mov.b32 \1, 0;")
    assert_caught(kernel, planted, inputs, scalars, element_margin=3)


@pytest.mark.parametrize("kv_dtype", ["f32", "f16", "bf16"])
def test_incremental_ex2_argument_off(kv_dtype):
    """Every probability's exponent s - m scaled by 1 + 2^-12: 7-19x its bound."""
    kernel = one_split(kv_dtype)
    inputs, scalars = three_tiles(kernel)
    planted = edit(kernel.ptx, r"(sub\.f32 (%s\d+), %s\d+, %m;)", r"\1\n\tmul.f32 \2, \2, 0f3F800800;")
    assert_caught(kernel, planted, inputs, scalars, element_margin=5)


def test_incremental_rescale_skipped_when_the_max_moves_a_little():
    """O left unscaled when a row's running max moves by less than 7e-4 (exp2 units, alpha >=
    1 - 2^-11): the second tile repeats the first with every key times 1 + 2^-14, so each max moves
    by ~1e-4 and the first tile's weights stay that much too large: 4x their bound."""
    kernel = one_split("f32")
    inputs, scalars = three_tiles(kernel)
    tile = kernel.definition.plan.tile
    keys = to_float64(inputs["k_cache"], "f32")
    keys[:, tile:2 * tile] = keys[:, :tile] * (1 + 2.0**-14)
    inputs["k_cache"] = from_float(keys, "f32")
    planted = edit(kernel.ptx, r"setp\.eq\.f32 %ok, %alpha, 0f3F800000;", "setp.ge.f32 %ok, %alpha, 0f3F7FE000;")
    assert_caught(kernel, planted, inputs, scalars, element_margin=3)


@pytest.mark.parametrize("case", [(4, 2, 64, 130, True, "bf16", "f32", {"overlap": False}),
                                  (2, 1, 64, 129, True, "f16", "f32", {"consumers": 1})])
def test_sm90a_probabilities_rounded_toward_zero(case):
    """sm_90a's P V with P rounded toward zero while l adds the unrounded P: O shrinks by up to
    2u against l, 1.35-1.41x its bound."""
    num_heads, num_kv_heads, head_dim, seq_len, causal, dtype, out_dtype, knobs = case
    kernel = hopper_attention(num_heads, num_kv_heads, head_dim, causal, dtype, out_dtype, knobs)
    kind, scalars = kernel.definition, {"seq_len": seq_len}
    inputs = kind.sample_inputs(np.random.default_rng(seq_len + head_dim), scalars)
    reference = kind.reference(inputs, scalars)
    assert_passes(compare(kernel, run(kernel, inputs, scalars, arch="sm_90a"), reference, scalars, "sm_90a"))
    variant = kernel.variant("sm_90a")
    rz = edit(variant.ptx, r"cvt\.rn\.(f16|bf16)x2\.f32 (%pf\d+)", r"cvt.rz.\1x2.f32 \2")
    planted = dataclasses.replace(kernel, variants={**kernel.variants,
                                                    "sm_90a": dataclasses.replace(variant, ptx=rz)})
    checks = compare(planted, run(planted, inputs, scalars, arch="sm_90a"), reference, scalars, "sm_90a")
    assert worst(checks) >= 1.2, f"worst element only {worst(checks):.2f}x its bound"
