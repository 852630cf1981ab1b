"""verify's own comparison machinery, exactly: what a Check passes and fails, the relative L2 error
and the per-element bound over every element, kept bits, and which launches verify_sizes makes.
A checker that loosens any of these lets a wrong kernel pass (mutation testing of the checkers)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from ptxgen import verify
from ptxgen.dtypes import to_float64
from ptxgen.runner import prepare_arrays, run
from ptxgen.verify import (Check, changed_count, compare, forced_checks, relative_l2, verify_past_limits,
                           verify_sizes, worst_ratio)

from helpers import ROOT, make_kernel, spec_kernel

QWEN3 = ROOT / "specs" / "qwen3.toml"


def check(error=0.0, tolerance=1e-3, unwritten=0, changed=0, element_error=None, unrested=""):
    return Check("k", "y", {}, (4,), error, tolerance, unwritten, changed, element_error, unrested=unrested)


def test_a_check_passes_at_its_tolerance_and_bound_and_fails_just_past_them():
    assert check(error=1e-3).passed and check(element_error=1.0).passed
    assert check(error=np.nextafter(1e-3, 1)).failure.startswith("rel. L2 error")
    assert check(element_error=np.nextafter(1.0, 2)).failure.startswith("an element")
    assert check(error=np.nextafter(0.0, 1), tolerance=0.0).failure.startswith("rel. L2 error")


def test_a_nan_error_or_element_ratio_fails():
    assert check(error=np.nan).failure.startswith("rel. L2 error")
    assert check(element_error=np.nan).failure.startswith("an element")


@pytest.mark.parametrize("field, value, failure", [
    ("unwritten", 1, "1 unwritten"),
    ("changed", 1, "1 kept elements changed"),
    ("unrested", "1 word of queue", "workspace not left ready for the next launch: 1 word of queue")])
def test_each_failure_alone_fails_the_check(field, value, failure):
    assert check(**{field: value}).failure == failure


def test_relative_l2_counts_every_element():
    reference = np.ones(7)
    for i in range(7):
        result = reference.copy()
        result[i] += 0.5
        assert relative_l2(result, reference) == pytest.approx(0.5 / np.sqrt(7), rel=1e-15), i
    assert relative_l2(np.array([0.0, 3.0]), np.zeros(2)) == 3.0, "against a zero reference: the absolute norm"
    assert relative_l2(np.array([1.0, 2.0]), np.array([1.0, 1.0]), scale=np.array([0.0, 4.0])) == 0.25


def test_worst_ratio_is_the_largest_magnitude_over_its_bound_wherever_it_lies():
    bound = np.full(6, 2.0)
    for i in range(6):
        for sign in (1, -1):
            error = np.zeros(6)
            error[i] = sign * 3.0
            assert worst_ratio(error, bound) == 1.5, (i, sign)
    assert worst_ratio(np.array([0.0, 1e-300]), np.array([0.0, 0.0])) == np.inf, "an error where the bound is 0"
    assert worst_ratio(np.array([0.0, 1.0]), np.array([0.0, 1.0])) == 1.0, "no error where the bound is 0: fine"
    assert np.isnan(worst_ratio(np.array([1.0, 1.0]), np.array([np.nan, 2.0]))), "a NaN bound must not pass"


def test_a_checks_worst_ratio_where_its_tolerance_is_0():
    """Exact checks (argmax's index, a runtime value past its limit) have tolerance 0: no error is
    a ratio of 0, any error or NaN an infinite one (null in verify --json), never a division by 0."""
    def exact(error):
        return Check("k", "index", {}, (1,), error, 0.0, 0)

    assert exact(0.0).worst_ratio == 0.0 and exact(0.0).to_json()["worst_ratio"] == 0.0
    assert exact(1e-300).worst_ratio == np.inf and exact(1e-300).to_json()["worst_ratio"] is None
    assert exact(np.nan).worst_ratio == np.inf
    assert Check("k", "y", {}, (1,), 2e-6, 1e-6, 0, element_error=0.5).worst_ratio == 2.0


def test_a_runs_worst_check_is_a_failed_one_where_one_failed():
    """verify --json's `worst`: a check failed within its bounds (a workspace left unrested, an
    unwritten element) is worse than a passed check nearer its bounds."""
    from ptxgen.device_verify import KernelRun

    near = Check("k", "y", {"rows": 1}, (4,), 0.9e-6, 1e-6, 0)
    unrested = Check("k", "y", {"rows": 2}, (4,), 0.1e-6, 1e-6, 0, unrested="counter 3")
    report = KernelRun("k", None, [near, unrested]).to_json()
    assert report["status"] == "fail" and report["worst"] == unrested.to_json(), report["worst"]
    assert KernelRun("k", None, [unrested, near]).to_json()["worst"] == unrested.to_json()
    assert KernelRun("k", None, [near, Check("k", "y", {}, (4,), 0.2e-6, 1e-6, 0)]).to_json()["worst"] == near.to_json()


def test_changed_count_compares_bits_of_kept_elements_only():
    expected = np.array([0.0, -0.0, np.nan, 1.0, 2.0, 3.0])
    result = np.array([-0.0, 0.0, np.nan, np.nan, 2.0, 4.0])
    kept = np.ones(6, bool)
    assert changed_count(result, expected, kept) == 4, "both signed zeros, a NaN for a number, 3 -> 4"
    kept[[0, 5]] = False
    assert changed_count(result, expected, kept) == 2
    assert changed_count(expected, result, kept) == 2, "a number for a NaN"


def _recorder(calls):
    """A verify_sizes `call` that launches nothing: it records each call and returns one Check and
    workspaces that name the call that left them."""
    def call(function, *args, **kwargs):
        calls.append((function.__name__, args, kwargs))
        if function is verify_past_limits:
            return [check()]
        return [check()], {"queue": len(calls)}
    return call


def test_verify_sizes_launches_again_on_what_the_last_launch_left_and_on_two_smaller_grids():
    """A kernel with workspaces at one size: a second launch on other inputs and the workspaces
    the first left; any_grid at 132 CTAs: again at 9/11 (108) and a third (44) of it, each on
    the workspaces before it, each with its own seed."""
    kernel = spec_kernel(QWEN3, "qwen3_8b_gate_up_group")
    assert kernel.launch({}, None).grid[0] == 132
    calls = []
    yielded = list(verify_sizes(kernel, [{}], seed=5, call=_recorder(calls)))
    assert [(name, args[1:], kwargs["workspaces"], kwargs["grid"]) for name, args, kwargs in calls] == [
        ("verify_launch", ({}, 5), None, None), ("verify_launch", ({}, 6), {"queue": 1}, None),
        ("verify_launch", ({}, 7), {"queue": 2}, 108), ("verify_launch", ({}, 8), {"queue": 3}, 44)]
    assert [(checks[0].again, checks[0].grid) for checks in yielded] == [(False, None), (True, None), (True, 108),
                                                                         (True, 44)]
    calls.clear()
    list(verify_sizes(kernel, [{}], seed=5, call=_recorder(calls), smaller_grids=False))
    assert [kwargs["grid"] for _, _, kwargs in calls] == [None, None]


def test_verify_sizes_launches_past_the_limits_after_the_last_size_in_the_interpreter_only():
    kernel = spec_kernel(QWEN3, "qwen3_8b_kv_append")
    sizes = [{"pos": 0}, {"pos": 7}]
    calls = []
    list(verify_sizes(kernel, sizes, seed=3, call=_recorder(calls)))
    assert [(name, args[1:3]) for name, args, _ in calls] == [
        ("verify_launch", ({"pos": 0}, 3)), ("verify_launch", ({"pos": 7}, 3)),
        ("verify_past_limits", ({"pos": 7}, 3))]
    assert calls[1][2]["workspaces"] == {"queue": 1}, "each size on the workspaces the one before left"
    for options in ({"sanitize": False}, {"backend": "device"}):
        calls.clear()
        list(verify_sizes(kernel, sizes, seed=3, call=_recorder(calls), **options))
        assert [name for name, _, _ in calls] == ["verify_launch"] * 2, options


def test_verify_past_limits_launches_each_value_as_the_kernel_would_read_it(monkeypatch):
    """A runtime scalar goes in the scalars, a device-read length into its array, each at the
    launch geometry of the size verified."""
    launched = []

    def record(compiled, arrays, scalars, arch=None, geometry_at=None):
        launched.append(({name: array.copy() for name, array in arrays.items()}, dict(scalars), geometry_at))
    monkeypatch.setattr(verify, "launch_arrays", record)
    kernel = spec_kernel(QWEN3, "qwen3_8b_kv_append")
    checks = verify_past_limits(kernel, {"pos": 7})
    assert [(scalars, geometry) for _, scalars, geometry in launched] == [
        ({"pos": 40960}, {"pos": 7}), ({"pos": 2**32 - 1}, {"pos": 7})]
    assert len(checks) == 2 and all(c.passed for c in checks)
    launched.clear()
    graph = spec_kernel(QWEN3, "qwen3_8b_decode_attention_graph")
    size = graph.definition.verify_scalars()[-1]
    verify_past_limits(graph, size)
    assert [int(arrays["seq_len_ptr"].ravel()[0]) for arrays, _, _ in launched] == [40961, 2**32 - 1]
    assert all(scalars == size for _, scalars, _ in launched)


def test_an_infinite_result_counts_as_unwritten():
    kernel = make_kernel("kv_append", num_kv_heads=3, head_dim=16, max_seq_len=12, kv_dtype="bf16")
    scalars = {"pos": 5}
    inputs = kernel.definition.sample_inputs(np.random.default_rng(1), scalars)
    arrays = run(kernel, inputs, scalars)
    arrays["k_cache"][1, 5, 3] = 0x7F80      # bf16 +inf in the row the kernel writes
    checks = {c.param: c for c in compare(kernel, arrays, kernel.definition.reference(inputs, scalars), scalars)}
    assert checks["k_cache"].unwritten == 1 and checks["k_cache"].failure == "1 unwritten"
    assert checks["v_cache"].passed


def test_outputs_start_nan_poisoned():
    kernel = spec_kernel(QWEN3, "qwen3_8b_rmsnorm")
    scalars = {"rows": 2}
    arrays = prepare_arrays(kernel, kernel.definition.sample_inputs(np.random.default_rng(0), scalars), scalars)
    assert np.isnan(to_float64(arrays["y"], kernel.definition.param("y").dtype)).all()


def test_a_workspace_counter_at_rest_is_all_zeros():
    """Kind.unrested's default: every nonzero word of an unsigned workspace counts, wherever it is."""
    kernel = spec_kernel(QWEN3, "qwen3_8b_gate_up_group")
    queue = kernel.definition.param("queue")
    words = np.zeros(8, np.uint32)
    assert kernel.definition.unrested(queue, words) == 0
    words[-1], words[3] = 1, 7
    assert kernel.definition.unrested(queue, words) == 2
    assert kernel.definition.unrested(queue, np.ones(4, np.float32)) is None, "float scratch: no claim"


def test_a_teacher_forced_grading_with_a_nan_fails_as_unwritten():
    """forced_checks grades each of Kind.forced's (result, reference, tolerance): a NaN in the
    result is unwritten, not left out of the error."""
    result, reference = np.array([1.0, np.nan, 3.0]), np.array([1.0, 2.0, 3.0])
    kind = SimpleNamespace(forced=lambda inputs, arrays, scalars: {"x": (result, reference, 1e-6)})
    compiled = SimpleNamespace(name="k", definition_for=lambda target: kind)
    [graded] = forced_checks(compiled, {}, {}, {})
    assert graded.param == "x (teacher-forced)" and graded.unwritten == 1 and graded.failure == "1 unwritten"
