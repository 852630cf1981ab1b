"""flash_attention: the real PTX in the interpreter (sanitizer on, outputs poisoned) vs float64.

Interpreter time is the budget here: head counts stay small and the shapes are a spread, not a
product. Every case covers one or more of: MHA / GQA 4:1 / GQA 8:1 / MQA, head_dim 64 / 128,
seq_len 1, primes, lengths that are no multiple of the 64-row tiles, several key tiles, causal and
not, f16 / bf16 inputs, f32 / f16 / bf16 outputs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import ValidationError

from ptxgen.dtypes import from_float
from ptxgen.errors import LaunchError
from ptxgen.kernels.flash_attention import attention_reference
from ptxgen.runner import run
from ptxgen.spec import load_spec
from ptxgen.verify import compare, verify_kernel

from helpers import ROOT, assert_passes, make_kernel, resources


# (num_heads, num_kv_heads, head_dim, seq_len, causal, dtype, out_dtype, block_m)
CASES = [
    (2, 2, 64, 1, True, "f16", "f32", 64),  # MHA, a single token: one tile, 63 zero-filled rows/keys
    (2, 2, 128, 1, False, "bf16", "bf16", 64),
    (8, 8, 64, 1, True, "f16", "f16", 128),
    (4, 1, 64, 7, False, "bf16", "f16", 64),  # MQA, prime length
    (4, 1, 128, 13, True, "f16", "bf16", 64),  # MQA, prime length, causal
    (2, 2, 64, 13, False, "f16", "f32", 128),
    (8, 2, 128, 65, True, "f16", "f32", 64),  # GQA 4:1, one row past a tile: 2 query blocks, 2 key tiles
    (8, 1, 64, 100, False, "bf16", "f32", 64),  # GQA 8:1
    (2, 2, 128, 130, False, "f16", "f16", 64),  # three key tiles, 2 keys in the last
    (8, 1, 64, 130, True, "bf16", "bf16", 64),  # GQA 8:1, causal, tail in the diagonal tile
    (4, 1, 64, 129, True, "bf16", "f32", 128),  # 128-row blocks: rows 0..63 see nothing of key tile 1
    (4, 1, 64, 200, True, "f16", "f16", 64),  # multi-tile causal: query block 3 walks 4 key tiles
    (2, 1, 128, 200, False, "bf16", "f32", 64),  # multi-tile, both stages of the ring reused
    (8, 2, 128, 200, True, "f16", "f16", 128),  # Qwen3-like GQA 4:1, 2 query blocks of 128
    (2, 2, 128, 257, False, "f16", "bf16", 128),  # 5 key tiles, 1 key in the last
    (4, 1, 128, 300, True, "bf16", "f16", 64),  # 5 query blocks, up to 5 key tiles
    (2, 2, 64, 128, True, "f16", "f32", 64),  # exact tiles, no tail at all
]


def attention_kernel(num_heads, num_kv_heads, head_dim, causal=True, dtype="f16", out_dtype="f32", **extra):
    return make_kernel("flash_attention", name="attn", num_heads=num_heads, num_kv_heads=num_kv_heads,
                       head_dim=head_dim, causal=causal, dtype=dtype, out_dtype=out_dtype, **extra)



@pytest.mark.parametrize("num_heads, num_kv_heads, head_dim, seq_len, causal, dtype, out_dtype, block_m", CASES)
def test_matches_float64(num_heads, num_kv_heads, head_dim, seq_len, causal, dtype, out_dtype, block_m):
    kernel = attention_kernel(num_heads, num_kv_heads, head_dim, causal, dtype, out_dtype, block_m=block_m)
    assert_passes(verify_kernel(kernel, {"seq_len": seq_len}, seed=seq_len + head_dim))


@pytest.mark.parametrize("block_m", [64, 128])
def test_large_scores_need_online_rescaling(block_m):
    """Scores spanning about +-60 (after scaling), the largest ones in the earliest keys: the kernel
    visits key tiles last to first, so the running max grows on later tiles and O and l must be
    rescaled. A non-default scale checks that scale*log2(e) is folded in correctly."""
    kernel = attention_kernel(2, 1, 64, causal=False, dtype="f16", out_dtype="f32", scale=0.3, block_m=block_m)
    rng = np.random.default_rng(7)
    seq_len = 150
    q = rng.standard_normal((2, seq_len, 64)) * 2.0
    k = rng.standard_normal((1, seq_len, 64)) * 2.0
    k[:, :20] *= 3.0  # the biggest scores sit in the first key tile, visited last
    v = rng.standard_normal((1, seq_len, 64))
    inputs = {"q": from_float(q, "f16"), "k": from_float(k, "f16"), "v": from_float(v, "f16")}
    scalars = {"seq_len": seq_len}
    arrays = run(kernel, inputs, scalars)
    assert_passes(compare(kernel, arrays, kernel.definition.reference(inputs, scalars), scalars))


@pytest.mark.parametrize("block_m", [64, 128])
def test_causal_query_sees_only_past_keys(block_m):
    """Changing the keys and values of later positions must not change earlier rows' outputs."""
    kernel = attention_kernel(2, 2, 64, causal=True, block_m=block_m)
    kind = kernel.definition
    seq_len = 90
    inputs = kind.sample_inputs(np.random.default_rng(3), {"seq_len": seq_len})
    before = run(kernel, inputs, {"seq_len": seq_len})["o"]
    changed = {name: array.copy() for name, array in inputs.items()}
    changed["k"][:, 70:] = from_float(np.full((2, seq_len - 70, 64), 3.0), "f16")
    changed["v"][:, 70:] = from_float(np.full((2, seq_len - 70, 64), -5.0), "f16")
    after = run(kernel, changed, {"seq_len": seq_len})["o"]
    np.testing.assert_array_equal(after[:, :70], before[:, :70], err_msg="rows < 70 depend on keys >= 70")
    assert not np.array_equal(after[:, 70:], before[:, 70:]), "rows >= 70 ignored their own keys"


def test_reference_is_softmax_attention():
    """The float64 reference itself, against a direct per-row formula (GQA mapping included)."""
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((4, 5, 8)), rng.standard_normal((2, 5, 8)), rng.standard_normal((2, 5, 8))
    out = attention_reference(q, k, v, 0.5, causal=True)
    for h in range(4):
        for i in range(5):
            s = np.array([0.5 * q[h, i] @ k[h // 2, j] for j in range(i + 1)])
            w = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
            np.testing.assert_allclose(out[h, i], w @ v[h // 2, : i + 1], rtol=1e-12)


@pytest.mark.parametrize("bad", [0, 2**24 + 1, -1])
def test_out_of_range_seq_len_is_rejected(bad):
    kernel = attention_kernel(2, 2, 64)
    with pytest.raises(LaunchError, match="seq_len"):
        run(kernel, {}, {"seq_len": bad})


@pytest.mark.parametrize("config, message", [
    ({"num_heads": 8, "num_kv_heads": 3, "head_dim": 64}, "num_kv_heads must divide num_heads"),
    ({"num_heads": 8, "num_kv_heads": 8, "head_dim": 96}, "head_dim"),
    ({"num_heads": 8, "num_kv_heads": 8, "head_dim": 64, "dtype": "f32"}, "dtype"),
    ({"num_heads": 8, "num_kv_heads": 8, "head_dim": 64, "scale": 0.0}, "scale"),
])
def test_bad_configs_are_rejected(config, message):
    config = {"name": "attn", **config}
    with pytest.raises(ValidationError, match=message):
        make_kernel("flash_attention", **config)


def test_flops_and_bytes_model():
    kind = attention_kernel(32, 8, 128, causal=True, out_dtype="f16").definition
    traffic = kind.traffic({"seq_len": 4096})
    assert traffic.flops == 4 * 32 * 128 * 4096 * 4097 // 2
    assert traffic.bytes == (32 + 8 + 8 + 32) * 4096 * 128 * 2
    full = attention_kernel(32, 8, 128, causal=False).definition.traffic({"seq_len": 4096})
    assert full.flops == 4 * 32 * 128 * 4096**2
    assert full.bytes == (32 + 8 + 8) * 4096 * 128 * 2 + 32 * 4096 * 128 * 4
    assert math.isclose(kind.scale, 1 / math.sqrt(128))
    launch = kind.launch({"seq_len": 4096})
    assert launch.grid == (64, 32, 1) and launch.block == (128, 1, 1)
    assert launch.dynamic_shared == 5 * 64 * 128 * 2 <= 99 * 1024, "must fit sm_86/sm_89 (99 KB per CTA)"
    wide = attention_kernel(32, 8, 128, block_m=128).definition
    launch = wide.launch({"seq_len": 4096})
    assert launch.grid == (32, 32, 1) and launch.block == (256, 1, 1)
    assert launch.dynamic_shared == (128 + 4 * 64) * 128 * 2 <= 99 * 1024


def test_spec_instances_assemble_for_every_arch_without_spills():
    spec = load_spec(ROOT / "specs" / "qwen3.toml").spec
    kernels = [k for k in spec.kernels if k.kind == "flash_attention"]
    assert kernels, "specs/qwen3.toml has no flash_attention instance"
    for kernel in kernels:
        for arch, used in resources(kernel, spec.target.archs).items():
            assert used["spill_stores"] == used["spill_loads"] == used["local_bytes"] == 0, f"{kernel.name} {arch}: {used}"
            assert 0 < used["registers"] <= 255, f"{kernel.name} {arch}: {used}"


@pytest.mark.parametrize("head_dim, dtype, causal, block_m",
                         [(64, "bf16", False, 64), (128, "f16", False, 64), (64, "f16", True, 128), (128, "bf16", False, 128)])
def test_other_variants_assemble_without_spills(head_dim, dtype, causal, block_m):
    kernel = attention_kernel(8, 2, head_dim, causal, dtype, "bf16", block_m=block_m)
    for arch, used in resources(kernel).items():
        assert used["spill_stores"] == used["spill_loads"] == used["local_bytes"] == 0, f"{arch}: {used}"


def test_performance_properties_of_the_ptx():
    """Tensor-core mma for both products, ldmatrix (.trans for V), 16-byte cp.async into a double
    buffer, and no guarded (src-size) cp.async inside the tile loop: only the prologue's tile can be
    partial."""
    ptx = attention_kernel(32, 8, 128, dtype="bf16").ptx
    assert ptx.count("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") == 2 * (128 // 16) * 4 * 2
    assert ptx.count("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16") == (128 // 16) * 4
    assert "cp.async.cg.shared.global" in ptx and "cp.async.wait_group 2;" in ptx
    loop = ptx[ptx.index("TILE_LOOP:"):]
    assert ", %lsize;" not in loop, "the loop's prefetches must be unguarded full-tile copies"
