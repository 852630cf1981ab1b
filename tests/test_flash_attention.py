"""flash_attention: the real PTX in the interpreter (sanitizer on, outputs poisoned) vs float64.

Every case checks the relative L2 error against the kind's tolerance and every element against
the kind's error_bound (attention_error_bound: the kernel's error analysis, per element). Interpreter time is the budget
here: head counts stay small and the shapes are a spread, not a product. The cases cover MHA / GQA
4:1 / GQA 8:1 / MQA, head_dim 64 / 128, seq_len 1, odd lengths and no multiple of any tile, one
to several key tiles, causal and not, f16 / bf16 inputs, f32 / f16 / bf16 outputs, and each tile
shape the config offers: 16-row warps with Q in registers, 32-row warps (Q re-read from shared
memory at d128), 32- to 128-key tiles (also wider than the query block), 2- to 4-stage rings
(more stages than tiles), and the software-pipelined `overlap` loop.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import ValidationError

from ptxgen.dtypes import from_float, to_float64
from ptxgen.errors import LaunchError
from ptxgen.kernels.flash_attention import attention_error_bound, attention_reference
from ptxgen import perf
from ptxgen.interp import launch as interpret
from ptxgen.runner import prepare_arrays, run
from ptxgen.spec import load_spec
from ptxgen.verify import compare, verify_sizes

from helpers import ROOT, assert_passes, make_config, make_kernel, resources

# sm_86 and sm_89 assemble every config here to sm_80's register count; the spec test covers all four.
VARIANT_ARCHS = ("sm_80", "sm_90")
WIDE = {"block_m": 128, "warp_rows": 32}  # FlashAttention-2's shape: 4 warps x 32 rows
OVERLAP = {"stages": 3, "overlap": True}

# (num_heads, num_kv_heads, head_dim, seq_len, causal, dtype, out_dtype, tile config)
CASES = [
    (2, 2, 64, 1, True, "f16", "f32", {}),  # MHA, a single token: one tile, 63 zero-filled rows/keys
    (4, 1, 128, 15, True, "bf16", "bf16", {}),  # MQA
    (8, 2, 128, 65, True, "f16", "f32", {}),  # GQA 4:1, one row past a tile: 2 query blocks, 2 key tiles
    (8, 1, 64, 130, False, "bf16", "f16", {}),  # GQA 8:1, three key tiles, 2 keys in the last
    (2, 2, 128, 257, False, "f16", "bf16", {}),  # 5 key tiles, 1 key in the last
    (2, 2, 64, 128, True, "f16", "f32", {}),  # exact tiles, no tail at all
    (2, 2, 128, 64, True, "f16", "f32", {"stages": 4}),  # one tile, a ring of four
    (4, 1, 128, 17, True, "f16", "f16", WIDE),  # Q re-read from shared memory, two m-tiles per warp
    (8, 2, 128, 200, True, "bf16", "f32", WIDE),
    (2, 2, 128, 127, False, "f16", "f32", WIDE),
    (4, 2, 64, 63, True, "bf16", "bf16", WIDE),  # two m-tiles per warp with Q in registers
    (4, 1, 64, 129, True, "bf16", "f32", {"block_m": 128}),  # 8 warps: rows 0..63 see nothing of key tile 1
    (8, 2, 128, 200, True, "f16", "f16", {"block_m": 128, "block_n": 32, "stages": 3}),
    (2, 1, 64, 300, False, "f16", "f16", {"block_m": 128, "block_n": 128}),
    (4, 1, 64, 200, True, "f16", "f32", {"block_n": 128}),  # key tiles wider than the query blocks
    (2, 2, 128, 130, True, "bf16", "bf16", {"block_n": 128, "stages": 3}),
    (4, 1, 128, 300, True, "bf16", "f16", OVERLAP),  # 5 query blocks, up to 5 key tiles
    (2, 2, 64, 1, False, "f16", "bf16", OVERLAP),  # the last visit is also the first
    (4, 2, 128, 65, False, "f16", "f32", {"block_m": 128, "block_n": 32, "stages": 4, "overlap": True}),
    (8, 8, 64, 97, True, "bf16", "f32", {"block_n": 32, "stages": 3, "overlap": True}),
]


def attention_kernel(num_heads, num_kv_heads, head_dim, causal=True, dtype="f16", out_dtype="f32", **extra):
    return make_kernel("flash_attention", name="attn", num_heads=num_heads, num_kv_heads=num_kv_heads,
                       head_dim=head_dim, causal=causal, dtype=dtype, out_dtype=out_dtype, **extra)


def check(kernel, inputs, seq_len):
    """One interpreter run: relative L2 within the kind's tolerance, every element within its
    bound (FlashAttention.error_bound: attention_error_bound)."""
    kind, scalars = kernel.definition, {"seq_len": seq_len}
    checks = compare(kernel, run(kernel, inputs, scalars), kind.reference(inputs, scalars), scalars)
    assert_passes(checks)
    assert checks[0].element_error is not None, "flash_attention must grade every element against its bound"


@pytest.mark.parametrize("num_heads, num_kv_heads, head_dim, seq_len, causal, dtype, out_dtype, tiles", CASES)
def test_matches_float64(num_heads, num_kv_heads, head_dim, seq_len, causal, dtype, out_dtype, tiles):
    kernel = attention_kernel(num_heads, num_kv_heads, head_dim, causal, dtype, out_dtype, **tiles)
    inputs = kernel.definition.sample_inputs(np.random.default_rng(seq_len + head_dim), {"seq_len": seq_len})
    check(kernel, inputs, seq_len)


@pytest.mark.parametrize("tiles", [{}, WIDE, OVERLAP], ids=["default", "wide", "overlap"])
def test_large_scores_need_online_rescaling(tiles):
    """Scores spanning about +-60 (after scaling), the largest ones in the earliest keys: the kernel
    visits key tiles last to first, so the running max grows on later tiles by more than the
    rescale threshold and O and l must be rescaled. A non-default scale checks that scale*log2(e)
    is folded in correctly."""
    kernel = attention_kernel(2, 1, 128, causal=False, dtype="f16", out_dtype="f32", scale=0.3, **tiles)
    rng = np.random.default_rng(7)
    seq_len = 150
    q = rng.standard_normal((2, seq_len, 128)) * 1.4
    k = rng.standard_normal((1, seq_len, 128)) * 1.4
    k[:, :20] *= 3.0  # the biggest scores sit in the first key tile, visited last
    v = rng.standard_normal((1, seq_len, 128))
    check(kernel, {"q": from_float(q, "f16"), "k": from_float(k, "f16"), "v": from_float(v, "f16")}, seq_len)


@pytest.mark.parametrize("tiles", [{"block_m": 128, "block_n": 32}, {"block_m": 128, "block_n": 32, **OVERLAP}],
                         ids=["plain", "overlap"])
def test_rows_that_see_no_key_yet_with_a_large_scale(tiles):
    """scale*log2(e) > 1 (here 2.2): the first tile visited lies above the diagonal for rows
    0..95 of a 128-row block, whose reference max is still the initial one; its -m*c must stay
    finite (2^-inf stays 0, no inf - inf)."""
    kernel = attention_kernel(2, 1, 64, causal=True, dtype="bf16", out_dtype="f32", scale=1.5, **tiles)
    inputs = kernel.definition.sample_inputs(np.random.default_rng(11), {"seq_len": 160})
    check(kernel, inputs, 160)


def test_outputs_below_f16_s_normal_range_are_graded_by_its_spacing():
    """A peaked softmax (scale 2) over small values: some outputs lie below 6.1e-5, where f16's
    spacing is a fixed 2^-24, so a correctly rounded output is up to 2^-25 off the reference; the
    bound took half an ulp as relative (3e-8 there) and failed them (found at edge configs)."""
    kernel = attention_kernel(6, 2, 64, causal=True, dtype="bf16", out_dtype="f16", scale=2.0)
    inputs = kernel.definition.sample_inputs(np.random.default_rng(0), {"seq_len": 70})
    out = kernel.definition.reference(inputs, {"seq_len": 70})["o"]
    assert (np.abs(out) < 2.0**-14).any(), "some outputs are f16 subnormals"
    check(kernel, inputs, 70)


@pytest.mark.parametrize("tiles", [{}, {"block_m": 128}, OVERLAP], ids=["default", "block_m128", "overlap"])
def test_causal_query_sees_only_past_keys(tiles):
    """Changing the keys and values of later positions must not change earlier rows' outputs."""
    kernel = attention_kernel(2, 2, 64, causal=True, **tiles)
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


def test_error_bound_is_tight_enough_to_catch_a_coarser_p():
    """The per-element bound is no blanket: attention with P rounded to 8 significant bits (bf16's
    precision where f16's is promised) breaks it; with 11 bits (f16's) it holds."""
    rng = np.random.default_rng(5)
    shapes = ((2, 40, 64), (1, 40, 64), (1, 40, 64))
    q, k, v = (to_float64(from_float(rng.standard_normal(shape), "f16"), "f16") for shape in shapes)
    exact = attention_reference(q, k, v, 0.125, causal=True)
    bound = attention_error_bound(q, k, v, 0.125, True, "f16", "f32", 64)
    scores = np.where(np.tril(np.ones((40, 40), bool)), np.einsum("hid,jd->hij", q, k[0]), -np.inf)
    mantissa, exponent = np.frexp(np.exp(0.125 * (scores - scores.max(axis=2, keepdims=True))))
    for bits, inside in ((11, True), (8, False)):
        p = np.ldexp(np.round(mantissa * 2.0**bits) / 2.0**bits, exponent)
        model = np.einsum("hij,jd->hid", p, v[0]) / p.sum(axis=2, keepdims=True)
        assert (np.abs(model - exact) <= bound).all() == inside, f"P rounded to {bits} bits"


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
    ({"num_heads": 8, "num_kv_heads": 8, "head_dim": 64, "scale": 1e-40}, "scale"),
    ({"num_heads": 8, "num_kv_heads": 8, "head_dim": 64, "scale": float("inf")}, "scale"),
    ({"num_heads": 8, "num_kv_heads": 8, "head_dim": 64, "stages": 2, "overlap": True}, "overlap needs stages >= 3"),
    ({"num_heads": 8, "num_kv_heads": 8, "head_dim": 128, "warp_rows": 32}, "2 warps cannot load head_dim=128"),
    ({"num_heads": 8, "num_kv_heads": 8, "head_dim": 64, "block_n": 48}, "block_n"),
    ({"num_heads": 8, "num_kv_heads": 8, "head_dim": 64, "max_registers": 300}, "max_registers"),
    ({"num_heads": 8, "num_kv_heads": 8, "head_dim": 64, "causal": False, "split_kv_len": 1024},
     "split_kv_len needs causal = true"),
])
def test_bad_configs_are_rejected(config, message):
    config = {"name": "attn", **config}
    with pytest.raises(ValidationError, match=message):
        make_kernel("flash_attention", **config)


def test_flops_bytes_and_launch_model():
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
    # Two buffers of K+V (64 keys); Q, kept in registers, is staged in the second buffer.
    assert launch.dynamic_shared == 2 * 2 * 64 * 128 * 2 <= 99 * 1024, "must fit sm_86/sm_89 (99 KB per CTA)"
    wide = attention_kernel(32, 8, 128, **WIDE).definition.launch({"seq_len": 4096})
    assert wide.grid == (32, 32, 1) and wide.block == (128, 1, 1)
    assert wide.dynamic_shared == (2 * 2 * 64 + 128) * 128 * 2 <= 99 * 1024, "Q re-read: its own region"
    deep = attention_kernel(32, 8, 128, block_n=32, stages=4, overlap=True).definition.launch({"seq_len": 4096})
    assert deep.dynamic_shared == 4 * 2 * 32 * 128 * 2


# The configurations worth timing on a GPU (see the module docstring), plus d64 shapes.
SWEEP = [
    {},
    {"max_registers": 168},
    WIDE,
    {"block_m": 128, "warp_rows": 32, "block_n": 32, "stages": 3},
    {"stages": 3, "overlap": True},
    {"block_n": 32, "stages": 4, "overlap": True, "max_registers": 168},
    {"block_m": 128},
]


def test_spec_instances_assemble_for_every_arch_without_spills():
    spec = load_spec(ROOT / "specs" / "qwen3.toml").spec
    kernels = [k for k in spec.kernels if k.kind == "flash_attention"]
    assert kernels, "specs/qwen3.toml has no flash_attention instance"
    for kernel in kernels:
        for arch, used in resources(kernel, spec.target.archs).items():
            assert used["spill_stores"] == used["spill_loads"] == used["local_bytes"] == 0, f"{kernel.name} {arch}: {used}"
            assert 0 < used["registers"] <= 255, f"{kernel.name} {arch}: {used}"


@pytest.mark.parametrize("head_dim, dtype, causal, tiles",
                         [(128, "f16", True, tiles) for tiles in SWEEP]
                         + [(64, "bf16", False, {}), (64, "f16", True, WIDE), (64, "bf16", True, {"block_m": 128, "block_n": 128})])
def test_variants_assemble_without_spills(head_dim, dtype, causal, tiles):
    kernel = attention_kernel(8, 2, head_dim, causal, dtype, "bf16", **tiles)
    for arch, used in resources(kernel, VARIANT_ARCHS).items():
        assert used["spill_stores"] == used["spill_loads"] == used["local_bytes"] == 0, f"{arch}: {used}"
        if "max_registers" in tiles:
            assert used["registers"] <= tiles["max_registers"], f"{arch}: {used}"


def test_performance_properties_of_the_ptx():
    """Per 64-key tile and warp at d128: 64 mma for S, 64 for P.V, 4 for the row sums (P times
    ones); ldmatrix (.trans for V); one barrier; 16-byte cp.async, unguarded inside the loop (only
    the prologue's tile can be partial); the O rescale behind a warp-uniform branch."""
    ptx = attention_kernel(32, 8, 128, dtype="bf16").ptx
    loop = ptx[ptx.index("TILE_LOOP:"):ptx.index("@%more bra TILE_LOOP;")]
    assert loop.count("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") == 64 + 64 + 4
    assert loop.count("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16") == (128 // 16) * 4
    assert loop.count("bar.sync") == 1 and loop.count("cp.async.wait_group 0;") == 1
    assert loop.count("cp.async.cg.shared.global") == 2 * 64 * 128 * 2 // 16 // 128
    assert ", %lsize;" not in loop, "the loop's prefetches must be unguarded full-tile copies"
    assert "vote.sync.any.pred %any, %any, 0xffffffff;\n\t@!%any bra.uni RESCALED;" in loop


# split_kv_len (SPLIT_KV): (num_heads, num_kv_heads, head_dim, dtype, out_dtype, tile config), each
# verified at lengths up to split_kv_len = 257 (one block of one tile: not split; one of two
# tiles: its first visited, lower piece holds the diagonal; several blocks, the heaviest split,
# the last tile one key) and past it (whole blocks, the grid's spare CTAs ending at once), one
# launch after another on the same workspaces.
SPLIT_CASES = [
    (4, 2, 64, "f16", "f32", WIDE),
    (4, 1, 128, "bf16", "f16", {}),
    (2, 2, 64, "f16", "bf16", {"block_m": 128, "block_n": 32, "stages": 4, "overlap": True}),
    (2, 1, 128, "f16", "f32", {"block_n": 128, "stages": 3}),    # key tiles wider than the query blocks
]
SPLIT_LENGTHS = (1, 70, 130, 257, 258, 300)


@pytest.mark.parametrize("num_heads, num_kv_heads, head_dim, dtype, out_dtype, tiles", SPLIT_CASES)
def test_split_kv_matches_float64_below_and_above_its_length(num_heads, num_kv_heads, head_dim, dtype, out_dtype,
                                                             tiles):
    """Every element within its bound (the merge's roundings and a_i's error included), the
    counters back at 0 after each launch (verify_sizes reuses the workspaces)."""
    kernel = attention_kernel(num_heads, num_kv_heads, head_dim, True, dtype, out_dtype, split_kv_len=257, **tiles)
    sizes = [{"seq_len": n} for n in SPLIT_LENGTHS]
    for checks in verify_sizes(kernel, sizes, seed=head_dim):
        assert_passes(checks)
        assert checks[0].element_error is not None


def test_split_pieces_merge_to_the_same_bits_in_any_order():
    """Whichever piece of a block counts in second merges, with the same arithmetic in the same
    order: launches whose CTAs the interpreter interleaves differently (its seed; approximate
    instructions exact, else the seed also draws their errors) give the same bits, and leave
    every counter at 0."""
    kernel = attention_kernel(4, 2, 64, True, "f16", "f32", split_kv_len=1024, **WIDE)
    kind, scalars = kernel.definition, {"seq_len": 300}
    inputs = kind.sample_inputs(np.random.default_rng(3), scalars)
    geometry = kind.launch(scalars)
    outputs = []
    for seed in range(4):
        arrays = prepare_arrays(kernel, inputs, scalars)
        interpret(kernel.ptx, kernel.name, geometry.grid, geometry.block, kernel.args(arrays, scalars),
                  dynamic_shared=geometry.dynamic_shared, sanitize=True, seed=seed, approx="exact")
        assert not arrays["counters"].any(), f"seed {seed}: counters {arrays['counters']}"
        outputs.append(arrays["o"].view(np.uint32).copy())
    for seed, out in enumerate(outputs[1:], 1):
        np.testing.assert_array_equal(out, outputs[0], err_msg=f"seed {seed} differs from seed 0")


@pytest.mark.parametrize("tiles", [WIDE, {}], ids=["wide", "default"])
def test_the_split_starts_at_split_kv_len_itself(tiles):
    """The kernel's split boundary is the kind's (seq_len <= split_kv_len splits, cta_work and the
    grid assume it): at seq_len = split_kv_len the heaviest block of every head is split (both of
    its pieces write their partials, which start NaN-poisoned here), one token past it nothing is
    (the partials stay untouched); the result within its bound either way. A kernel that split
    only below split_kv_len gave the same output and passed every other test."""
    kernel = attention_kernel(4, 2, 64, True, "f16", "f32", split_kv_len=257, **tiles)
    kind = kernel.definition
    for seq_len, split in ((257, True), (258, False)):
        scalars = {"seq_len": seq_len}
        inputs = kind.sample_inputs(np.random.default_rng(seq_len), scalars)
        geometry = kind.launch(scalars)
        arrays = prepare_arrays(kernel, inputs, scalars)
        arrays["partials"][...] = np.nan
        interpret(kernel.ptx, kernel.name, geometry.grid, geometry.block, kernel.args(arrays, scalars),
                  dynamic_shared=geometry.dynamic_shared, sanitize=True)
        heaviest = arrays["partials"][:, 0]  # slot 0: every head's heaviest block, [upper, lower] pieces
        if split:
            assert np.isfinite(heaviest).all(), f"seq_len {seq_len} = split_kv_len: the heaviest blocks were not split"
        else:
            assert np.isnan(arrays["partials"]).all(), f"seq_len {seq_len} > split_kv_len: a block was split"
        assert not arrays["counters"].any(), f"seq_len {seq_len}: counters {arrays['counters']}"
        assert_passes(compare(kernel, arrays, kind.reference(inputs, scalars), scalars))


def test_split_work_is_what_show_lists_and_the_grid_launches():
    """show's dispatch for split_kv_len (FlashAttention.cta_work), Qwen3-8B's 32 heads in 128-row
    CTAs over the H100's 264 slots: the list-scheduled makespan (key tiles) falls from 17 to 13 at
    1k tokens and from 9 to 5.5 at 512 (the figures SPLIT_KV quotes as 1.75x and 1.34x, 3.09x and
    1.89x of the unsplit even spread), and is the unsplit one past split_kv_len, where the grid's
    spare CTAs do nothing; one work entry a CTA of the grid."""
    split = attention_kernel(32, 8, 128, split_kv_len=1024, **WIDE).definition
    plain = attention_kernel(32, 8, 128, **WIDE).definition
    for seq_len, before, after in ((512, 9.0, 5.5), (1024, 17.0, 13.0), (4096, 134.0, 134.0)):
        scalars = {"seq_len": seq_len}
        work = split.cta_work(scalars)
        assert len(work) == math.prod(split.launch(scalars).grid)
        assert perf.dispatch_report(plain.cta_work(scalars), 264)["makespan"] == before
        assert perf.dispatch_report(work, 264)["makespan"] == after, seq_len
    assert not split.cta_work({"seq_len": 4096})[-2 * 32:].any(), "the spare CTAs past split_kv_len do nothing"
    from ptxgen.kernels import kind_from_json

    hopper = kind_from_json({**split.config.model_dump(), "name": "attn"}, "sm_90a")
    plain_hopper = kind_from_json({**plain.config.model_dump(), "name": "attn"}, "sm_90a")
    assert np.array_equal(hopper.cta_work({"seq_len": 1024}), plain_hopper.cta_work({"seq_len": 1024})), \
        "the sm_90a variant splits nothing"


@pytest.mark.parametrize("tiles, spilled", [(WIDE, 16), ({}, 0), ({"block_m": 64, "max_registers": 168}, 0),
                                            (OVERLAP, 0)], ids=("wide", "default", "capped", "overlap"))
def test_split_variants_spill_nothing_in_the_key_loop(tiles, spilled):
    """With split_kv_len at Qwen3-8B's shapes: no spill, but for 128-row CTAs of 32-row warps
    (254 registers unsplit), where ptxas spills 16 bytes, none of it inside a loop (SASS, when
    nvdisasm is installed: a pointer stored before the key loop and read after it, and two
    registers within the merge)."""
    from ptxgen.pipeline import compile_kernel

    config = make_config("flash_attention", name="p", num_heads=32, num_kv_heads=8, head_dim=128, out_dtype="f16",
                         split_kv_len=1024, **tiles)
    for arch, used in resources(config, VARIANT_ARCHS).items():
        assert used["spill_stores"] <= spilled and used["local_bytes"] == 0, f"{arch}: {used}"
    if spilled and perf.nvdisasm() is not None:
        sass = perf.sass_counts(compile_kernel(config, ("sm_90",)).binaries["sm_90"].cubin)
        assert sass["loop_spills"] == 0 and sass["loop_bodies"], sass
