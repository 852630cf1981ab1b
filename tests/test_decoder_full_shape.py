"""One layer of the production Qwen3-8B decoder (specs/qwen3_decoder.toml: hidden 4096, 32 query
heads on 8 KV heads, head_dim 128, intermediate 12288, f16 cache of 40960 rows, Q4_K weights)
interpreted at full shape, on the grid the H100 gets (132 CTAs), at pos 4095.

The spec's 36 layers (4.7 GB of weights) are beyond the interpreter; one layer is 108 MB and
the same PTX but for the layer count. Checked as `ptxgen verify` checks the small decoders
(verify.compare against the free-running float64 reference: x, the new cache rows of every
layer, every other cache row bit for bit), and x against the teacher-forced reference (the
kernel's own rounding flips fed back, see decoder_reference) within the small configs' X_TOL,
with every new cache element within half an ulp of f16 plus the f32 error.

Measured on a 2-core machine like CI's, alone: 24 s (sample inputs 3 s, the launch 6 s, two
references 4.5 s), 2.4 GB resident."""
from __future__ import annotations

import numpy as np
import pytest

from ptxgen.kernels import config_from_json
from ptxgen.kernels.persistent_decoder import decoder_reference
from ptxgen.pipeline import compile_kernel
from ptxgen.runner import run
from ptxgen.spec import load_spec
from ptxgen.verify import compare, relative_l2

from helpers import ROOT, assert_passes
from test_persistent_decoder import X_TOL, check_new_rows

POS = 4095


@pytest.mark.slow
def test_one_qwen3_8b_layer_at_full_shape():
    spec = load_spec(ROOT / "specs" / "qwen3_decoder.toml").spec.kernel("qwen3_8b_decoder")
    config = config_from_json({**spec.model_dump(), "num_layers": 1})
    kernel = compile_kernel(config, until="ptx")
    kind = kernel.definition
    assert (config.hidden, config.num_heads, config.num_kv_heads, config.head_dim, config.intermediate,
            config.max_seq_len) == (4096, 32, 8, 128, 12288, 40960)
    assert kind.launch({"pos": POS}).grid == (132, 1, 1)
    scalars = {"pos": POS}
    inputs = kind.sample_inputs(np.random.default_rng(8), scalars)
    out = run(kernel, inputs, scalars)

    free = decoder_reference(inputs, config, POS)
    assert_passes(compare(kernel, out, {name: free[name] for name in ("x", "k_cache", "v_cache")}, scalars))
    forced = decoder_reference(inputs, config, POS, stored=out)
    error = relative_l2(out["x"].astype(np.float64), forced["x"])
    assert error <= X_TOL, f"x: rel. L2 error {error:.3e} against the teacher-forced reference > {X_TOL:.0e}"
    check_new_rows(kernel.definition.config, out, inputs, forced, POS)
    assert not out["counters"].any() and out["barrier"][0] == 0, "counters and barrier arrivals back at 0"
