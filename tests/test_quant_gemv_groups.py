"""The fused RMSNorm + GEMV group kinds of the other types (fused_rmsnorm_q6k_gemv_group,
fused_rmsnorm_q8_0_gemv_group: the decoder's separate step launches them for a layer's q/k/v and
gate/up of those types): the real PTX in the interpreter (sanitizer on, outputs NaN-poisoned)
against the float64 reference r * (dequant(w) @ xq(x*gamma)) with gguf-py's dequantisation, every
element within the kind's derived bound; a planted bug in the norm is caught; the separate step
of a layer whose group mixes types launches one group per type."""

from __future__ import annotations

import re

import gguf
import numpy as np
import pytest

from ptxgen.kernels import kind_of
from ptxgen.kernels.families.quant_gemv import dequantize_x
from ptxgen.quants import GEMV_KINDS, NORMED_GROUP_KINDS, QUANT_TYPES
from ptxgen.runner import run
from ptxgen.verify import compare

from helpers import make_config, make_kernel, resources, with_ptx

TYPES = ("q6_k", "q8_0")


def inputs_for(quant: str, matrices: dict[str, int], k: int, seed: int) -> dict[str, np.ndarray]:
    """Quantised Gaussian rows of each matrix, non-zero x, gamma near 1."""
    rng = np.random.default_rng(seed)
    arrays = {f"w_{name}": QUANT_TYPES[quant].random_weights(rng, n, k) for name, n in matrices.items()}
    x = rng.standard_normal(k) + 0.25
    x[x == 0] = 0.5
    arrays["x"] = x.astype(np.float32)
    arrays["gamma"] = (1.0 + 0.2 * rng.standard_normal(k)).astype(np.float32)
    return arrays


def contract_reference(quant: str, arrays, eps: float) -> dict[str, np.ndarray]:
    """y_<name> = rsqrt(mean(x^2) + eps) * dequant(w_<name>) @ xq(f32(x * gamma)), in float64,
    dequant by gguf-py (written here from the KERNELS.md formula, not the kind's reference)."""
    x = arrays["x"].astype(np.float64)
    r = 1.0 / np.sqrt(np.mean(x * x) + eps)
    xq = dequantize_x(arrays["x"] * arrays["gamma"])
    ggml = gguf.GGMLQuantizationType[quant.upper()]
    return {f"y_{name[2:]}": r * (gguf.quants.dequantize(w, ggml).astype(np.float64) @ xq)
            for name, w in arrays.items() if name.startswith("w_")}


def check(kernel, quant, arrays) -> dict[str, np.ndarray]:
    result = run(kernel, arrays, {})
    reference = contract_reference(quant, arrays, kernel.config["eps"])
    definition = kernel.definition
    for name, ref in reference.items():
        y = result[name]
        assert np.isfinite(y).all(), f"{name}: rows {np.flatnonzero(~np.isfinite(y))[:10]} never written"
        bound = definition.error_bound(definition.param(name), arrays, ref, {})
        err = np.abs(y.astype(np.float64) - ref)
        worst = int(np.argmax(err / bound))
        assert (err <= bound).all(), f"{name} row {worst}: off by {err[worst]:.3e}, {err[worst] / bound[worst]:.2f} of its bound"
    checks = compare(kernel, result, reference, {})
    assert checks and all(c.passed for c in checks), [c.failure for c in checks]
    return result


# k: the type's shortest row, a partial step, several steps; matrices of 1 row, odd rows, a kv pair.
CASES = [({"q": 1, "k": 3, "v": 5}, 256), ({"gate": 37, "up": 37}, 2048 + 768), ({"k": 9, "v": 9}, 4096),
         ({"q": 33}, 12288)]


@pytest.mark.parametrize("schedule", ["static", "queue"])
@pytest.mark.parametrize("matrices, k", CASES, ids=lambda v: "-".join(v) if isinstance(v, dict) else str(v))
@pytest.mark.parametrize("quant", TYPES)
def test_matches_float64_reference(quant, matrices, k, schedule):
    kernel = make_kernel(NORMED_GROUP_KINDS[quant], k=k, matrices=matrices, eps=1e-5, schedule=schedule, sm_count=2)
    assert kernel.definition.plan.quant == quant and kernel.definition.plan.queue == (schedule == "queue")
    check(kernel, quant, inputs_for(quant, matrices, k, seed=k + len(matrices)))


@pytest.mark.parametrize("quant", TYPES)
def test_every_type_has_its_kinds(quant):
    """The registries name real kinds of the type (the separate step looks them up)."""
    for registry in (GEMV_KINDS, NORMED_GROUP_KINDS):
        config = make_config(registry[quant], **({"n": 4} if registry is GEMV_KINDS else {"matrices": {"a": 4}}), k=256)
        assert kind_of(config).quant == quant


@pytest.mark.parametrize("quant", TYPES)
def test_planted_norm_bug_is_caught(quant):
    """The RMS factor's eps added twice: the same checks fail."""
    matrices, k = {"q": 5, "v": 3}, 2048 + 256
    kernel = make_kernel(NORMED_GROUP_KINDS[quant], k=k, matrices=matrices, eps=0.02)
    arrays = inputs_for(quant, matrices, k, seed=8)
    check(kernel, quant, arrays)
    eps = f"0f{np.float32(0.02).view(np.uint32):08X}"
    planted_ptx, found = re.subn(rf"(add\.f32 (%\w+), %\w+, {eps};)", rf"\1\n\tadd.f32 \2, \2, {eps};", kernel.ptx)
    assert found, "the eps add is not in the PTX"
    planted = with_ptx(kernel, planted_ptx)
    result = run(planted, arrays, {})
    checks = compare(planted, result, contract_reference(quant, arrays, 0.02), {})
    assert not all(c.passed for c in checks), "the planted bug passes"


# A layer's groups at Qwen3-8B, Qwen2.5-7B and Llama-3-8B shapes: q/k/v, v alone (a Q4_K_M layer
# whose v is Q6_K), gate/up.
MODEL_GROUPS = [({"q": 4096, "k": 1024, "v": 1024}, 4096), ({"v": 1024}, 4096), ({"gate": 12288, "up": 12288}, 4096),
                ({"q": 3584, "k": 512, "v": 512}, 3584), ({"gate": 18944, "up": 18944}, 3584),
                ({"gate": 14336, "up": 14336}, 4096)]


@pytest.mark.parametrize("matrices, k", MODEL_GROUPS, ids=lambda v: "-".join(v) if isinstance(v, dict) else str(v))
@pytest.mark.parametrize("quant", TYPES)
def test_model_groups_assemble_without_spills(quant, matrices, k):
    for arch, figures in resources(make_config(NORMED_GROUP_KINDS[quant], k=k, matrices=matrices)).items():
        assert figures["spill_stores"] == figures["spill_loads"] == figures["local_bytes"] == 0, f"{arch}: {figures}"
        assert figures["registers"] <= 64, f"{arch}: {figures['registers']} registers"
