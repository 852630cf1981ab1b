"""rmsnorm and per_head_rmsnorm: the real PTX in the interpreter (sanitizer on) vs float64."""

from __future__ import annotations

import numpy as np
import pytest

from ptxgen.errors import LaunchError
from ptxgen.runner import run
from ptxgen.verify import verify_kernel

from helpers import assert_passes, make_kernel

# hidden sizes cover: one warp per row with a partial vector chunk (7, 100, 130), exact warps (32, 128),
# scalar loads because the row is not a multiple of the vector (4099 f32, 4097 f16), one CTA per row with
# several chunks (4096) and a partial last chunk (2500).
ROW_NORM_CASES = [
    (hidden, dtype)
    for hidden in (1, 7, 32, 100, 128, 130, 513, 2500, 4096)
    for dtype in ("f32", "f16", "bf16")
] + [(4099, "f32"), (4097, "f16"), (12288, "bf16")]



@pytest.mark.parametrize("hidden, dtype", ROW_NORM_CASES)
def test_rmsnorm_matches_float64(hidden, dtype):
    kernel = make_kernel("rmsnorm", hidden=hidden, dtype=dtype, eps=1e-5)
    rows = 3 if hidden <= 4096 else 1
    assert_passes(verify_kernel(kernel, {"rows": rows}, seed=hidden))


@pytest.mark.parametrize("num_heads, head_dim, dtype, tokens",
                         [(32, 128, "f32", 1), (8, 128, "bf16", 3), (3, 64, "f16", 5), (5, 96, "f32", 2),
                          (2, 256, "f16", 1), (7, 6, "bf16", 3)])
def test_per_head_rmsnorm_matches_float64(num_heads, head_dim, dtype, tokens):
    kernel = make_kernel("per_head_rmsnorm", num_heads=num_heads, head_dim=head_dim, dtype=dtype)
    assert_passes(verify_kernel(kernel, {"tokens": tokens}, seed=num_heads))


def test_each_head_is_normalised_on_its_own():
    """Heads of very different scale must not share one RMS factor."""
    kernel = make_kernel("per_head_rmsnorm", num_heads=4, head_dim=64, eps=1e-12)  # eps << mean(x^2)
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((2, 4, 64)) * np.array([1e-3, 1.0, 10.0, 1e3])[None, :, None]).astype(np.float32)
    gamma = np.ones(64, dtype=np.float32)
    y = run(kernel, {"x": x, "gamma": gamma}, {"tokens": 2})["y"]
    rms = np.sqrt(np.mean(y.astype(np.float64) ** 2, axis=-1))
    np.testing.assert_allclose(rms, 1.0, rtol=1e-4, err_msg="every head must come out with unit RMS")


def test_zero_rows_launch_nothing_and_limits_are_enforced():
    kernel = make_kernel("rmsnorm", hidden=64)
    gamma = np.ones(64, dtype=np.float32)
    assert run(kernel, {"x": np.zeros((0, 64), np.float32), "gamma": gamma}, {"rows": 0})["y"].shape == (0, 64)
    for bad in (-1, 2**31, 2.5):
        with pytest.raises(LaunchError, match="rows"):
            run(kernel, {"x": np.zeros((1, 64), np.float32), "gamma": gamma}, {"rows": bad})


@pytest.mark.parametrize("inputs, message", [
    ({"x": np.zeros((2, 64), np.float64), "gamma": np.ones(64, np.float32)}, r"'x': expected float32\[2, 64\]"),
    ({"x": np.zeros((2, 63), np.float32), "gamma": np.ones(64, np.float32)}, r"'x': expected float32\[2, 64\]"),
    ({"x": np.zeros((2, 64), np.float32)}, "'gamma' is missing"),
    ({"x": np.zeros((2, 64), np.float32), "gamma": np.ones(64, np.float32), "z": np.ones(1)}, "unknown input 'z'"),
])
def test_runner_names_the_bad_input(inputs, message):
    kernel = make_kernel("rmsnorm", hidden=64)
    with pytest.raises(LaunchError, match=message):
        run(kernel, inputs, {"rows": 2})


def test_reference_is_the_contract_formula():
    """The reference itself against a direct transcription of KERNELS.md."""
    kind = make_kernel("rmsnorm", hidden=5, eps=0.5).definition
    x = np.arange(1, 11, dtype=np.float32).reshape(2, 5)
    gamma = np.array([1, 2, 3, 4, 5], dtype=np.float32)
    y = kind.reference({"x": x, "gamma": gamma}, {"rows": 2})["y"]
    expected = x / np.sqrt((x.astype(np.float64) ** 2).mean(axis=1, keepdims=True) + 0.5) * gamma
    np.testing.assert_allclose(y, expected, rtol=1e-15)
