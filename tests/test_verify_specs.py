"""Every kernel of every shipped spec passes `ptxgen verify` in the interpreter (sanitizer on)."""

from __future__ import annotations

import pytest

from ptxgen.spec import load_spec
from ptxgen.verify import verify_sizes

from helpers import SPECS, assert_passes, spec_kernel

CASES = [(path, kernel.name) for path in SPECS for kernel in load_spec(path).spec.kernels]


@pytest.mark.parametrize("path, name", CASES, ids=[f"{p.stem}:{n}" for p, n in CASES])
def test_spec_kernel_matches_its_reference(path, name):
    kernel = spec_kernel(path, name)
    cases = kernel.definition.verify_scalars()
    if not cases:
        pytest.skip(f"{name}: no runtime size small enough for the interpreter (assemble-checked only)")
    assert_passes([check for checks in verify_sizes(kernel, cases, seed=11) for check in checks])
