"""The ordering bugs of issue 14, planted in the real kernels' rendered PTX: each is now a
sanitizer finding, and with the sanitizer off a wrong answer (the unfenced data arrives late).
The clean PTX passes the same checks, so the edits are what the model catches."""
import re

import numpy as np
import pytest
from ptxgen.errors import SanitizerError
from ptxgen.kernels import config_from_json
from ptxgen.pipeline import compile_kernel
from ptxgen.runner import run
from ptxgen.verify import compare

from helpers import with_ptx


def kernel_and_ptx(kind, **config):
    kernel = compile_kernel(config_from_json({"name": "kernel", "kind": kind, **config}), until="ptx")
    return kernel, kernel.ptx


def edit(ptx, pattern, replacement, count=None):
    """ptx with pattern replaced: `count` times, or at least once when count is None."""
    edited, found = re.subn(pattern, replacement, ptx)
    assert found == count if count is not None else found > 0, f"{found} matches of {pattern!r} in the kernel"
    return edited


# ---- incremental_attention: split-KV, the last CTA of a KV head merges the partials -------
ATTENTION = dict(num_heads=8, num_kv_heads=2, head_dim=64, max_seq_len=512, kv_dtype="bf16")
SCALARS = {"seq_len": 509}


@pytest.fixture(scope="module")
def attention():
    kernel, ptx = kernel_and_ptx("incremental_attention", **ATTENTION)
    kind = kernel.definition
    assert kind.launch(SCALARS).grid[0] > 1, "the planted bugs need several splits"
    inputs = kind.sample_inputs(np.random.default_rng(4), SCALARS)
    return kernel, ptx, inputs, kind.reference(inputs, SCALARS)


def attention_error(attention, ptx, sanitize):
    kernel, _, inputs, reference = attention
    out = run(with_ptx(kernel, ptx), inputs, SCALARS, sanitize=sanitize)
    return max(check.error / check.tolerance for check in compare(kernel, out, reference, SCALARS))


def test_clean_attention_passes(attention):
    assert attention_error(attention, attention[1], sanitize=True) <= 1


@pytest.mark.parametrize("bug, pattern, replacement, count, finding", [
    ("count-in atomic relaxed", r"atom\.acq_rel\.gpu", "atom.relaxed.gpu", 1,
     r"global-memory race: reads partials\[.*signalled with .*atom\.relaxed.* without releasing"),
    ("count-in atomic without its release", r"atom\.acq_rel\.gpu", "atom.acquire.gpu", 1,
     r"global-memory race: reads partials\[.*signalled with .*atom\.acquire.* without releasing"),
    ("count-in atomic without its acquire", r"atom\.acq_rel\.gpu", "atom.release.gpu", 1,
     r"global-memory race: reads partials\[.*this CTA never acquired a release"),
    ("partials read with ld.global.nc", r"ld\.global\.cg\.", "ld.global.nc.", None,
     r"non-coherent load \(.nc / ldu\) of partials\["),
])
def test_planted_attention_bug(attention, bug, pattern, replacement, count, finding):
    ptx = edit(attention[1], pattern, replacement, count)
    with pytest.raises(SanitizerError, match=finding):
        attention_error(attention, ptx, sanitize=True)
    assert attention_error(attention, ptx, sanitize=False) > 1, f"{bug}: the answer is still right"


# ---- persistent_decoder: the grid barrier's fences ---------------------------------------
DECODER = dict(hidden=256, num_heads=4, num_kv_heads=2, head_dim=64, intermediate=256, max_seq_len=16,
               num_layers=1, ctas=3)


def test_decoder_grid_barrier_without_fences():
    kernel, ptx = kernel_and_ptx("persistent_decoder", **DECODER)
    kind = kernel.definition
    scalars = {"pos": 5}
    inputs = kind.sample_inputs(np.random.default_rng(6), scalars)
    reference = kind.reference(inputs, scalars)

    def error(ptx, sanitize=True):
        out = run(with_ptx(kernel, ptx), inputs, scalars, sanitize=sanitize)
        return max(check.error / check.tolerance for check in compare(kernel, out, reference, scalars))

    assert error(ptx) <= 1
    # the barrier's unguarded fences (the per-head counters' `@%lane0 fence`s stay)
    bad_ptx = edit(ptx, r"\n\tfence\.acq_rel\.gpu;", "", 3 * ptx.count("// ---- grid barrier"))
    with pytest.raises(SanitizerError, match=r"global-memory race: reads \w+\[.*(never acquired|without releasing|has not released|does not cover)"):
        error(bad_ptx)
    assert error(bad_ptx, sanitize=False) > 1
