"""argmax: the real PTX in the interpreter (sanitizer on, the output poisoned to 0xFFFFFFFF) against
the contract's float64 reference (first index of the maximum, NaN never chosen, all NaN -> 0),
one CTA and many, the 4-vectors-a-thread plan, the workspace left zero for the next launch."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from ptxgen.kernels.argmax import first_argmax
from ptxgen.runner import launch_arrays, prepare_arrays, run
from ptxgen.verify import compare, verify_kernel, verify_sizes

from helpers import assert_passes, make_config, make_kernel, resources, with_ptx

# 1, 3 (tail only), 4, 5, 127 (one CTA), 1000 (2 CTAs), 4099 (tail + partial CTA), 70001 and 151936
# (a Qwen3 vocabulary: ~300 CTAs meeting in the workspace), 4 * (2^18 + 1) + 3 (4 vectors a thread,
# guarded, tail).
SIZES = (1, 3, 4, 5, 127, 1000, 4099, 70001, 151936, 4 * (2**18 + 1) + 3)


def argmax_of(x: np.ndarray) -> int:
    kernel = make_kernel("argmax", n=x.size)
    out = run(kernel, {"x": x.astype(np.float32)}, {})
    assert not out["state"].any(), f"n={x.size}: workspace left {out['state']}"
    return int(out["index"][0])


@pytest.mark.parametrize("n", SIZES)
def test_matches_the_reference_on_planted_ties_and_nans(n):
    kernel = make_kernel("argmax", n=n)
    kind = kernel.definition
    inputs = kind.sample_inputs(np.random.default_rng(n), {})
    x = inputs["x"]
    if n >= 8:
        best = first_argmax(x)
        assert np.isnan(x).sum() == 2 and np.count_nonzero(x == x[best]) == 2, "a tie and NaNs are planted"
    out = run(kernel, inputs, {})
    assert_passes(compare(kernel, out, kind.reference(inputs, {}), {}))
    assert int(out["index"][0]) == first_argmax(x)
    assert not out["state"].any(), f"workspace left {out['state']}"


@pytest.mark.parametrize("n", (7, 1000, 70001))
def test_contract_edge_cases(n):
    rng = np.random.default_rng(n)

    def case(**values) -> np.ndarray:
        x = rng.standard_normal(n).astype(np.float32) - 10
        for index, value in values.items():
            x[int(index.lstrip("i"))] = value
        return x

    last = n - 1
    cases = {
        "tie first and last: the first": case(i0=5.0, **{f"i{last}": 5.0}),
        "tie in different CTAs, later first stored": case(**{f"i{last}": 7.0, f"i{n // 2}": 7.0}),
        "+0 and -0 tie as the maximum": np.where(np.arange(n) % 3 == 1, np.float32(-0.0), np.float32(-1.0)),
        "-0 first, then +0": np.concatenate([[-1.0, -0.0, 0.0], -np.ones(n - 3)]).astype(np.float32),
        "NaN everywhere but one -inf": np.where(np.arange(n) == last, -np.inf, np.nan).astype(np.float32),
        "all NaN": np.full(n, np.nan, np.float32),
        "all -inf": np.full(n, -np.inf, np.float32),
        "+inf wins, NaN before it": case(i0=np.nan, i1=np.inf, i2=np.nan),
        "subnormals only": (np.arange(n) % 5 + 1).astype(np.float32) * np.float32(1e-45),
        "max of magnitudes is negative": -np.abs(rng.standard_normal(n)).astype(np.float32) - 1,
    }
    for label, x in cases.items():
        assert argmax_of(x) == first_argmax(x), f"n={n}, {label}: expected {first_argmax(x)}"
    assert first_argmax(cases["all NaN"]) == 0 and first_argmax(cases["NaN everywhere but one -inf"]) == last
    assert first_argmax(cases["-0 first, then +0"]) == 1


def test_reference_is_numpys_argmax_without_nans():
    x = np.random.default_rng(3).standard_normal(1001)
    x[[10, 900]] = 9.0
    assert first_argmax(x) == int(np.argmax(x)) == 10


def test_workspace_serves_the_next_launch_without_rezeroing():
    """Launch after launch on the same arrays (the state workspace as the device keeps it)."""
    kernel = make_kernel("argmax", n=70001)
    rng = np.random.default_rng(1)
    arrays = prepare_arrays(kernel, {"x": rng.standard_normal(70001).astype(np.float32)}, {})
    for _ in range(3):
        arrays["x"][...] = rng.standard_normal(70001).astype(np.float32)
        arrays["index"][...] = 0xFFFFFFFF
        launch_arrays(kernel, arrays, {})
        assert int(arrays["index"][0]) == first_argmax(arrays["x"])
        assert not arrays["state"].any()


def test_config_and_resources():
    with pytest.raises(ValidationError):
        make_config("argmax", n=0)
    with pytest.raises(ValidationError):
        make_config("argmax", n=2**30 + 1)
    for arch, used in resources(make_config("argmax", n=151936)).items():
        assert used["spill_stores"] == used["spill_loads"] == 0, f"{arch}: spills {used}"


def test_verify_catches_a_kernel_that_leaves_its_workspace_unready():
    """verify checks the workspace back at rest after every launch (Kind.unrested), and launches a
    kernel with workspaces a second time on what the first launch left (an engine zeroes them
    once): without its counter reset the first launch leaves the count set, and the second
    launch's count-in is off, its index wrong."""
    kernel = make_kernel("argmax", n=70001)
    reset = "\tst.global.u32 [%state+8], 0;\n"
    assert reset in kernel.portable.ptx
    planted = with_ptx(kernel, kernel.portable.ptx.replace(reset, ""))
    (once,) = verify_kernel(planted, {})
    assert once.failure == "workspace not left ready for the next launch: 1 word of state", once.failure
    first, second = verify_sizes(planted, [{}])
    assert first[0].failure == once.failure and not first[0].again
    assert second[0].again and second[0].error > 0, "the second launch's index is wrong too"
