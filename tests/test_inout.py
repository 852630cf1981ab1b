"""Read-write ("inout") parameters in the kind contract: Kind.rewritten names the elements a kernel
writes without reading them; runner.prepare_arrays poisons those, verify.compare grades them and
requires every other element to keep its input bits. Shown for every inout kind of the shipped
specs (kv_append's and the persistent decoder's caches; rope's, residual_add's and the decoder's
x are read and rewritten whole)."""
from __future__ import annotations

import numpy as np
import pytest

from ptxgen.dtypes import to_float64
from ptxgen.kernels import kind_of
from ptxgen.runner import prepare_arrays, run
from ptxgen.spec import load_spec
from ptxgen.verify import compare

from helpers import SPECS, assert_passes, make_kernel, spec_kernel

# The shipped kernels with inout parameters that the interpreter can run (the 36-layer 8B decoders'
# 4.7 GB of weights are beyond it: one layer of them is tests/test_decoder_full_shape.py).
INOUT = [(path, kernel.name) for path in SPECS for kernel in load_spec(path).spec.kernels
         if kernel.kind in ("rope", "residual_add", "kv_append", "persistent_decoder") and kind_of(kernel).verify_scalars()]
# Which inout arrays have elements the kernel writes without reading them.
REWRITTEN = {"k_cache", "v_cache"}


def test_the_specs_have_every_inout_kind():
    kinds = {spec_kernel(path, name).kind for path, name in INOUT}
    assert kinds == {"rope", "residual_add", "kv_append", "persistent_decoder"}


@pytest.mark.parametrize("path, name", INOUT, ids=[f"{p.stem}:{n}" for p, n in INOUT])
def test_prepare_arrays_poisons_exactly_what_the_kernel_rewrites(path, name):
    kernel = spec_kernel(path, name)
    kind = kernel.definition
    for scalars in kind.verify_scalars()[-1:]:  # the last position
        inputs = kind.sample_inputs(np.random.default_rng(0), scalars)
        arrays = prepare_arrays(kernel, inputs, scalars)
        for param in kernel.params:
            if param.role != "inout":
                continue
            before, after = to_float64(inputs[param.name], param.dtype), to_float64(arrays[param.name], param.dtype)
            poisoned = np.isnan(after) & ~np.isnan(before)
            region = kind.rewritten(param, inputs, scalars)
            assert (region is not None) == (param.name in REWRITTEN), f"{name}: {param.name}"
            expected = np.zeros(after.shape, bool)
            if region is not None:
                expected[region] = True
            assert np.array_equal(poisoned, expected), f"{name} {scalars}: {param.name} poisoned elsewhere"
            assert np.array_equal(arrays[param.name][~expected].view(np.uint8),
                                  inputs[param.name][~expected].view(np.uint8)), f"{name}: {param.name} not copied"


def kv_append_run(pos=5):
    kernel = make_kernel("kv_append", num_kv_heads=3, head_dim=16, max_seq_len=12, kv_dtype="bf16")
    kind = kernel.definition
    scalars = {"pos": pos}
    inputs = kind.sample_inputs(np.random.default_rng(1), scalars)
    return kernel, run(kernel, inputs, scalars), kind.reference(inputs, scalars), scalars


def test_compare_grades_the_new_rows_and_requires_the_rest_unchanged():
    kernel, arrays, reference, scalars = kv_append_run()
    assert_passes(compare(kernel, arrays, reference, scalars))
    touched = {name: array.copy() for name, array in arrays.items()}
    touched["k_cache"][1, 7, 3] ^= 1  # one bit of a row the kernel must keep
    touched["v_cache"][2, 0, 0] ^= 0x8000  # a sign
    checks = {check.param: check for check in compare(kernel, touched, reference, scalars)}
    assert checks["k_cache"].changed == 1 and checks["v_cache"].changed == 1
    assert not checks["k_cache"].passed and "1 kept elements changed" in checks["k_cache"].failure
    assert checks["k_cache"].error == 0, "the new row itself is still right"


def test_a_row_left_unwritten_is_caught():
    """The launch that writes nothing (what a kernel indexing the wrong row does to row pos)."""
    kernel, _, reference, scalars = kv_append_run()
    inputs = kernel.definition.sample_inputs(np.random.default_rng(1), scalars)
    untouched = prepare_arrays(kernel, inputs, scalars)  # no launch
    checks = compare(kernel, untouched, reference, scalars)
    assert all(check.unwritten == 3 * 16 and not check.passed for check in checks)


def test_a_row_written_at_the_wrong_place_is_caught():
    kernel, arrays, reference, scalars = kv_append_run()
    shifted = {name: array.copy() for name, array in arrays.items()}
    for cache in ("k_cache", "v_cache"):
        shifted[cache][:, 6] = shifted[cache][:, 5]
    assert all(check.changed == 3 * 16 for check in compare(kernel, shifted, reference, scalars))


def test_decoder_caches_are_graded_on_row_pos_of_every_layer():
    """With indirect_pos the row comes from pos_ptr (the device value) for both poisoning and
    grading."""
    kernel = make_kernel("persistent_decoder", hidden=256, num_heads=4, num_kv_heads=2, head_dim=64,
                         intermediate=256, max_seq_len=8, num_layers=2, indirect_pos=True)
    kind = kernel.definition
    inputs = kind.sample_inputs(np.random.default_rng(2), {"pos": 3})
    assert inputs["pos_ptr"][0] == 3
    arrays = prepare_arrays(kernel, inputs, {"pos": 3})
    for cache in ("k_cache", "v_cache"):
        rows = np.isnan(to_float64(arrays[cache], "f16")).all(axis=(0, 1, 3))
        assert list(np.flatnonzero(rows)) == [3], f"{cache}: poisoned rows {np.flatnonzero(rows)}"
    out = run(kernel, inputs, {"pos": 3})
    checks = {check.param: check for check in compare(kernel, out, kind.reference(inputs, {"pos": 3}), {"pos": 3})}
    assert_passes(checks.values())
    assert checks["k_cache"].changed == 0 and checks["k_cache"].unwritten == 0
