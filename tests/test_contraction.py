"""ptxas may contract a mul and an add/sub without rounding modifiers into one fma (its default
--fmad=true; PTX ISA 9.7.3, 9.7.4); the interpreter rounds them apart unless launched with
contract=True (interp/contraction.py). Only the attention kinds have such pairs, and their tests
run them fused too (test_incremental_attention, test_persistent_decoder); every other kind writes
.rn where its rounding matters (rope's reduction, flash attention's rescale) or has no pair, so its
results, bit-for-bit claims included, are the GPU's whichever pairs ptxas fuses."""

from __future__ import annotations

import pytest

from ptxgen.interp.contraction import contractions
from ptxgen.interp.parser import parse
from ptxgen.pipeline import compile_spec
from ptxgen.spec import load_spec

from helpers import SPECS

FUSED_IN_TESTS = {"incremental_attention", "persistent_decoder"}


@pytest.mark.parametrize("path", SPECS, ids=lambda path: path.name)
def test_only_kinds_tested_fused_have_pairs_ptxas_may_contract(path):
    kernels = compile_spec(load_spec(path).spec, until="ptx").kernels
    pairs = {(kernel.name, kernel.kind, target): len(contractions(parse(variant.ptx, kernel.name)))
             for kernel in kernels for target, variant in kernel.variants.items()}
    contracted = {key: count for key, count in pairs.items() if count}
    assert {kind for _, kind, _ in contracted} <= FUSED_IN_TESTS, contracted
    if any(kernel.kind == "incremental_attention" for kernel in kernels):
        assert contracted, "the census finds no pair: contractions() no longer sees attention's"
