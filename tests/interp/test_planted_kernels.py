"""The ordering bugs of issue 14, planted in the real kernels' rendered PTX: each is now a
sanitizer finding, and with the sanitizer off a wrong answer (the unfenced data arrives late).
The clean PTX passes the same checks, so the edits are what the model catches."""
import re
from typing import NamedTuple

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


class Case(NamedTuple):
    """A kernel, its rendered PTX, and inputs with their float64 reference."""
    kernel: object
    ptx: str
    inputs: dict
    scalars: dict
    reference: dict


def case(kind, scalars, seed, **config):
    kernel, ptx = kernel_and_ptx(kind, **config)
    definition = kernel.definition
    inputs = definition.sample_inputs(np.random.default_rng(seed), scalars)
    return Case(kernel, ptx, inputs, scalars, definition.reference(inputs, scalars))


def max_error(case, ptx, sanitize):
    """The largest error / tolerance of the kernel with this PTX over every output."""
    out = run(with_ptx(case.kernel, ptx), case.inputs, case.scalars, sanitize=sanitize)
    return max(check.error / check.tolerance for check in compare(case.kernel, out, case.reference, case.scalars))


def expect_caught(case, ptx, finding, bug):
    """The planted bug is a sanitizer finding, and with the sanitizer off a wrong answer."""
    with pytest.raises(SanitizerError, match=finding):
        max_error(case, ptx, sanitize=True)
    assert max_error(case, ptx, sanitize=False) > 1, f"{bug}: the answer is still right"


# ---- incremental_attention: split-KV, the last CTA of a KV head merges the partials -------
ATTENTION = dict(num_heads=8, num_kv_heads=2, head_dim=64, max_seq_len=512, kv_dtype="bf16")
# The count-in's bar.sync orders every thread's partial stores before thread 0's acq_rel atomic.
COUNT_IN_BARRIER = r"\tbar\.sync 0;\n\tsetp\.eq\.u32 %first_thread"
UNCOVERED_PARTIAL = (r"global-memory race: reads partials\[.*wrote \(line \d+ `[^`]*st\.global[^`]*`\).*"
                     r"release of CTA .* it acquired \(line \d+ `@%first_thread atom\.acq_rel\.gpu[^`]*` by "
                     r"thread \(0,0,0\)\) does not cover that write by thread \((?!0,)\d+,0,0\)")


@pytest.fixture(scope="module")
def attention():
    scalars = {"seq_len": 509}
    attention = case("incremental_attention", scalars, 4, **ATTENTION)
    assert attention.kernel.definition.launch(scalars).grid[0] > 1, "the planted bugs need several splits"
    return attention


def test_clean_attention_passes(attention):
    assert max_error(attention, attention.ptx, sanitize=True) <= 1


@pytest.mark.parametrize("bug, pattern, replacement, count, finding", [
    ("count-in atomic relaxed", r"atom\.acq_rel\.gpu", "atom.relaxed.gpu", 1,
     r"global-memory race: reads partials\[.*signalled with .*atom\.relaxed.* without releasing"),
    ("count-in atomic without its release", r"atom\.acq_rel\.gpu", "atom.acquire.gpu", 1,
     r"global-memory race: reads partials\[.*signalled with .*atom\.acquire.* without releasing"),
    ("count-in atomic without its acquire", r"atom\.acq_rel\.gpu", "atom.release.gpu", 1,
     r"global-memory race: reads partials\[.*this CTA never acquired a release"),
    ("partials read with ld.global.nc", r"ld\.global\.cg\.", "ld.global.nc.", None,
     r"non-coherent load \(.nc / ldu\) of partials\["),
    ("count-in without its bar.sync", COUNT_IN_BARRIER, "\tsetp.eq.u32 %first_thread", 1, UNCOVERED_PARTIAL),
])
def test_planted_attention_bug(attention, bug, pattern, replacement, count, finding):
    expect_caught(attention, edit(attention.ptx, pattern, replacement, count), finding, bug)


# ---- persistent_decoder: the grid barrier's fences, the attention phase's count-in -------
DECODER = dict(hidden=256, num_heads=4, num_kv_heads=2, head_dim=64, intermediate=256, max_seq_len=128,
               num_layers=1, ctas=3)


@pytest.fixture(scope="module")
def decoder():
    pos = 100
    decoder = case("persistent_decoder", {"pos": pos}, 6, **DECODER)
    assert decoder.kernel.definition.attention.split(pos + 1)[1] > 1, "the count-in bug needs several splits"
    return decoder


def test_clean_decoder_passes(decoder):
    assert max_error(decoder, decoder.ptx, sanitize=True) <= 1


@pytest.mark.parametrize("fence", ["release", "acquire"])
def test_decoder_grid_barrier_without_a_fence(decoder, fence):
    """Each of the barrier's fences is load-bearing: the arriving thread's release or the waiting
    thread's acquire (the per-head counters' `@%lane0 fence`s stay)."""
    pattern = r"\tfence\.acq_rel\.gpu;\n(?=\tatom)" if fence == "release" else r"\tfence\.acq_rel\.gpu;\nBARRIER"
    bad_ptx = edit(decoder.ptx, pattern, "" if fence == "release" else "BARRIER",
                   decoder.ptx.count("// ---- grid barrier: arrive" if fence == "release" else ": wait ----"))
    expect_caught(decoder, bad_ptx, r"global-memory race: reads \w+\[.*(never acquired|without releasing|"
                  r"has not released|does not cover)", "grid barrier without fences")


def test_decoder_count_in_without_its_barrier(decoder):
    bad_ptx = edit(decoder.ptx, COUNT_IN_BARRIER, "\tsetp.eq.u32 %first_thread", 1)
    expect_caught(decoder, bad_ptx, UNCOVERED_PARTIAL, "count-in without its bar.sync")
