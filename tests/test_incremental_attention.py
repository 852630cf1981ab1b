"""incremental_attention (decode): the real PTX in the interpreter (sanitizer on, outputs poisoned)
against the float64 reference, over MHA, GQA 4:1 and 8:1, MQA; head_dim 64/128/256; every KV
dtype; seq_len 0, 1, primes and lengths that are no multiple of any tile; direct and indirect
seq_len; split-KV with the last CTA merging (and resetting its counter for the next launch)."""

from __future__ import annotations

import numpy as np
import pytest

from ptxgen.dtypes import from_float
from ptxgen.errors import LaunchError
from ptxgen.interp import launch as interpret
from ptxgen.kernels.families.attention import division_magic
from ptxgen.kernels.incremental_attention import attention_reference, max_scale
from ptxgen.pipeline import compile_kernel
from ptxgen.runner import prepare_arrays, run
from ptxgen.spec import load_spec
from ptxgen.verify import compare, verify_kernel, verify_sizes

from helpers import ROOT, assert_passes, make_config, make_kernel, prefetched_lines, resources, spec_kernel

QWEN3 = ROOT / "specs" / "qwen3.toml"


def attention(num_heads, num_kv_heads, head_dim, max_seq_len, kv_dtype="f16", **extra):
    return make_kernel("incremental_attention", num_heads=num_heads, num_kv_heads=num_kv_heads,
                       head_dim=head_dim, max_seq_len=max_seq_len, kv_dtype=kv_dtype, **extra)



# (num_heads, num_kv_heads, head_dim, kv_dtype, max_seq_len): MHA, GQA 4:1, GQA 8:1 and MQA (with
# 12 and 32 query heads: 2 and 4 warps of heads per CTA), each head_dim, each KV dtype. Lengths:
# empty, one key, primes (no multiple of any tile or of the 16-byte vector), the whole cache.
CASES = [
    (4, 4, 64, "f16", 160),
    (2, 2, 128, "f32", 160),
    (2, 2, 256, "bf16", 96),
    (8, 2, 128, "f16", 160),
    (4, 1, 64, "bf16", 160),
    (8, 2, 256, "f32", 96),
    (16, 2, 64, "f32", 160),
    (8, 1, 128, "bf16", 160),
    (8, 1, 256, "f16", 96),
    (32, 1, 64, "f16", 96),
    (12, 1, 128, "f32", 96),
    (16, 1, 256, "bf16", 64),
    (24, 1, 64, "bf16", 96),  # 3 head slices: warp indices divided by a constant that is no power of 2
]
LENGTHS = (0, 1, 2, 7, 31, 37, 61, 97, 131, 157)


@pytest.mark.parametrize("num_heads, num_kv_heads, head_dim, kv_dtype, max_seq_len", CASES)
def test_matches_float64(num_heads, num_kv_heads, head_dim, kv_dtype, max_seq_len):
    kernel = attention(num_heads, num_kv_heads, head_dim, max_seq_len, kv_dtype)
    lengths = sorted({n for n in LENGTHS if n <= max_seq_len} | {max_seq_len})
    for seq_len in lengths:
        assert_passes(verify_kernel(kernel, {"seq_len": seq_len}, seed=seq_len))


@pytest.mark.parametrize("kv_dtype", ("f16", "bf16", "f32"))
def test_matches_float64_with_the_pairs_ptxas_may_contract_fused(kv_dtype):
    """The softmax sum's rescale (l * alpha + p) is a mul/add pair without rounding modifiers,
    which ptxas may fuse (interp.contraction): the kernel passes either way. One CTA a KV head, so
    a chunk spans several ring tiles and the rescale meets a non-zero l."""
    kernel = attention(8, 2, 128, 160, kv_dtype, sm_count=1, ctas_per_sm=1)
    for seq_len in (37, 160):
        assert_passes(verify_kernel(kernel, {"seq_len": seq_len}, seed=seq_len, contract=True))
    if kv_dtype == "f16":  # the mode takes effect: some output bits move
        scalars = {"seq_len": 160}
        inputs = kernel.definition.sample_inputs(np.random.default_rng(1), scalars)
        fused, apart = run(kernel, dict(inputs), scalars, contract=True), run(kernel, dict(inputs), scalars)
        assert not np.array_equal(fused["out"].view(np.uint32), apart["out"].view(np.uint32))


@pytest.mark.parametrize("num_heads, num_kv_heads, head_dim, kv_dtype", [
    (4, 1, 128, "f16"), (8, 8, 64, "f32"), (16, 2, 256, "bf16"), (32, 1, 128, "f16")])
def test_indirect_seq_len_matches_float64_on_one_grid(num_heads, num_kv_heads, head_dim, kv_dtype):
    """seq_len_ptr is read on the device: one grid (max_splits wide) serves every length, CTAs
    past the end only count in, and the result is that of the device's length."""
    kernel = attention(num_heads, num_kv_heads, head_dim, 128, kv_dtype, indirect_seq_len=True)
    kind = kernel.definition
    grids = {kind.launch({"seq_len": n}).grid for n in (0, 1, 128)}
    assert grids == {(kind.plan.max_splits, num_kv_heads, 1)}, f"the grid must not depend on seq_len: {grids}"
    for seq_len in (0, 1, 5, 53, 101, 128):
        assert_passes(verify_kernel(kernel, {"seq_len": seq_len}, seed=seq_len))


def test_sample_inputs_poison_the_cache_past_the_length():
    """The verification above is only meaningful if rows >= L would show up: they are NaN."""
    kernel = attention(8, 2, 64, 64)
    inputs = kernel.definition.sample_inputs(np.random.default_rng(0), {"seq_len": 20})
    for name in ("k_cache", "v_cache"):
        assert np.isnan(inputs[name][:, 20:].astype(np.float32)).all(), f"{name} rows past L must be NaN"
        assert np.isfinite(inputs[name][:, :20].astype(np.float32)).all(), f"{name} rows below L must be finite"


def test_peaked_softmax_and_custom_scale():
    """Large scores (a softmax close to one-hot) exercise the running max and its rescaling."""
    kernel = attention(8, 2, 128, 200, "f32", scale=0.7)
    kind = kernel.definition
    rng = np.random.default_rng(5)
    scalars = {"seq_len": 173}
    inputs = kind.sample_inputs(rng, scalars)
    inputs["q"] = (inputs["q"] * 6).astype(np.float32)  # scores of magnitude ~100
    inputs["k_cache"][:, 150] *= 3  # one dominant late key (after several max updates)
    arrays = run(kernel, inputs, scalars)
    assert_passes(compare(kernel, arrays, kind.reference(inputs, scalars), scalars))


@pytest.mark.parametrize("divisor", [1, 2, 3, 5, 7, 16, 33, 48, 100, 528, 1023, 4096, 65535])
@pytest.mark.parametrize("bound", [1, 2, 3, 1000, 1 << 10, 40960 + 528, 1 << 24, (1 << 24) + 1, 1 << 30])
def test_division_by_a_constant_is_exact_below_the_bound(divisor, bound):
    """div_const's multiply-and-shift (ptxas expands div.u32 by an immediate into its generic
    sequence): exact for every value below the bound (all of them up to 2^16, then the ends and
    a sample), and the u32 product it needs fits 64 bits."""
    multiplier, shift = division_magic(divisor, bound)
    assert multiplier < 1 << 32 and (bound - 1) * multiplier < 1 << 64
    values = np.unique(np.concatenate([np.arange(min(bound, 1 << 16)), np.arange(max(0, bound - 4096), bound),
                                       np.random.default_rng(divisor).integers(0, bound, 4096)])).astype(object)
    got = np.array([(int(n) * multiplier) >> shift for n in values], dtype=object)
    assert (got == values // divisor).all(), (divisor, bound)


# --- split-KV -------------------------------------------------------------------------------------
def test_split_rule_fills_the_gpu_at_every_length():
    """Qwen3-8B decode at batch 1: 8 KV heads alone would use 8 SMs; the split rule asks for
    132 SMs * 2 resident CTAs (16 warps, 64 registers each: half an SM's warps) at long contexts,
    and chunks of at least one 64-key ring tile at short ones (1k keys: 16 splits, a CTA an SM)."""
    for name in ("qwen3_8b_decode_attention", "qwen3_8b_decode_attention_graph"):
        kind = spec_kernel(QWEN3, name).definition
        plan = kind.plan
        assert (plan.warps, plan.tile, plan.max_registers, plan.resident_ctas, plan.max_splits) == (16, 64, 64, 2, 33)
        for seq_len in (1, 100, 1024, 4096, 8192, 16383, 40960):
            chunk, splits = plan.split(seq_len)
            assert chunk >= plan.tile and chunk % plan.group_keys == 0 and 1 <= splits <= plan.max_splits
            assert (splits - 1) * chunk < seq_len <= splits * chunk, (seq_len, chunk, splits)
            grid = kind.launch({"seq_len": seq_len}).grid
            assert grid == ((33 if kind.config.indirect_seq_len else splits), 8, 1), (name, seq_len, grid)
        assert [kind.splits(n) for n in (1024, 2048, 4096, 8192, 40960)] == [16, 32, 32, 32, 33]


def test_the_chunk_rule_divides_exactly_past_the_cache_length(monkeypatch):
    """attn_chunk divides len + unit - 1 (unit = max_splits * group_keys) by unit with a multiply
    and a shift, exact only below the bound they are made for; the operand passes max_seq_len by up
    to unit - 1. 12 query heads of one f32 KV head, a 112-key cache: unit 112, and at the whole
    cache the operand is 223, which a magic made for 112 alone divides into 2 (32-key chunks where
    the rule gives 16: 4 splits hold keys where the host launched 7). Such a quotient only ever
    rounds up, so the output stays right; the chunks the CTAs take show it: with kv_prefetch_keys
    each CTA asks L2 for the first keys of its own chunk, here every key of a 16-key chunk."""
    fields = dict(num_heads=12, num_kv_heads=1, head_dim=128, kv_dtype="f32", max_seq_len=112)
    kernel = compile_kernel(make_config("incremental_attention", kv_prefetch_keys=16, **fields), ("sm_80",),
                            until="ptx")
    plan = kernel.definition.plan
    assert plan.max_splits * plan.group_keys == 112 and plan.split(112) == (16, 7)
    multiplier, shift = division_magic(112, 112)
    assert 223 * multiplier >> shift == 2       # the case tells a bound of max_seq_len from the kernel's
    inputs = kernel.definition.sample_inputs(np.random.default_rng(112), {"seq_len": 112})
    seen = prefetched_lines(monkeypatch, lambda: run(kernel, inputs, {"seq_len": 112}))
    row = 128 * 4
    expected = {(cache, key * row + line * 128) for cache in ("k_cache", "v_cache") for key in range(112)
                for line in range(row // 128)}
    assert len(seen) == len(set(seen)) and set(seen) == expected, sorted(expected - set(seen))[:4]
    monkeypatch.undo()
    assert_passes(verify_kernel(kernel, {"seq_len": 112}, seed=112))


def test_a_short_cache_splits_down_to_one_ring_tile_a_cta():
    """Where the GPU's CTAs do not bound it (a short cache), max_splits is the cache's ring tiles
    rounded up: at the whole cache every split holds one tile, the last one's keys past a whole
    number of tiles too (65 keys: 2 splits of one 64-key tile, not one split of two tiles)."""
    for max_seq_len, splits in ((40, 1), (64, 1), (65, 2), (100, 2), (129, 3), (200, 4)):
        kind = attention(8, 2, 128, max_seq_len, "f16").definition
        plan = kind.plan
        assert plan.tile == 64 and plan.max_splits == splits, (max_seq_len, plan.max_splits)
        assert plan.split(max_seq_len) == (plan.tile, splits)
        assert kind.launch({"seq_len": max_seq_len}).grid == (splits, 2, 1)


def test_long_length_splits_and_the_last_cta_merges():
    """At a long length several CTAs per KV head each write a partial (m, l, o) to the workspace;
    the merged output matches the reference, the partials merge to it in numpy too, and the
    counters are back at 0."""
    kernel = attention(8, 2, 128, 1024)
    kind = kernel.definition
    seq_len = 1000
    scalars = {"seq_len": seq_len}
    chunk, splits = kind.plan.split(seq_len)
    assert splits >= 8 and kind.launch(scalars).grid == (splits, 2, 1)
    inputs = kind.sample_inputs(np.random.default_rng(3), scalars)
    arrays = run(kernel, inputs, scalars)
    reference = kind.reference(inputs, scalars)
    assert_passes(compare(kernel, arrays, reference, scalars))

    partials, counters = arrays["partials"], arrays["counters"]
    assert (counters == 0).all(), f"counters must be reset by the merging CTA, got {counters}"
    hd, group = 128, 4
    m, l, o = partials[..., hd], partials[..., hd + 1], partials[..., :hd]
    written = l >= 1.0  # the best key of a split weighs exactly 1
    assert written[:, :splits].all(), "every split holding keys must publish its partial"
    assert not written[:, splits:].any(), "splits past the end hold nothing"
    # m is the running max in the exp2 domain: recombine in float64 and compare with out.
    top = m[:, :splits].max(axis=1, keepdims=True)
    weight = np.exp2(m[:, :splits] - top)
    merged = (weight[..., None] * o[:, :splits]).sum(axis=1) / (weight * l[:, :splits]).sum(axis=1)[..., None]
    error = np.linalg.norm(merged.reshape(8, hd) - reference["out"]) / np.linalg.norm(reference["out"])
    assert error < 1e-5, f"the workspace partials do not merge to the reference (rel. L2 {error:.2e})"
    # Each split's partial is attention over its own chunk alone.
    q = inputs["q"].astype(np.float64)
    k = inputs["k_cache"].astype(np.float64)
    v = inputs["v_cache"].astype(np.float64)
    for split in (0, splits - 1):
        keys = slice(split * chunk, min(seq_len, (split + 1) * chunk))
        for head in (0, 7):
            g = head // group
            own = attention_reference(q[head:head + 1], k[g:g + 1, keys], v[g:g + 1, keys],
                                      keys.stop - keys.start, kind.config.softmax_scale)[0]
            got = o[g, split, head % group] / l[g, split, head % group]
            np.testing.assert_allclose(got, own, rtol=1e-4, atol=1e-5,
                                       err_msg=f"partial of split {split}, head {head} is not its chunk's attention")


def launch_raw(kernel, arrays, scalars, grid=None):
    """One interpreter launch on `arrays` as they are (no fresh workspace, no launcher checks)."""
    geometry = kernel.definition.launch(scalars)
    interpret(kernel.ptx, kernel.name, grid or geometry.grid, geometry.block, kernel.args(arrays, scalars),
              dynamic_shared=geometry.dynamic_shared, sanitize=True, kernel_name=kernel.name)


@pytest.mark.parametrize("shape", [(40, 2, 128, "bf16"), (24, 1, 256, "f16")])
def test_a_ring_tile_that_copy_passes_do_not_divide(shape):
    """CTAs of 10 or 12 warps (20 or 24 query heads a KV head) copy a ring tile in passes of a
    row count that does not divide it: the last pass's rows past the tile were copied into the V
    tile or the next stage, a cp.async race the sanitizer reports (found at edge configs)."""
    num_heads, num_kv_heads, head_dim, kv_dtype = shape
    kernel = attention(num_heads, num_kv_heads, head_dim, 64, kv_dtype)
    plan = kernel.definition.plan
    assert plan.tile % plan.copy_rows and plan.copy_passes >= 2, plan
    for seq_len in (1, 37, 64):
        assert_passes(verify_kernel(kernel, {"seq_len": seq_len}, seed=seq_len))


@pytest.mark.parametrize("indirect", [False, True])
def test_second_launch_on_the_same_workspace_gives_the_same_result(indirect):
    """The merging CTA puts its counter back to 0, so the next launch (or a CUDA graph replay)
    needs no re-zeroing: twice in a row on the same arrays gives bit-identical outputs."""
    kernel = attention(8, 2, 64, 512, "bf16", indirect_seq_len=indirect)
    kind = kernel.definition
    scalars = {"seq_len": 509}
    inputs = kind.sample_inputs(np.random.default_rng(11), scalars)
    arrays = prepare_arrays(kernel, inputs, scalars)
    assert kind.launch(scalars).grid[0] > 1, "this test needs several splits"
    launch_raw(kernel, arrays, scalars)
    first = arrays["out"].copy()
    assert (arrays["counters"] == 0).all(), f"counters after the first launch: {arrays['counters']}"
    arrays["out"][:] = np.nan
    launch_raw(kernel, arrays, scalars)
    assert (arrays["counters"] == 0).all(), f"counters after the second launch: {arrays['counters']}"
    np.testing.assert_array_equal(arrays["out"], first, err_msg="the second launch differs from the first")
    assert_passes(compare(kernel, arrays, kind.reference(inputs, scalars), scalars))


@pytest.mark.parametrize("shape", [(8, 2, 128, "f16"), (4, 1, 64, "bf16"), (2, 2, 256, "f32")])
def test_a_chunk_of_several_ring_tiles_rescales_its_running_softmax(shape):
    """One CTA a KV head (an SM, a CTA each): a chunk spans several ring tiles, and the online
    softmax rescales its running sum and output whenever a later tile raises the max. Elsewhere
    only the 2121-key spec instance took that path (17 s): dropping `l *= alpha` passed every
    other test (mutation testing, session 25)."""
    num_heads, num_kv_heads, head_dim, kv_dtype = shape
    kernel = attention(num_heads, num_kv_heads, head_dim, 300, kv_dtype, sm_count=1, ctas_per_sm=1)
    plan = kernel.definition.plan
    for seq_len in (2 * plan.tile + 7, 300):
        chunk, splits = plan.split(seq_len)
        assert splits == 1 and chunk >= seq_len > 2 * plan.tile, (seq_len, chunk, splits, plan.tile)
        assert_passes(verify_kernel(kernel, {"seq_len": seq_len}, seed=seq_len))


def test_many_short_splits_merge_over_several_rounds():
    """Chunks of 16 keys (one key group of 2 warps): more splits than the last CTA's lanes take
    in one round (split_lanes lanes per output float4, splits_per_round each), so the final
    combine loops, then merges its lanes by shuffles."""
    kernel = attention(2, 2, 64, 4096, "f16", warps=2, sm_count=512, ctas_per_sm=1)
    kind = kernel.definition
    plan = kind.plan
    seq_len = 2500
    chunk, splits = plan.split(seq_len)
    assert chunk == 16 and splits > plan.splits_per_round * plan.split_lanes and plan.split_lanes > 1, plan
    scalars = {"seq_len": seq_len}
    inputs = kind.sample_inputs(np.random.default_rng(8), scalars)
    arrays = run(kernel, inputs, scalars)
    assert_passes(compare(kernel, arrays, kind.reference(inputs, scalars), scalars))
    assert (arrays["counters"] == 0).all()


# (config fields, shape): each knob away from its default, every KV dtype, a partial last tile.
KNOBS = [
    (dict(stages=1), (8, 2, 128, "f16")),
    (dict(stages=3), (8, 2, 64, "bf16")),
    (dict(stages=4, tile_keys=32), (4, 1, 128, "f32")),
    (dict(warps=4), (8, 2, 128, "f16")),  # one key group
    (dict(warps=8, tile_keys=64), (8, 2, 128, "bf16")),  # 32 keys a key group
    (dict(dims_per_warp=64), (8, 2, 128, "f16")),
    (dict(dims_per_warp=64, tile_keys=32), (16, 1, 256, "f32")),
    (dict(dims_per_warp=64), (2, 2, 64, "bf16")),  # one dim slice: no score exchange
]


@pytest.mark.parametrize("knobs, shape", KNOBS, ids=[",".join(f"{k}={v}" for k, v in c.items()) for c, _ in KNOBS])
def test_tuning_knobs_keep_the_result(knobs, shape):
    num_heads, num_kv_heads, head_dim, kv_dtype = shape
    kernel = attention(num_heads, num_kv_heads, head_dim, 300, kv_dtype, **knobs)
    plan = kernel.definition.plan
    for field in ("stages", "dims_per_warp", "warps"):
        assert field not in knobs or getattr(plan, field) == knobs[field], (field, plan)
    for seq_len in (1, min(3 * plan.tile + 5, 299), 300):
        assert_passes(verify_kernel(kernel, {"seq_len": seq_len}, seed=seq_len))


@pytest.mark.parametrize("extra", [dict(pdl=True), dict(pdl=True, indirect_seq_len=True), dict()],
                         ids=("pdl", "pdl_indirect", "plain"))
def test_kv_prefetch_asks_for_each_chunks_first_keys_once_and_changes_no_bits(monkeypatch, extra):
    """kv_prefetch_keys = N asks L2 for exactly the K and V lines of the first N keys of every
    CTA's chunk (80-key chunks: N = 24 of a full one, all of a short last one, none of an empty
    one or of an empty cache), each once, inside the cache; and on the portable PTX and on the
    sm_90 one (with pdl: the requests before griddepcontrol.wait, which the sanitizer's PDL
    check allows for a prefetch) the outputs keep the bits of the kernel without it."""
    fields = dict(num_heads=8, num_kv_heads=2, head_dim=128, max_seq_len=300, sm_count=4, **extra)
    archs = ("sm_80", "sm_90")
    kernel = compile_kernel(make_config("incremental_attention", kv_prefetch_keys=24, **fields), archs, until="ptx")
    plain = compile_kernel(make_config("incremental_attention", **fields), archs, until="ptx")
    kind = kernel.definition
    row = 128 * 2
    for seq_len in (0, 37, 300):
        inputs = kind.sample_inputs(np.random.default_rng(seq_len), {"seq_len": seq_len})
        seen = prefetched_lines(monkeypatch, lambda: run(kernel, inputs, {"seq_len": seq_len}, arch="sm_90"))
        assert len(seen) == len(set(seen)), "a line asked for twice"
        chunk, splits = kind.plan.split(seq_len)
        expected = {(cache, ((head * 300 + split * chunk) * row) + line * 128)
                    for head in range(2) for split in range(splits) for cache in ("k_cache", "v_cache")
                    for line in range(min(24, chunk, seq_len - split * chunk) * row // 128)}
        assert set(seen) == expected, seq_len
        monkeypatch.undo()
        for arch in archs:
            ours, theirs = (run(k, inputs, {"seq_len": seq_len}, arch=arch) for k in (kernel, plain))
            assert np.array_equal(ours["out"].view(np.uint8), theirs["out"].view(np.uint8)), (seq_len, arch)


@pytest.mark.parametrize("extra", [dict(pdl=True), dict(pdl=True, indirect_seq_len=True), dict()],
                         ids=("pdl", "pdl_indirect", "plain"))
def test_timeline_stamps_each_cta_in_order_and_changes_no_bits(extra):
    """timeline = true: thread 0 of every launched CTA stamps its start, its PDL wait, its
    count-in and its end in that order (rows of CTAs not launched stay 0), on the portable PTX
    and the sm_90 one; the output keeps the bits of the kernel without it."""
    fields = dict(num_heads=8, num_kv_heads=2, head_dim=128, max_seq_len=300, sm_count=4, **extra)
    archs = ("sm_80", "sm_90")
    kernel = compile_kernel(make_config("incremental_attention", timeline=True, **fields), archs, until="ptx")
    plain = compile_kernel(make_config("incremental_attention", **fields), archs, until="ptx")
    kind = kernel.definition
    seq_len = 150
    inputs = kind.sample_inputs(np.random.default_rng(seq_len), {"seq_len": seq_len})
    width = kind.plan.max_splits if kind.config.indirect_seq_len else kind.splits(seq_len)
    for arch in archs:
        ours, theirs = (run(k, inputs, {"seq_len": seq_len}, arch=arch) for k in (kernel, plain))
        assert np.array_equal(ours["out"].view(np.uint8), theirs["out"].view(np.uint8)), arch
        rows = ours["timeline"].reshape(2, kind.plan.max_splits, -1)
        launched = rows[:, :width].astype(np.int64)
        assert (np.diff(launched[..., [0, 2, 3, 4]], axis=-1) > 0).all(), launched
        assert not rows[:, width:].any()


@pytest.mark.parametrize("kv_dtype", ["f16", "bf16"])
def test_q_of_any_magnitude(kv_dtype):
    """f16 tensor cores see q only after a per-head power-of-2 scaling (into f16's range); heads
    of q = 0 (uniform weights), 1e-30, 1e-8, 1e3 (a softmax close to one-hot) and mixed
    magnitudes within a head keep the f32 accuracy."""
    kernel = attention(8, 1, 128, 100, kv_dtype)
    kind = kernel.definition
    scalars = {"seq_len": 97}
    inputs = kind.sample_inputs(np.random.default_rng(9), scalars)
    q = inputs["q"]
    for head, factor in enumerate((0.0, 1e-30, 1e-8, 1e3)):
        q[head] *= np.float32(factor)
    q[4, ::2] *= np.float32(1e-6)
    q[5, :64] *= np.float32(40.0)
    arrays = run(kernel, inputs, scalars)
    assert_passes(compare(kernel, arrays, kind.reference(inputs, scalars), scalars))


def test_graph_replay_as_the_cache_grows():
    """indirect_seq_len: the same grid and workspace replayed while seq_len_ptr grows (as a
    captured graph would be) gives each length's attention."""
    kernel = attention(4, 1, 128, 256, "f16", indirect_seq_len=True)
    kind = kernel.definition
    inputs = kind.sample_inputs(np.random.default_rng(2), {"seq_len": 256})
    arrays = prepare_arrays(kernel, inputs, {"seq_len": 256})
    for seq_len in (3, 70, 71, 200, 0, 256):
        arrays["seq_len_ptr"][0] = seq_len
        arrays["out"][:] = np.nan
        launch_raw(kernel, arrays, {"seq_len": seq_len})
        assert_passes(compare(kernel, arrays, kind.reference(arrays, {"seq_len": seq_len}), {"seq_len": seq_len}))
        assert (arrays["counters"] == 0).all()


# --- lengths out of range -------------------------------------------------------------------------
@pytest.mark.parametrize("indirect", [False, True])
def test_kernel_clamps_a_length_past_the_cache(indirect):
    """Bypassing the launcher, a length > max_seq_len reads nothing past the cache (sanitizer)
    and gives the attention over the whole cache."""
    kernel = attention(8, 2, 64, 96, "f32", indirect_seq_len=indirect)
    kind = kernel.definition
    inputs = kind.sample_inputs(np.random.default_rng(4), {"seq_len": 96})
    arrays = prepare_arrays(kernel, inputs, {"seq_len": 96})
    huge = {"seq_len": 2**32 - 1}
    if indirect:
        arrays["seq_len_ptr"][0] = huge["seq_len"]
    launch_raw(kernel, arrays, huge, grid=kind.launch({"seq_len": 96}).grid)
    assert_passes(compare(kernel, arrays, kind.reference(inputs, {"seq_len": 96}), huge))


def test_launcher_rejects_lengths_past_the_cache():
    kernel = attention(4, 1, 64, 64)
    kind = kernel.definition
    assert kind.scalar_limits() == {"seq_len": (0, 64)}
    inputs = kind.sample_inputs(np.random.default_rng(0), {"seq_len": 64})
    with pytest.raises(LaunchError, match="seq_len"):
        run(kernel, inputs, {"seq_len": 65})
    graph = attention(4, 1, 64, 64, indirect_seq_len=True)
    inputs = graph.definition.sample_inputs(np.random.default_rng(0), {"seq_len": 64})
    inputs["seq_len_ptr"][0] = 65
    with pytest.raises(LaunchError, match=r"seq_len_ptr\[0\]: expected 0..64, got 65"):
        run(graph, inputs, {"seq_len": 64})


@pytest.mark.parametrize("config, message", [
    ({"num_heads": 6, "num_kv_heads": 4, "head_dim": 64}, "must divide"),
    ({"num_heads": 4, "num_kv_heads": 1, "head_dim": 96}, "head_dim: expected one of 64, 128, 256"),
    ({"num_heads": 512, "num_kv_heads": 1, "head_dim": 256}, "at most"),
    ({"num_heads": 128, "num_kv_heads": 2, "head_dim": 256}, "a group of 64 query heads per KV head needs .* registers"),
    ({"num_heads": 4, "num_kv_heads": 1, "head_dim": 64, "warps": 32, "tile_keys": 512, "stages": 4, "kv_dtype": "f32"},
     r"warps = 32 needs 1024 threads of \d+ registers per CTA"),
    ({"num_heads": 8, "num_kv_heads": 2, "head_dim": 128, "warps": 6}, "warps: a key group is 4 warps"),
    ({"num_heads": 8, "num_kv_heads": 2, "head_dim": 128, "tile_keys": 48}, "tile_keys: expected 4 key groups"),
    ({"num_heads": 8, "num_kv_heads": 2, "head_dim": 128, "dims_per_warp": 16}, "dims_per_warp: expected one of"),
    ({"num_heads": 8, "num_kv_heads": 2, "head_dim": 128, "stages": 5}, "stages"),
    ({"num_heads": 8, "num_kv_heads": 2, "head_dim": 128, "scale": 1e27},
     r"scale: at most 2\.147e\+26 for head_dim 128 \(scores of q and K in f16's range"),
    ({"num_heads": 8, "num_kv_heads": 2, "head_dim": 64, "scale": 5e26}, r"scale: at most 4\.295e\+26 for head_dim 64"),
    ({"num_heads": 8, "num_kv_heads": 2, "head_dim": 128, "scale": float("inf")}, "finite, normal f32"),
    ({"num_heads": 8, "num_kv_heads": 2, "head_dim": 128, "scale": 1e-50}, "finite, normal f32"),
    ({"num_heads": 8, "num_kv_heads": 2, "head_dim": 128, "scale": 0.0}, "scale"),
])
def test_config_errors(config, message):
    with pytest.raises(Exception, match=message):
        make_kernel("incremental_attention", max_seq_len=64, **config)


@pytest.mark.parametrize("kv_dtype", ["f16", "bf16", "f32"])
def test_scale_at_its_limit_keeps_f16_range_scores_finite(kv_dtype):
    """At the largest scale a spec may give (max_scale) and the smallest normal one, q and K of
    f16's largest magnitude (scores of +-2^127 in the exp2 domain: the most positive ones tie, the
    others weigh 0, past the first split too) give finite results; a scale twice the limit would
    make them inf - inf = NaN."""
    length = 150
    keys = np.where(np.arange(length) % 3 == 0, 1.0, -1.0)[None, :, None] * np.full((1, length, 64), 65504.0)
    q = np.full((4, 64), 65504.0, np.float32)
    q[1] *= -1  # the negative keys win
    q[2] *= np.float32(1e-3)
    q[3, ::2] *= -1  # every score 0: uniform weights
    for scale in (max_scale(64), 1.2e-38):
        kernel = attention(4, 1, 64, length, kv_dtype, scale=scale)
        kind, scalars = kernel.definition, {"seq_len": length}
        assert kind.splits(length) > 1
        inputs = kind.sample_inputs(np.random.default_rng(0), scalars)
        inputs["q"], inputs["k_cache"] = q, from_float(keys, kv_dtype)
        assert_passes(compare(kernel, run(kernel, inputs, scalars), kind.reference(inputs, scalars), scalars))


# --- metadata and performance properties ------------------------------------------------------------
def test_traffic_counts_the_cache_bytes_actually_read():
    kind = spec_kernel(QWEN3, "qwen3_8b_decode_attention").definition
    traffic = kind.traffic({"seq_len": 8192})
    assert traffic.bytes == 8 * 8192 * 128 * 2 * 2 + 2 * 32 * 128 * 4
    assert traffic.flops == 4 * 32 * 8192 * 128
    assert kind.traffic({"seq_len": 0}).bytes == 2 * 32 * 128 * 4


@pytest.mark.parametrize("kv_dtype, head_dim", [("f16", 128), ("f32", 64), ("bf16", 256)])
def test_ptx_has_the_fast_path(kv_dtype, head_dim):
    """Performance properties (not correctness): the key loop copies K/V with 16-byte cp.async
    into the ring, multiplies on tensor cores, exponentiates with ex2.approx, and ends with an
    mma after its shuffles (which keeps ptxas from a call-based shuffle fallback on sm_8x)."""
    ptx = attention(8, 2, head_dim, 256, kv_dtype).ptx
    loop = ptx[ptx.index("KEY_TILE:"):ptx.index("KEYS_DONE:")]
    assert "cp.async.cg.shared.global" in loop and ", 16;" in loop and "ld.global" not in loop
    mma = f"mma.sync.aligned.m16n8k16.row.col.f32.{'f16' if kv_dtype == 'f16' else 'bf16'}"
    assert mma in loop and "ex2.approx" in loop
    assert loop.rindex("mma.sync") > loop.rindex("shfl.sync")


SPILL_CONFIGS = [
    dict(num_heads=32, num_kv_heads=1, head_dim=64, max_seq_len=4096, kv_dtype="f16"),
    dict(num_heads=64, num_kv_heads=8, head_dim=256, max_seq_len=4096, kv_dtype="f16"),
    dict(num_heads=128, num_kv_heads=2, head_dim=128, max_seq_len=4096, kv_dtype="f32"),
    dict(num_heads=16, num_kv_heads=16, head_dim=128, max_seq_len=4096, kv_dtype="bf16"),
    dict(num_heads=32, num_kv_heads=1, head_dim=128, max_seq_len=4096, kv_dtype="bf16"),  # 64 dims a warp
    dict(num_heads=32, num_kv_heads=8, head_dim=128, max_seq_len=4096, kv_dtype="f16", tile_keys=128, stages=4),
    dict(num_heads=32, num_kv_heads=8, head_dim=256, max_seq_len=4096, kv_dtype="f32", tile_keys=32),
    dict(num_heads=32, num_kv_heads=8, head_dim=128, max_seq_len=4096, kv_dtype="bf16", tile_keys=64),
]


def test_every_instance_assembles_without_spills():
    """The spec's instances and a few extreme layouts, for every arch: zero spills, no local memory."""
    spec = load_spec(QWEN3).spec
    kernels = [k for k in spec.kernels if k.kind == "incremental_attention"]
    assert len(kernels) == 2 and {k.indirect_seq_len for k in kernels} == {False, True}
    kernels += [make_config("incremental_attention", **config) for config in SPILL_CONFIGS]
    for kernel in kernels:
        for arch, used in resources(kernel).items():
            assert used["spill_stores"] == used["spill_loads"] == used["local_bytes"] == 0, (
                f"{kernel.name} ({kernel.num_heads}/{kernel.num_kv_heads} heads, {kernel.head_dim}, "
                f"{kernel.kv_dtype}) on {arch}: {used}")


def test_spec_instance_verifies_at_small_lengths():
    """The Qwen3 instance (max_seq_len 40960) runs at verify_scalars' small lengths, one of them
    split, in the interpreter: the same compiled PTX as on the GPU."""
    kernel = spec_kernel(QWEN3, "qwen3_8b_decode_attention")
    kind = kernel.definition
    lengths = [s["seq_len"] for s in kind.verify_scalars()]
    assert lengths == [0, 1, 37, 2121, 323, 137]
    splits = [kind.splits(n) for n in lengths]
    assert lengths[3] > splits[3] * kind.plan.tile, "a CTA streams more than one ring tile"
    assert splits[3] > splits[4] > splits[5] > 1, "fewer splits after more: the merge must ignore older partials"
    assert_passes([check for checks in verify_sizes(kernel, kind.verify_scalars(), seed=1) for check in checks])
