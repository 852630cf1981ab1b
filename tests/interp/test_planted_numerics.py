"""The silent accuracy bugs of issue 14, planted in the real kernels' rendered PTX: a bf16 load
that drops the mantissa's lowest bit, f16/bf16 stores that round toward zero, RMSNorm without
its eps. Each must fail the kind's own checks (verify.compare: the tolerances and per-element
bounds derived in the kinds' modules) by a wide margin, while the clean PTX passes the same
checks on the same inputs, so the edit is what is caught."""
import numpy as np
import pytest
from ptxgen.kernels.persistent_decoder import decoder_reference
from ptxgen.runner import run
from ptxgen.verify import compare, relative_l2

from helpers import assert_passes, make_kernel, with_ptx
from test_planted_kernels import edit


def checks_of(kernel, ptx, inputs, scalars):
    return compare(kernel, run(with_ptx(kernel, ptx), inputs, scalars), kernel.definition.reference(inputs, scalars),
                   scalars)


def assert_caught(kernel, ptx, inputs, scalars, element_margin=None):
    """The clean PTX passes; the planted one fails (with an element `element_margin` times over
    its bound at least, when given)."""
    assert_passes(checks_of(kernel, kernel.ptx, inputs, scalars))
    planted = checks_of(kernel, ptx, inputs, scalars)
    assert not all(check.passed for check in planted), "the planted bug passes"
    if element_margin is not None:
        worst = max(check.element_error for check in planted)
        assert worst >= element_margin, f"worst element only {worst:.2f}x its bound"
    return planted


# ---- bf16 loads that lose the lowest mantissa bit (primitives' load_f32) ----------------------
# The upper element of each loaded word, and every element (the lower ones too, and scalar loads).
UPPER = (r"and\.b32 (%wide), (%word\d+), 0xffff0000;", r"and.b32 \1, \2, 0xfffe0000;")
EVERY = (r"\t(@%\w+ )?shl\.b32 (%wide|%word), (%word\d*), 16;",
         r"\t\1shl.b32 \2, \3, 16;\n\t\1and.b32 \2, \2, 0xfffe0000;")


@pytest.mark.parametrize("hidden, bug", [(4096, UPPER), (4096, EVERY), (130, UPPER), (130, EVERY), (7, EVERY)],
                         ids=["16-byte-upper", "16-byte-every", "4-byte-upper", "4-byte-every", "scalar"])
def test_rmsnorm_bf16_load_dropping_a_bit(hidden, bug):
    """The relative L2 error alone would pass some of these (0.9-1.4x its tolerance); every one
    has elements 6-7x over their bound."""
    kernel = make_kernel("rmsnorm", hidden=hidden, dtype="bf16")
    scalars = {"rows": 3}
    inputs = kernel.definition.sample_inputs(np.random.default_rng(hidden), scalars)
    assert_caught(kernel, edit(kernel.ptx, *bug), inputs, scalars, element_margin=1.5)


# ---- f16/bf16 stores rounding toward zero (primitives' store_f32) ---------------------------------
RZ = (r"cvt\.rn\.(f16|bf16)(x2)?\.f32", r"cvt.rz.\1\2.f32")


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("kind, config, scalars", [
    ("rmsnorm", {"hidden": 4096}, {"rows": 3}),          # packed cvt.rn.f16x2 / bf16x2
    ("rmsnorm", {"hidden": 7}, {"rows": 3}),             # one element at a time
    ("per_head_rmsnorm", {"num_heads": 8, "head_dim": 128}, {"tokens": 2}),
])
def test_norm_store_rounding_toward_zero(dtype, kind, config, scalars):
    """Within the relative L2 tolerance (0.4-0.9x), but elements come out nearly an ulp off:
    about 2x their bound of half an ulp (plus the f32 error)."""
    kernel = make_kernel(kind, dtype=dtype, **config)
    inputs = kernel.definition.sample_inputs(np.random.default_rng(1), scalars)
    assert_caught(kernel, edit(kernel.ptx, *RZ), inputs, scalars, element_margin=1.5)


@pytest.mark.parametrize("kv_dtype", ["f16", "bf16"])
def test_kv_append_store_rounding_toward_zero(kv_dtype):
    kernel = make_kernel("kv_append", num_kv_heads=8, head_dim=128, max_seq_len=64, kv_dtype=kv_dtype)
    scalars = {"pos": 17}
    inputs = kernel.definition.sample_inputs(np.random.default_rng(2), scalars)
    planted = assert_caught(kernel, edit(kernel.ptx, *RZ), inputs, scalars)
    assert all(check.error > 0 and check.changed == 0 for check in planted)


# ---- RMSNorm without eps (primitives' rms_factor) --------------------------------------------------
NO_EPS = (r"\n\tadd\.f32 (%\w+), \1, 0f[0-9A-F]{8};(\n\trsqrt\.approx)", r"\2")


@pytest.mark.parametrize("kind, config, scalars", [
    ("rmsnorm", {"hidden": 4096, "dtype": "f32"}, {"rows": 3}),
    ("rmsnorm", {"hidden": 100, "dtype": "bf16", "eps": 1e-5}, {"rows": 3}),
    ("per_head_rmsnorm", {"num_heads": 8, "head_dim": 128, "dtype": "f16"}, {"tokens": 1}),
])
def test_norm_without_eps_on_its_sample_inputs(kind, config, scalars):
    """The kinds' own sample rows (a tiny one, a zero one) make eps count: without it the tiny
    row is 34% off and the zero row NaN."""
    kernel = make_kernel(kind, **config)
    inputs = kernel.definition.sample_inputs(np.random.default_rng(3), scalars)
    (check,) = assert_caught(kernel, edit(kernel.ptx, *NO_EPS, count=1), inputs, scalars)
    assert check.unwritten > 0, "the zero row must come out NaN without eps"


def fused_inputs(kernel, scale):
    inputs = kernel.definition.sample_inputs(np.random.default_rng(4), {})
    inputs["x"] = (inputs["x"] * np.float32(scale)).astype(np.float32)
    return inputs


@pytest.mark.parametrize("kind", ["fused_rmsnorm_q4k_gemv", "fused_rmsnorm_q4k_gemv_group"])
def test_fused_norm_gemv_tiny_and_zero_x(kind):
    """x with mean(x^2) about eps, and x = 0 (y must be 0, not NaN): the clean kernel passes,
    the one without eps fails."""
    matrices = {"n": 64} if kind == "fused_rmsnorm_q4k_gemv" else {"matrices": {"a": 64, "b": 32}}
    kernel = make_kernel(kind, k=1024, eps=1e-5, **matrices)
    planted = edit(kernel.ptx, *NO_EPS)
    tiny = fused_inputs(kernel, np.sqrt(1e-5))
    for check in assert_caught(kernel, planted, tiny, {}):
        assert check.error > 1e4 * check.tolerance, f"{check.param}: without eps only {check.error:.3e} off"
    zero = fused_inputs(kernel, 0.0)
    clean = checks_of(kernel, kernel.ptx, zero, {})
    assert_passes(clean)
    assert all(check.error == 0 for check in clean), "x = 0 must give y = 0 exactly"
    assert all(check.unwritten > 0 for check in checks_of(kernel, planted, zero, {}))


def test_decoder_tiny_x_needs_eps():
    """The persistent decoder at pos 0 on an x with mean(x^2) about eps: its attention norm's eps
    scales v (the only cache row attended), so without eps x and v_cache part from the
    free-running reference by far more than their tolerances."""
    kernel = make_kernel("persistent_decoder", hidden=256, num_heads=4, num_kv_heads=2, head_dim=64,
                         intermediate=256, max_seq_len=8, num_layers=1, eps=1e-5)
    kind = kernel.definition
    scalars = {"pos": 0}
    inputs = kind.sample_inputs(np.random.default_rng(5), scalars)
    inputs["x"] = (inputs["x"] * np.float32(np.sqrt(1e-5))).astype(np.float32)
    planted = edit(kernel.ptx, *NO_EPS)
    checks = {check.param: check for check in assert_caught(kernel, planted, inputs, scalars)}
    assert checks["x"].error > 10 * checks["x"].tolerance and checks["v_cache"].error > 10 * checks["v_cache"].tolerance
    out = run(kernel, inputs, scalars)  # the clean kernel, also against the teacher-forced reference
    forced = decoder_reference(inputs, kind.config, 0, stored=out)
    assert relative_l2(out["x"].astype(np.float64), forced["x"]) <= 1e-5
