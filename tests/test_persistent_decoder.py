"""persistent_decoder: whole Qwen3 decoder layers in one launch, run as real PTX in the interpreter
(sanitizer on, outputs poisoned, workspaces zeroed) against (1) a float64 numpy Qwen3 reference
written from the KERNELS.md formula and (2) the same step run as the separate kinds
(fused_rmsnorm_q4k_gemv, per_head_rmsnorm, rope, kv_append, incremental_attention, q4k_gemv,
residual_add, swiglu) in the interpreter; grids of
1..N CTAs; planted barrier bugs; the barrier words across launches; indirect pos; assembly."""

from __future__ import annotations

import functools
import itertools
import re
from typing import get_args

import numpy as np
import pytest

from ptxgen.dtypes import to_float64
from ptxgen.errors import LaunchError, PtxgenError, SanitizerError, SpecError
from ptxgen.interp import launch as interpret
from ptxgen.kernels import kind_of
from ptxgen.generate import more_bits
from ptxgen.kernels.persistent_decoder import (BARRIER_WORDS, FORCED_X_TOLERANCE, HEAD_DIMS, PHASE_BARRIERS, GemvQuant,
                                                   WeightName, decoder_reference)
from ptxgen.pipeline import compiler
from ptxgen.quants import GEMV_KINDS
from ptxgen.runner import prepare_arrays, run, run_step
from ptxgen.spec import load_spec
from ptxgen.verify import relative_l2, verify_kernel

from helpers import ROOT, make_config, make_kernel, prefetched_lines, resources, run_cli, with_ptx

# The small config: hidden 512, 4 query heads, 2 KV heads, head_dim 128, intermediate 1024.
TINY = dict(hidden=512, num_heads=4, num_kv_heads=2, head_dim=128, intermediate=1024, max_seq_len=64)
POSITIONS = (0, 1, 37, 63)
# x against the float64 reference that reads the kernel's own new cache rows (teacher forcing,
# see decoder_reference): both are f32 pipelines of ~10 dot products of <= 1024 terms, RMS
# factors (rsqrt.approx), rope (sin/cos.approx after an exact reduction), ex2.approx softmax.
# Measured on the tiny config, 1-2 layers, seeds 0..2, every position below: at most 1.6e-6.
X_TOL = 1e-5
# The separate kernels against the decoder, same teacher forcing: the same kinds of f32
# arithmetic in other orders (another key split; rcp.rn vs rcp.approx). Measured at most 1.5e-6
# when the step still ran RMSNorm then GEMV (now fused norm + GEMV, as the decoder does).
SEPARATE_TOL = 1e-5
# A new cache element is the kernel's f32 value rounded to kv_dtype: within half an ulp of
# kv_dtype of the exact value, plus the f32 pipeline's own error (~1e-6 of the head's RMS;
# 1e-5 allowed).
ROW_REL = 1e-5


def kernel_for(layers=2, name="pd", **extra):
    return make_kernel("persistent_decoder", name=name, **TINY, num_layers=layers, **extra)


COMPILED_OF = compiler(("sm_80",), until="ptx")  # the separate kernels, compiled once each


@functools.lru_cache(maxsize=None)
def base_inputs(layers: int, kv_dtype: str, seed: int) -> dict[str, np.ndarray]:
    """Sample inputs (Q4_K weights from ptxgen.q4k's quantiser, a cache filled with random rows)."""
    kind = kernel_for(layers, kv_dtype=kv_dtype).definition
    inputs = kind.sample_inputs(np.random.default_rng(seed), {"pos": 0})
    for array in inputs.values():
        array.setflags(write=False)
    return inputs


def decoder_run(kernel, inputs, pos, ptx=None, contract=False):
    return run(with_ptx(kernel, ptx) if ptx else kernel, dict(inputs), {"pos": pos}, contract=contract)


def ulp(values: np.ndarray, dtype: str) -> np.ndarray:
    """Spacing of kv_dtype at |values| (float64 in, float64 out)."""
    mags = np.abs(values)
    if dtype == "f16":
        return np.spacing(mags.astype(np.float16)).astype(np.float64)
    if dtype == "f32":
        return np.spacing(mags.astype(np.float32)).astype(np.float64)
    exponent = np.floor(np.log2(np.maximum(mags, 2.0**-126)))
    return 2.0 ** (exponent - 7)


def assert_same_bits(out, plain, what="", names=("x", "k_cache", "v_cache")):
    """Every bit of the arrays `names` of two runs' outputs equal (`what`: how the first differs)."""
    for name in names:
        assert np.array_equal(out[name].view(np.uint8), plain[name].view(np.uint8)), f"{name} differs{what}"


def check_new_rows(c, out, inputs, reference, pos):
    """Every layer's cache row pos holds k/v rounded to kv_dtype; every other row is untouched
    (c: the decoder's config)."""
    for cache, new in (("k_cache", "k_new"), ("v_cache", "v_new")):
        got, before = out[cache], inputs[cache]
        assert got.dtype == before.dtype and got.shape == before.shape
        keep = np.ones(c.max_seq_len, bool)
        keep[pos] = False
        assert np.array_equal(got[:, :, keep].view(np.uint8), before[:, :, keep].view(np.uint8)), (
            f"{cache}: rows other than pos={pos} changed")
        row = to_float64(got[:, :, pos], c.kv_dtype)
        exact = reference[new]
        scale = np.sqrt(np.mean(exact**2, axis=-1, keepdims=True))  # a head's f32 error scales with its RMS
        bound = 0.5 * ulp(row, c.kv_dtype) + ROW_REL * scale
        err = np.abs(row - exact)
        worst = np.unravel_index(np.argmax(err / bound), err.shape)
        assert (err <= bound).all(), (
            f"{cache}[layer, head, pos={pos}, d] at {worst}: stored {row[worst]!r}, exact {exact[worst]!r} "
            f"(|diff| {err[worst]:.3e} > half an ulp of {c.kv_dtype} + f32 error {bound[worst]:.3e})")


def barrier_word(barriers: int, start: int = 0) -> int:
    """The grid barrier's word after `barriers` barriers from `start` (low 31 bits 0)."""
    return start ^ (barriers % 2) << 31


def check_against_reference(kernel, out, inputs, pos):
    """x and the new cache rows against the float64 reference; barrier words back at rest."""
    assert np.isfinite(out["x"]).all(), f"pos={pos}: x has {np.count_nonzero(~np.isfinite(out['x']))} non-finite"
    forced = decoder_reference(inputs, kernel.definition.config, pos, stored=out)
    err = relative_l2(out["x"].astype(np.float64), forced["x"])
    assert err <= X_TOL, f"layers={kernel.definition.config.num_layers} pos={pos}: x rel. L2 error {err:.3e} > {X_TOL:.0e}"
    check_new_rows(kernel.definition.config, out, inputs, forced, pos)
    # The free-running reference (what `ptxgen verify` compares against) within the kind's tolerance.
    kind = kernel.definition
    free = decoder_reference(inputs, kernel.definition.config, pos)
    err = relative_l2(out["x"].astype(np.float64), free["x"])
    assert err <= kind.tolerance(kind.param("x")), f"pos={pos}: x vs free-running reference {err:.3e}"
    # Barrier word: arrivals back to 0, its top bit flipped once per barrier; attention and head counters at 0.
    barriers = PHASE_BARRIERS * kernel.definition.config.num_layers - 1
    assert out["barrier"][0] == barrier_word(barriers), hex(out["barrier"][0])
    assert not out["counters"].any(), f"counters not reset: {out['counters']}"


# --- the same step as separate kinds -----------------------------------------------------------
def separate_kernels_step(kernel, inputs, pos, stored):
    """The decoder's own separate_step (fused_rmsnorm_q4k_gemv_group q/k/v -> per_head_rmsnorm x2
    -> rope x2 -> kv_append -> incremental_attention -> q4k_gemv o -> residual_add ->
    fused_rmsnorm_q4k_gemv_group gate/up -> swiglu -> q4k_gemv down -> residual_add, per layer),
    every launch real PTX in the interpreter. After each kv_append the rows it wrote are kept aside and replaced by the
    decoder's (`stored`, teacher forcing: see decoder_reference), so that a 1-ulp rounding flip
    does not flow into later layers; x and the kept rows are returned."""
    temporaries, calls = kernel.definition.separate_step({"pos": pos})
    buffers = {name: array.copy() for name, array in inputs.items()}
    buffers.update({t.name: np.zeros(t.shape, np.float32) for t in temporaries})
    own = {"k_cache": np.empty_like(buffers["k_cache"][:, :, pos]),
           "v_cache": np.empty_like(buffers["v_cache"][:, :, pos])}
    layer = 0
    for call in calls:
        run_step([call], buffers, COMPILED_OF)
        if call.kernel.kind == "kv_append":
            for cache in own:
                own[cache][layer] = buffers[cache][layer, :, pos]
                buffers[cache][layer, :, pos] = stored[cache][layer, :, pos]
            layer += 1
    config = kernel.definition.config
    assert layer == config.num_layers and len(calls) == (13 if config.qk_norm else 11) * config.num_layers
    return buffers["x"], own


def check_against_separate_kernels(kernel, out, inputs, pos):
    x, own = separate_kernels_step(kernel, inputs, pos, out)
    err = relative_l2(out["x"].astype(np.float64), x.astype(np.float64))
    assert err <= SEPARATE_TOL, f"layers={kernel.definition.config.num_layers} pos={pos}: x vs separate kernels {err:.3e}"
    for cache in ("k_cache", "v_cache"):
        mine = to_float64(out[cache][:, :, pos], kernel.definition.config.kv_dtype)
        theirs = to_float64(own[cache], kernel.definition.config.kv_dtype)
        # Both round an f32 value of the same quantity (each within ~1e-6 of the head's RMS):
        # equal, or one ulp apart where that value sits next to a rounding boundary (rare).
        scale = np.sqrt(np.mean(mine**2, axis=-1, keepdims=True))
        bound = ulp(np.maximum(np.abs(mine), np.abs(theirs)), kernel.definition.config.kv_dtype) + 2 * ROW_REL * scale
        apart = np.abs(mine - theirs) > bound
        assert not apart.any(), f"{cache} row pos={pos}: {np.count_nonzero(apart)} elements further apart than an ulp"
        flips = np.count_nonzero(mine != theirs)
        assert flips <= max(2, mine.size // 50), f"{cache} row pos={pos}: {flips} of {mine.size} elements differ"


# --- correctness -------------------------------------------------------------------------------
@pytest.mark.parametrize("pos", POSITIONS)
def test_two_layers_match_reference_and_separate_kernels(pos):
    kernel = kernel_for(2)
    inputs = base_inputs(2, "f16", seed=pos)
    out = decoder_run(kernel, inputs, pos)
    check_against_reference(kernel, out, inputs, pos)
    if pos in (0, 63):
        check_against_separate_kernels(kernel, out, inputs, pos)


@pytest.mark.parametrize("pos", (1, 37))
def test_one_layer_matches_reference_and_separate_kernels(pos):
    kernel = kernel_for(1)
    inputs = base_inputs(1, "f16", seed=100 + pos)
    out = decoder_run(kernel, inputs, pos)
    check_against_reference(kernel, out, inputs, pos)
    check_against_separate_kernels(kernel, out, inputs, pos)


def test_fused_mul_add_pairs_match_reference_and_unfused_separate_kernels():
    """The mul/add pairs ptxas may contract (attention's softmax sum: interp.contraction)
    fused in the decoder, not in the separate kernels (ptxas decides kernel by kernel): the same
    contract."""
    from ptxgen.interp.contraction import contractions
    from ptxgen.interp.parser import parse

    kernel = kernel_for(1)
    # the softmax sum's l * alpha + p (and three exact p * 2^15 products): where an attention item
    # is one ring tile, as here, l is 0 as alpha first applies and fusing changes no bit
    assert len(contractions(parse(kernel.variants["sm_80"].ptx, kernel.name))) == 4
    inputs = base_inputs(1, "f16", seed=137)
    out = decoder_run(kernel, inputs, 37, contract=True)
    check_against_reference(kernel, out, inputs, 37)
    check_against_separate_kernels(kernel, out, inputs, 37)


@pytest.mark.parametrize("pos", (0, 63))
def test_twelve_warps_match_reference_and_separate_kernels(pos):
    """warps = 12 (384-thread CTAs at 168 registers): 1.5x the GEMV tasks in flight a CTA and 3
    attention key groups instead of 2; the same contract, checked against the reference and the
    separate kernels. A GEMV row is computed the same way whichever warp takes its task, so the
    outputs agree with 8 warps wherever attention's key split does not enter (layer 0's V rows)."""
    kernel = kernel_for(2, warps=12)
    kind = kernel.definition
    assert kind.launch({"pos": pos}).block == (384, 1, 1) and kind.attention.key_groups == 3
    inputs = base_inputs(2, "f16", seed=pos)
    out = decoder_run(kernel, inputs, pos)
    check_against_reference(kernel, out, inputs, pos)
    check_against_separate_kernels(kernel, out, inputs, pos)
    eight = decoder_run(kernel_for(2), inputs, pos)
    assert np.array_equal(out["v_cache"][0, :, pos].view(np.uint16), eight["v_cache"][0, :, pos].view(np.uint16))


def test_twelve_warps_at_head_dim_256_take_64_dims_a_warp():
    """At head_dim 256, 32 dims a warp make 8-warp key groups, no divisor of 12 warps (refused
    before, found at edge configs): 64 dims a warp, 4-warp key groups, 3 of them, and the same
    contract."""
    kernel = make_kernel("persistent_decoder", name="pd", **{**TINY, "head_dim": 256, "num_heads": 2,
                                                             "num_kv_heads": 1}, num_layers=1, warps=12)
    plan = kernel.definition.attention
    assert (plan.dims_per_warp, plan.key_groups) == (64, 3), plan
    inputs = kernel.definition.sample_inputs(np.random.default_rng(5), {"pos": 37})
    out = decoder_run(kernel, inputs, 37)
    check_against_reference(kernel, out, inputs, 37)
    check_against_separate_kernels(kernel, out, inputs, 37)


def test_verify_grades_a_one_layer_decoder_teacher_forced():
    """verify adds gradings against the teacher-forced reference (Kind.forced) where every rounding
    is the kernel's (one layer): a per-head RMS mean of 1/127 instead of 1/128 passes the
    free-running tolerance (x moves 0.6%) but not the new k rows' (k scales by sqrt(128/127))."""
    kernel = kernel_for(1)
    text = "mul.rn.f32 %inv, %ss, 0f3C000000;"  # q/k norm: the mean of 128 squares
    assert kernel.portable.ptx.count(text) == 1
    mutant = with_ptx(kernel, kernel.portable.ptx.replace(text, "mul.rn.f32 %inv, %ss, 0f3C010204;"))
    for candidate, forced_passes in ((kernel, True), (mutant, False)):
        checks = {check.param: check for check in verify_kernel(candidate, {"pos": 37}, seed=2)}
        assert checks["x"].passed and checks["x (teacher-forced)"].passed, checks
        assert checks["k_cache row 37 (teacher-forced)"].passed == forced_passes, checks
        assert checks["v_cache row 37 (teacher-forced)"].passed, checks
        assert checks["x (teacher-forced)"].tolerance == FORCED_X_TOLERANCE
    assert kernel_for(2).definition.forced({}, {}, {"pos": 0}) == {}, "two layers: an earlier one's activations are not kept"


def test_a_decoder_too_large_to_interpret_is_verified_by_one_layer_per_weight_types():
    """Kind.stand_ins: the Qwen3-8B decoder (36 layers, 4.7 GB) as one full-shape layer; a
    Q4_K_M-like mix as one layer per distinct tuple of its layers' types, each the first such."""
    spec = load_spec(ROOT / "specs" / "qwen3_decoder.toml").spec.kernel("qwen3_8b_decoder")
    kind = kind_of(spec)
    assert kind.verify_scalars() == []
    [(config, sizes, note)] = kind.stand_ins()
    assert (config.num_layers, config.hidden, config.intermediate, sizes) == (1, 4096, 12288, [{"pos": 4095}])
    assert config.model_dump(exclude={"name", "num_layers"}) == spec.model_dump(exclude={"name", "num_layers"})
    assert note == "one layer standing for its 36 layers like layer 0"
    mixed = {"wv": tuple("q6_k" if layer % 3 == 0 else "q4_k" for layer in range(36))}
    stand_ins = kind_of(spec.model_copy(update={"weight_quants": mixed})).stand_ins()
    assert [(c.weight_quants, n) for c, _, n in stand_ins] == [
        ({"wv": ("q6_k",)}, "one layer standing for its 12 layers like layer 0"),
        ({"wv": ("q4_k",)}, "one layer standing for its 24 layers like layer 1")]
    assert kind_of(make_config("persistent_decoder", name="small", **TINY, num_layers=2)).stand_ins() == []


@pytest.mark.parametrize("kv_dtype, pos", [("f32", 20), ("bf16", 63)])
def test_other_cache_dtypes(kv_dtype, pos):
    kernel = kernel_for(1, kv_dtype=kv_dtype)
    inputs = base_inputs(1, kv_dtype, seed=7)
    out = decoder_run(kernel, inputs, pos)
    check_against_reference(kernel, out, inputs, pos)


@pytest.mark.parametrize("extra, pos", [
    (dict(head_dim=64, num_heads=16, num_kv_heads=2, kv_dtype="bf16"), 39),  # GQA 8:1, one rope pair a lane
    (dict(head_dim=256, num_heads=2, num_kv_heads=1), 0),  # 4 rope pairs a lane, one KV head
    (dict(head_dim=128, num_heads=8, num_kv_heads=1, hidden=768, kv_dtype="f32"), 21),  # MQA, hidden no power of 2
], ids=("hd64-gqa8-bf16", "hd256-mha", "mqa-hidden768-f32"))
def test_other_head_layouts(extra, pos):
    kernel = make_kernel("persistent_decoder", name="pd", **{**TINY, "intermediate": 768, "max_seq_len": 40,
                                                             "num_layers": 1, "ctas": 6, **extra})
    kind = kernel.definition
    inputs = kind.sample_inputs(np.random.default_rng(pos), {"pos": pos})
    out = decoder_run(kernel, inputs, pos)
    check_against_reference(kernel, out, inputs, pos)


@pytest.mark.parametrize("hidden, intermediate, unrolls", [
    (2304, 5376, {"qkv": 4, "o": 2, "gate_up": 4, "down": 3}),
    (2048, 2560, {"qkv": 2, "o": 2, "gate_up": 2, "down": 4}),
])
def test_gemv_phases_over_several_steps_keep_loads_in_flight_across_tasks(hidden, intermediate, unrolls):
    """Rows of 1 to 3 warp steps, some with a partial last step (2304: 9 blocks; 5376: 21; 2560:
    10): 2 to 4 row-steps of loads in flight that run on into the next task, the phases' slots
    declared for the largest. gemv_unroll changes when loads are issued, never the arithmetic:
    the same bits at 1."""
    config = dict(TINY, hidden=hidden, num_heads=2, num_kv_heads=1, intermediate=intermediate, max_seq_len=40,
                  num_layers=1, ctas=6)
    kernel = make_kernel("persistent_decoder", name="pd", **config)
    variants = kernel.definition.variants
    assert {name: phase[0].segments[0].plan.unroll for name, phase in variants.items()} == unrolls
    pos = 17
    inputs = kernel.definition.sample_inputs(np.random.default_rng(pos), {"pos": pos})
    out = decoder_run(kernel, inputs, pos)
    check_against_reference(kernel, out, inputs, pos)
    one = decoder_run(make_kernel("persistent_decoder", name="pd", **config, gemv_unroll=1), inputs, pos)
    assert_same_bits(one, out, " with gemv_unroll 1")


@pytest.mark.parametrize("extra, pos", [
    (dict(rope_style="interleaved", qk_norm=False), 37),  # a GGUF llama layer
    (dict(rope_style="interleaved", head_dim=64, num_heads=8, kv_dtype="f32"), 5),  # one pair a lane, f32 cache
    (dict(qk_norm=False, head_dim=256, num_heads=2, num_kv_heads=1, kv_dtype="bf16"), 63),  # 4 pairs a lane
], ids=("llama", "interleaved-hd64-f32", "no-qk-norm-hd256-bf16"))
def test_rope_styles_and_no_qk_norm(extra, pos):
    """llama's layer (no per-head norm, interleaved rope pairs) and each change alone, against the
    reference and the separate kernels, which take the same fields (rope's `style`)."""
    kernel = make_kernel("persistent_decoder", name="pd", **{**TINY, "num_layers": 1, "ctas": 6, **extra})
    kind = kernel.definition
    assert ("q_norm" in {p.name for p in kind.params()}) == kind.config.qk_norm
    inputs = kind.sample_inputs(np.random.default_rng(pos), {"pos": pos})
    out = decoder_run(kernel, inputs, pos)
    check_against_reference(kernel, out, inputs, pos)
    check_against_separate_kernels(kernel, out, inputs, pos)


def test_any_grid_gives_the_same_bits():
    """1 CTA, a few CTAs (uneven shares of every phase) and the default grid: identical outputs,
    since every work item is computed the same way whichever CTA runs it."""
    inputs = base_inputs(2, "f16", seed=5)
    pos = 45
    results = {}
    for ctas in (1, 5, None):
        kernel = kernel_for(2, **({} if ctas is None else {"ctas": ctas}))
        assert kernel.definition.launch({"pos": pos}).grid[0] == (ctas or 128)
        results[ctas] = decoder_run(kernel, inputs, pos)
    check_against_reference(kernel_for(2), results[None], inputs, pos)
    for ctas in (1, 5):
        assert_same_bits(results[ctas], results[None], f" with a grid of {ctas} CTA(s) from the default grid")


def drop_grid_barrier(ptx: str, site: int) -> str:
    """The PTX with grid barrier `site`'s wait removed (the arrivals and the CTA-level bar.sync
    kept)."""
    start = ptx.index(f"// ---- grid barrier {site}: wait ----")
    tail = f"BARRIER{site}_PASSED:\n\tbar.sync 0;\n"
    end = ptx.index(tail, start) + len(tail)
    return ptx[:start] + "\tbar.sync 0;\n" + ptx[end:]


@functools.lru_cache(maxsize=None)
def planted_case():
    """12 CTAs: every phase's work splits unevenly over them (e.g. 128 down-projection tasks over
    96 warps), so CTAs leave a phase at different times."""
    kernel = kernel_for(2, ctas=12)
    inputs = base_inputs(2, "f16", seed=9)
    good = decoder_run(kernel, inputs, 9)
    check_against_reference(kernel, good, inputs, 9)
    return kernel, inputs, good


@pytest.mark.parametrize("site", range(PHASE_BARRIERS))
def test_every_grid_barrier_is_load_bearing(site):
    """Without any one of the grid barriers (the CTA barrier kept, so shared memory stays
    race-free) CTAs read x / workspaces before other CTAs wrote them: the result is wrong."""
    kernel, inputs, good = planted_case()
    pos = 9
    bad_ptx = drop_grid_barrier(kernel.ptx, site)
    assert len(re.findall(r"// ---- grid barrier \d+: wait", bad_ptx)) == PHASE_BARRIERS - 1
    try:
        bad = decoder_run(kernel, inputs, pos, bad_ptx)
    except SanitizerError:
        return  # also a detection
    err = relative_l2(bad["x"].astype(np.float64), good["x"].astype(np.float64))
    assert err > 1e-3, f"without grid barrier {site} x still matches (rel. L2 {err:.1e})"


def launch_raw(kernel, arrays, pos, ptx=None):
    """One launch on `arrays` as they are (workspaces not re-zeroed), like a replayed graph."""
    launch = kernel.definition.launch({"pos": pos})
    interpret(ptx or kernel.ptx, kernel.name, launch.grid, launch.block, kernel.args(arrays, {"pos": pos}),
              dynamic_shared=launch.dynamic_shared, kernel_name=kernel.name)


@pytest.mark.parametrize("layers", (1, 2))
def test_next_launch_needs_no_rezeroing_whatever_the_barrier_bit(layers):
    """Two decode steps (pos, pos+1) on the same workspace, the barrier word's top bit set at the
    start (what an odd number of barriers before leaves; 2 layers make 9 barriers a step, so the
    second step starts from the other bit): the second step matches the reference run from the
    first's outputs."""
    kernel = kernel_for(layers, ctas=4)
    inputs = base_inputs(layers, "f16", seed=3)
    pos = 30
    barriers = PHASE_BARRIERS * layers - 1
    arrays = prepare_arrays(kernel, dict(inputs), {"pos": pos})
    arrays["barrier"][0] = 2**31
    launch_raw(kernel, arrays, pos)
    assert arrays["barrier"][0] == barrier_word(barriers, 2**31)
    first = {name: arrays[name].copy() for name in ("x", "k_cache", "v_cache")}
    check_new_rows(kernel.definition.config, arrays, inputs, decoder_reference(inputs, kernel.definition.config, pos, stored=arrays), pos)
    nxt = {**inputs, **first}  # the second step starts from the first one's x and caches
    launch_raw(kernel, arrays, pos + 1)
    forced = decoder_reference(nxt, kernel.definition.config, pos + 1, stored=arrays)
    err = relative_l2(arrays["x"].astype(np.float64), forced["x"])
    assert err <= X_TOL, f"second launch on the same workspace: x rel. L2 error {err:.3e}"
    check_new_rows(kernel.definition.config, arrays, nxt, forced, pos + 1)
    assert arrays["barrier"][0] == barrier_word(2 * barriers, 2**31)
    assert not arrays["counters"].any()


def test_indirect_pos_reads_the_device_value_and_is_checked():
    kernel = kernel_for(1, indirect_pos=True, ctas=8)
    kind = kernel.definition
    assert [p.name for p in kind.params()][14] == "pos_ptr"
    inputs = dict(base_inputs(1, "f16", seed=4))
    inputs["pos_ptr"] = np.array([50], np.uint32)
    out = run(kernel, inputs, {})
    check_against_reference(kernel, out, inputs, 50)
    for bad in (64, 2**32 - 1):
        with pytest.raises(LaunchError, match=r"pos_ptr\[0\]: expected 0\.\.63"):
            run(kernel, {**inputs, "pos_ptr": np.array([bad], np.uint32)}, {})
    # Past the launcher (a replayed graph whose pos_ptr went bad): the kernel clamps to the
    # cache's last row; the sanitizer sees every access in bounds.
    arrays = prepare_arrays(kernel, dict(inputs), {})
    before = arrays["k_cache"].view(np.uint16).copy()  # row 50 (pos_ptr's) poisoned
    arrays["pos_ptr"][0] = 1000
    launch_raw(kernel, arrays, 0)
    changed = np.flatnonzero((arrays["k_cache"].view(np.uint16) != before).any(axis=(0, 1, 3)))
    assert list(changed) == [63], changed


def test_direct_pos_is_range_checked():
    kernel = kernel_for(1)
    inputs = base_inputs(1, "f16", seed=4)
    for bad in (64, -1, 2**32):
        with pytest.raises(LaunchError, match="pos"):
            run(kernel, dict(inputs), {"pos": bad})


# --- declarations, geometry, assembly ----------------------------------------------------------
def test_params_follow_the_contract():
    kind = kernel_for(2).definition
    names = [p.name for p in kind.params()]
    assert names[:15] == ["x", "attn_norm", "ffn_norm", "q_norm", "k_norm", "wq", "wk", "wv", "wo", "w_gate", "w_up",
                          "w_down", "k_cache", "v_cache", "pos"]
    assert all(p.role == "workspace" for p in kind.params()[15:])
    shapes = {p.name: p.shape for p in kind.params()}
    assert shapes["wq"] == (2, 512, 2 * 144) and shapes["wk"] == (2, 256, 2 * 144) and shapes["wo"] == (2, 512, 2 * 144)
    assert shapes["w_gate"] == (2, 1024, 2 * 144) and shapes["w_down"] == (2, 512, 4 * 144)
    assert shapes["k_cache"] == (2, 2, 64, 128) and kind.param("k_cache").role == "inout"
    assert kind.param("barrier").shape == (BARRIER_WORDS,) and kind.param("x").role == "inout"
    assert kind.scalar_limits() == {"pos": (0, 63)}
    assert [s["pos"] for s in kind.verify_scalars()] == [0, 1, 31, 63]


def test_grid_rule():
    # Cooperative; min(sm_count * ctas_per_sm, work): work = the widest phase's CTAs of 8 warps.
    small = kernel_for(2).definition.launch({"pos": 0})
    assert small.cooperative and small.block == (256, 1, 1) and small.grid == (128, 1, 1)  # 1024 gate/up tasks
    assert kernel_for(2, sm_count=20, ctas_per_sm=2).definition.launch({"pos": 5}).grid == (40, 1, 1)
    assert kernel_for(2, ctas=7).definition.launch({"pos": 5}).grid == (7, 1, 1)
    # 12 warps: 1024 gate/up tasks are 85 1/3 CTAs' worth; the grid rounds up, so that the widest
    # phase still takes one round (85 CTAs would leave 4 tasks for a second).
    assert kernel_for(2, warps=12).definition.launch({"pos": 0}).grid == (86, 1, 1)
    qwen = make_kernel("persistent_decoder", name="q", hidden=4096, num_heads=32, num_kv_heads=8, head_dim=128,
                               intermediate=12288, num_layers=36, max_seq_len=40960).definition
    launch = qwen.launch({"pos": 4095})
    # Shared memory: the larger of the staged int8 x of the longest row (12288: 6 steps of 2560
    # bytes) and the attention phase's.
    assert launch.grid == (132, 1, 1) and launch.dynamic_shared == max(6 * 2560, qwen.attention.shared_bytes)
    traffic = qwen.traffic({"pos": 4095})
    weights = 36 * 144 * (6144 * 16 + 4096 * 16 + 2 * 12288 * 16 + 4096 * 48)
    assert traffic.bytes == weights + 36 * 4 * (2 * 4096 + 2 * 128) + 36 * 2 * 8 * 4096 * 128 * 2 + 8 * 4096
    assert traffic.flops == 36 * 2 * (6144 * 4096 + 4096 * 4096 + 2 * 12288 * 4096 + 4096 * 12288) + 36 * 4 * 32 * 4096 * 128


@pytest.mark.parametrize("config, message", [
    (dict(hidden=500), "hidden: expected a multiple of 256"),
    (dict(hidden=128), "hidden: expected a multiple of 256 \\(wq's Q4_K rows\\), got 128"),
    (dict(intermediate=1000), "intermediate: expected a multiple of 256"),
    (dict(num_heads=3), "num_heads \\* head_dim: expected a multiple of 256"),
    (dict(num_kv_heads=3), "must divide num_heads"),
    (dict(head_dim=96, num_heads=8), "head_dim: expected one of 64, 128, 256"),
    (dict(kv_dtype="f64"), "kv_dtype"),
    (dict(max_seq_len=0), "max_seq_len"),
    (dict(l2_prefetch=5), "l2_prefetch: Input should be less than or equal to 4"),
    (dict(warps=16), "warps: Input should be 8 or 12"),
    (dict(num_heads=24, num_kv_heads=1),  # 3 head slices: key groups of 12 or 6 warps
     "num_heads / num_kv_heads: warps: a key group is 6 warps here .* 8 is no multiple of it"),
    (dict(warps=12, ctas=683), "ctas: at most 682 CTAs of 12 warps"),
])
def test_config_errors(tmp_path, config, message):
    fields = {**TINY, "num_layers": 1, **config}
    spec = tmp_path / "bad.toml"
    spec.write_text('[[kernels]]\nname = "dec"\nkind = "persistent_decoder"\n' +
                    "\n".join(f"{k} = {v!r}".replace("'", '"') for k, v in fields.items()) + "\n")
    with pytest.raises(SpecError, match=message):
        load_spec(spec)


def spec_instances():
    found = []
    for path in sorted((ROOT / "specs").glob("*.toml")):
        spec = load_spec(path).spec
        found += [(spec, k) for k in spec.kernels if k.kind == "persistent_decoder"]
    return found


def test_spec_instances_assemble_without_spills():
    instances = spec_instances()
    assert {k.name for _, k in instances} >= {"qwen3_tiny_decoder", "qwen3_8b_decoder"}
    for spec, kernel in instances:
        for arch, res in resources(kernel, spec.target.archs).items():
            assert res["spill_stores"] == res["spill_loads"] == res["local_bytes"] == res["stack_bytes"] == 0, (
                f"{kernel.name} {arch}: {res}")
            assert res["registers"] <= 255


@pytest.mark.parametrize("extra", [dict(kv_dtype="bf16", indirect_pos=True), dict(kv_dtype="f32"),
                                   dict(head_dim=64, num_heads=16, num_kv_heads=2),
                                   dict(head_dim=256, num_heads=4, num_kv_heads=1), dict(warps=12),
                                   dict(head_prep="attention"), dict(barrier_acquire=True), dict(attention_stages=3),
                                   dict(attention_stages=4),
                                   dict(poller_prefetch=True),
                                   dict(head_prep="attention", head_dim=64, num_heads=16, num_kv_heads=1)],
                         ids=lambda e: "-".join(f"{k}{v}" for k, v in e.items()))
def test_variants_assemble_without_spills(extra):
    config = make_config("persistent_decoder", name="v", **{**TINY, "num_layers": 2, **extra})
    for arch, res in resources(config, ("sm_80", "sm_90")).items():
        assert res["spill_stores"] == res["local_bytes"] == res["stack_bytes"] == 0, f"{extra} {arch}: {res}"


def test_ptx_has_the_fast_paths():
    """Performance properties (not correctness): 16-byte weight loads through the read-only path;
    activations written in this launch read through L2 (.cg), never the non-coherent path;
    one atomic per grid barrier; each GEMV phase's first weight loads issued before the barrier's
    wait that precedes it (the attention phase's wait has no loads before it)."""
    kernel = kernel_for(2)
    ptx = kernel.ptx
    assert len(re.findall(r"ld\.global\.nc\.v4\.u32", ptx)) >= 4 * 8
    assert "ld.global.cg.v4.f32" in ptx and "ld.relaxed.gpu.global.u32" in ptx
    assert ptx.count("atom.relaxed.gpu.global.add.u32") == PHASE_BARRIERS
    sites = kernel.definition.barrier_sites()
    assert len(sites) == len(re.findall(r"// ---- grid barrier \d+: wait", ptx)) == PHASE_BARRIERS
    for phase, site in sites.items():
        wait = ptx.index(f"// ---- grid barrier {site}: wait")
        # From the arrival before it (phase A's: from the layer's start) to the wait.
        since = max(ptx.rfind("// ---- grid barrier", 0, wait), ptx.index("LAYER:"))
        assert ("ld.global.nc.v4.u32" in ptx[since:wait]) == (phase != "attention"), f"weight loads before {phase}'s wait"
    assert ".maxnreg 255" in ptx and ".maxntid 256, 1, 1" in ptx


# --- weight types per layer (weight_quants): the separate step ---------------------------------
MIXED_ONE_LAYER = {"wq": ("q6_k",), "wk": ("q8_0",), "wv": ("q6_k",), "wo": ("q8_0",), "w_up": ("q6_k",),
                   "w_down": ("q8_0",)}  # w_gate stays Q4_K: the gate/up group mixes
MIXED_TWO_LAYERS = {"wv": ("q6_k", "q8_0"), "w_down": ("q6_k", "q4_k"), "wo": ("q4_k", "q8_0")}


def mixed_decoder(layers, weight_quants):
    """The kind only: a decoder with non-Q4_K weights has no fused kernel to compile."""
    return kind_of(make_config("persistent_decoder", name="pd", **TINY, num_layers=layers, weight_quants=weight_quants))


def mixed_step(kind, pos, seed):
    """The separate step of a decoder with weight_quants, run from its sample inputs (every launch
    real PTX in the interpreter): (inputs, arrays after the step)."""
    inputs = kind.sample_inputs(np.random.default_rng(seed), {"pos": pos})
    temporaries, calls = kind.separate_step({"pos": pos})
    buffers = {name: array.copy() for name, array in inputs.items()}
    buffers.update({t.name: np.full(t.shape, np.nan, np.float32) for t in temporaries})
    run_step(calls, buffers, COMPILED_OF)
    return inputs, buffers


def test_mixed_weight_types_one_layer_teacher_forced():
    """Q6_K, Q8_0 and Q4_K matrices in one layer: x within X_TOL of the float64 reference fed the
    step's own cache rows and activations (so every matrix of every type is exercised exactly),
    and the new rows within half an ulp of the reference's. A norm group whose matrices mix types
    is one fused group launch per type (q/v Q6_K and k Q8_0: two; gate Q4_K and up Q6_K: two)."""
    kind = mixed_decoder(1, MIXED_ONE_LAYER)
    assert {p.name: p.layout for p in kind.weight_params()} == {
        "wq": "q6_k", "wk": "q8_0", "wv": "q6_k", "wo": "q8_0", "w_gate": "q4_k", "w_up": "q6_k", "w_down": "q8_0"}
    groups = [(call.kernel.kind, tuple(call.kernel.matrices)) for call in kind.separate_step({"pos": 5})[1]
              if "group" in call.kernel.kind]
    assert groups == [("fused_rmsnorm_q6k_gemv_group", ("q", "v")), ("fused_rmsnorm_q8_0_gemv_group", ("k",)),
                      ("fused_rmsnorm_q4k_gemv_group", ("gate",)), ("fused_rmsnorm_q6k_gemv_group", ("up",))], groups
    pos = 5
    inputs, out = mixed_step(kind, pos, seed=3)
    forced = decoder_reference(inputs, kind.config, pos, stored=out)
    err = relative_l2(out["x"].astype(np.float64), forced["x"])
    assert err <= X_TOL, f"x vs the teacher-forced reference: {err:.3e}"
    check_new_rows(kind.config, out, inputs, forced, pos)


def test_mixed_weight_types_two_layers_free_running():
    """Each weight's layers in per-type stacks (wv: one Q6_K and one Q8_0 layer): the step against
    the free-running float64 reference within the kind's own tolerance (what verify grades)."""
    kind = mixed_decoder(2, MIXED_TWO_LAYERS)
    shapes = {p.name: p.shape for p in kind.weight_params()}
    assert shapes["wv_q6_k"][0] == shapes["wv_q8_0"][0] == 1 and shapes["wq"][0] == 2
    assert "wv" not in shapes and {"w_down_q6_k", "w_down_q4_k", "wo_q4_k", "wo_q8_0"} <= set(shapes)
    for pos in (0, 37):
        inputs, out = mixed_step(kind, pos, seed=pos)
        free = decoder_reference(inputs, kind.config, pos)
        err = relative_l2(out["x"].astype(np.float64), free["x"])
        assert err <= kind.tolerance(kind.param("x")), f"pos={pos}: x vs free-running reference {err:.3e}"


def test_weight_quants_are_checked():
    with pytest.raises(ValueError, match=r"weight_quants\.wv: expected one type a layer \(2\), got 1"):
        make_config("persistent_decoder", name="pd", **TINY, num_layers=2, weight_quants={"wv": ("q6_k",)})
    with pytest.raises(ValueError, match=r"weight_quants"):
        make_config("persistent_decoder", name="pd", **TINY, num_layers=1, weight_quants={"wx": ("q6_k",)})
    with pytest.raises(ValueError, match=r"weight_quants"):
        make_config("persistent_decoder", name="pd", **TINY, num_layers=1, weight_quants={"wv": ("q5_k",)})
    assert set(get_args(GemvQuant)) == set(GEMV_KINDS), "every GEMV kind's type may be a layer's"


# --- weight types per layer: the fused kernel ---------------------------------------------------
# Every type in every phase, in every order of q/k/v (three segments and three staged x in phase
# A), stacks whose layers are not consecutive (wv Q6_K in layers 0 and 2: index 1 in layer 2).
MIXED_THREE_LAYERS = {"wq": ("q6_k", "q4_k", "q8_0"), "wk": ("q8_0", "q8_0", "q4_k"), "wv": ("q6_k", "q4_k", "q6_k"),
                      "wo": ("q6_k", "q8_0", "q4_k"), "w_gate": ("q8_0", "q4_k", "q6_k"),
                      "w_up": ("q8_0", "q4_k", "q6_k"), "w_down": ("q4_k", "q6_k", "q6_k")}


@pytest.mark.parametrize("weight_quants, pos", [(MIXED_TWO_LAYERS, 0), (MIXED_TWO_LAYERS, 37),
                                                (MIXED_THREE_LAYERS, 1), (MIXED_THREE_LAYERS, 63)],
                         ids=("two-layers-pos0", "two-layers-pos37", "three-layers-pos1", "three-layers-pos63"))
def test_fused_kernel_multiplies_each_layers_types(weight_quants, pos):
    """The fused kernel with per-layer types: x and the new rows against the float64 reference
    (which dequantises each layer's matrix as its type: a matrix read from the wrong stack, at
    the wrong index or as the wrong type is far off), and against the free-running reference
    within the kind's tolerance; the layers pick their phase variants by index."""
    layers = len(next(iter(weight_quants.values())))
    kernel = kernel_for(layers, weight_quants=weight_quants)
    variants = kernel.definition.variants
    assert [len(variants[phase]) for phase in ("qkv", "o", "gate_up", "down")] == (
        [2, 2, 1, 2] if layers == 2 else [3, 3, 3, 2])
    if layers == 3:
        assert [s.plan.quant for s in variants["qkv"][0].segments] == ["q6_k", "q8_0", "q6_k"]
        assert variants["qkv"][0].runs == ((0, 1),) and variants["down"][1].runs == ((1, 3),)
    inputs = kernel.definition.sample_inputs(np.random.default_rng(pos), {"pos": pos})
    out = decoder_run(kernel, inputs, pos)
    check_against_reference(kernel, out, inputs, pos)


def test_fused_kernel_with_types_gives_the_same_bits_on_any_grid_and_unroll():
    """Per-layer types keep the kernel's determinism: 1 CTA, 5 CTAs and the default grid, and
    gemv_unroll 1, give the same bits; so do 5 CTAs with the phase variants' segments started by
    the polling warp after the barrier, fenceless barriers and the heads made in phase C."""
    pos = 21
    kernel = kernel_for(2, weight_quants=MIXED_TWO_LAYERS)
    inputs = kernel.definition.sample_inputs(np.random.default_rng(pos), {"pos": pos})
    out = decoder_run(kernel, inputs, pos)
    for extra in (dict(ctas=1), dict(ctas=5), dict(gemv_unroll=1),
                  dict(ctas=5, poller_prefetch=True, barrier_acquire=True, head_prep="attention")):
        other = decoder_run(kernel_for(2, weight_quants=MIXED_TWO_LAYERS, **extra), inputs, pos)
        assert_same_bits(other, out, f" with {extra}")


def test_l2_prefetch_changes_no_bits_and_stays_inside_the_weights():
    """l2_prefetch only asks L2 for lines: with Q4_K and Q6_K segments (Q6_K rows are not whole
    128-byte lines), on 1, 5 and the default grid, windows of 1 to 4 tasks give the bits of no
    prefetch, and no prefetch leaves its array (the interpreter's bounds check: the last task's
    lines end at the stack's last byte)."""
    pos = 21
    kernel = kernel_for(2, weight_quants=MIXED_TWO_LAYERS)
    inputs = kernel.definition.sample_inputs(np.random.default_rng(pos), {"pos": pos})
    out = decoder_run(kernel, inputs, pos)
    for extra in (dict(l2_prefetch=1), dict(ctas=5, l2_prefetch=4), dict(ctas=1, l2_prefetch=2)):
        other = decoder_run(kernel_for(2, weight_quants=MIXED_TWO_LAYERS, **extra), inputs, pos)
        assert_same_bits(other, out, f" with {extra}")


def test_timeline_stamps_every_barrier_in_order_and_changes_no_bits():
    """timeline = true: each CTA's row holds its start, then for every grid barrier its arrival
    and its passing, then its end, in that order (the interpreter's timers count the launch's
    instructions: one clock for every CTA), no CTA passes a barrier before the last one arrived,
    and the outputs keep the bits of the kernel without stamps (5 CTAs: uneven phases)."""
    pos, layers = 9, 2
    inputs = base_inputs(layers, "f16", seed=4)
    plain = decoder_run(kernel_for(layers, ctas=5), inputs, pos)
    kernel = kernel_for(layers, ctas=5, timeline=True)
    out = decoder_run(kernel, inputs, pos)
    assert_same_bits(out, plain, " with stamps")
    rows = out["timeline"].astype(np.int64)
    assert rows.shape == (5, kernel.definition.timeline_width) and not rows[:, 1].any(), "start's high word"
    barriers = PHASE_BARRIERS * layers - 1
    order = np.concatenate([rows[:, :1], rows[:, 3:3 + 2 * barriers], rows[:, 2:3]], axis=1)
    assert (np.diff(order, axis=1) > 0).all(), "stamps out of order"
    for b in range(barriers):
        assert rows[:, 4 + 2 * b].min() > rows[:, 3 + 2 * b].max(), f"barrier {b} passed before the last arrival"
    assert not rows[:, 3 + 2 * barriers:].any(), "words past the last barrier"


def task_lines(kind, inputs, phase: str, task: int) -> set[tuple[str, int]]:
    """(matrix, byte offset) of every 128-byte line of a GEMV phase's warp task (two rows, or
    gate row i and up row i) in a one-layer decoder's all-Q4_K weights."""
    row_bytes = {name: inputs[name].shape[-1] for name in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")}

    def span(name, row, rows):
        start = row * row_bytes[name]
        return {(name, start + line * 128) for line in range(-(-rows * row_bytes[name] // 128))}

    if phase == "gate_up":
        return span("w_gate", task, 1) | span("w_up", task, 1)
    if phase == "qkv":
        row = 2 * task
        for name, rows in (("wq", kind.q_dim), ("wk", kind.kv_dim), ("wv", kind.kv_dim)):
            if row < rows:
                return span(name, row, 2)
            row -= rows
    return span("wo" if phase == "o" else "w_down", 2 * task, 2)


@pytest.mark.parametrize("knob, window", [("l2_prefetch", 1), ("l2_prefetch", 3), ("barrier_prefetch", 1),
                                          ("barrier_prefetch", 3)])
def test_prefetch_windows_ask_for_each_later_task_once(monkeypatch, knob, window):
    """What l2_prefetch asks L2 for is exactly the weights the registers load later: every
    128-byte line of every warp task but each warp's first in a phase (those loads go out at
    once), each once, whatever the window; barrier_prefetch = P only those of each warp's P tasks
    after its first, at the phase's start, and nothing during the phase (3 CTAs: 24 warps, 2 to
    21 tasks each, so a window covers all of some phases and part of others). Neither changes a
    bit of the outputs."""
    kernel = kernel_for(1, ctas=3, **{knob: window})
    kind = kernel.definition
    inputs = base_inputs(1, "f16", seed=3)
    seen = prefetched_lines(monkeypatch, lambda: decoder_run(kernel, inputs, 5))
    assert len(seen) == len(set(seen)), "a line asked for twice"
    warps = 3 * 8
    last = (lambda tasks: tasks) if knob == "l2_prefetch" else (lambda tasks: min(tasks, (window + 1) * warps))
    expected = set().union(*(task_lines(kind, inputs, phase, task) for phase, tasks in kind.tasks().items()
                             for task in range(warps, last(tasks))))     # never a warp's first task
    assert set(seen) == expected
    monkeypatch.undo()
    out, plain = (decoder_run(k, inputs, 5) for k in (kernel, kernel_for(1, ctas=3)))
    assert_same_bits(out, plain)


def test_poller_prefetch_sends_the_polling_warps_first_tasks_to_l2_once_and_changes_no_bits(monkeypatch):
    """poller_prefetch: warp 0 of each CTA (its thread 0 polls the grid barrier) asks L2 for
    exactly the lines of its first task of every GEMV phase (3 CTAs: global warps 0, 8, 16), each
    once, and loads them after the barrier; no other warp prefetches, and the outputs keep every
    bit (one layer here; two layers and mixed weight types below)."""
    kernel = kernel_for(1, ctas=3, poller_prefetch=True)
    kind = kernel.definition
    inputs = base_inputs(1, "f16", seed=3)
    seen = prefetched_lines(monkeypatch, lambda: decoder_run(kernel, inputs, 5))
    assert len(seen) == len(set(seen)), "a line asked for twice"
    assert set(seen) == set().union(*(task_lines(kind, inputs, phase, task) for phase in kind.tasks()
                                      for task in (0, 8, 16)))
    monkeypatch.undo()
    out, plain = (decoder_run(k, inputs, 5) for k in (kernel, kernel_for(1, ctas=3)))
    assert_same_bits(out, plain)


@pytest.mark.parametrize("layers, pos, extra", [
    (2, 37, dict(ctas=3, kv_prefetch_keys=5)),
    (1, 300, dict(max_seq_len=512, sm_count=8, kv_dtype="f32", kv_prefetch_keys=100)),
], ids=("two_items_a_cta", "more_lines_than_threads"))
def test_kv_prefetch_asks_for_each_attention_items_first_keys_once_and_changes_no_bits(monkeypatch, layers, pos,
                                                                                      extra):
    """kv_prefetch_keys = N asks L2 for exactly the K and V lines of the first N keys of every
    attention item, each once, in every layer (3 CTAs over 4 items: one CTA runs two; f32 rows of
    4 lines, 80-key items: more lines than a CTA's threads), inside the caches (the recording
    prefetch's bounds check), and the outputs keep the bits of the kernel without it."""
    def decoder(**changed):
        return make_kernel("persistent_decoder", name="pd", **{**TINY, **extra, **changed}, num_layers=layers)

    kernel = decoder()
    kind = kernel.definition
    inputs = kind.sample_inputs(np.random.default_rng(pos), {"pos": pos})
    plain = decoder_run(decoder(kv_prefetch_keys=0), inputs, pos)
    seen = prefetched_lines(monkeypatch, lambda: decoder_run(kernel, inputs, pos))
    assert len(seen) == len(set(seen)), "a line asked for twice"
    config = kind.config
    row = config.head_dim * inputs["k_cache"].itemsize
    chunk, splits = kind.attention.split(pos + 1)
    expected = set()
    for layer in range(layers):
        for head in range(config.num_kv_heads):
            for split in range(splits):
                keys = min(config.kv_prefetch_keys, chunk, pos + 1 - split * chunk)
                first = ((layer * config.num_kv_heads + head) * config.max_seq_len + split * chunk) * row
                expected.update((cache, first + line * 128) for cache in ("k_cache", "v_cache")
                                for line in range(keys * row // 128))
    assert set(seen) == expected
    assert len(expected) == layers * kind.kv_prefetch_bytes(pos) // 128, "kv_prefetch_bytes, the model's count"
    out = decoder_run(kernel, inputs, pos)
    assert_same_bits(out, plain)


@pytest.mark.parametrize("layers, pos, extra", [
    (2, 63, {}),  # an item a CTA
    (2, 37, dict(ctas=3)),  # several items a CTA, the split holding pos among them
    (1, 37, dict(rope_style="interleaved", qk_norm=False)),  # a GGUF llama layer: rope alone
    (1, 39, dict(head_dim=64, num_heads=16, num_kv_heads=1, kv_dtype="bf16", max_seq_len=40)),  # 16 q heads: 2 a warp
    (1, 0, dict(head_dim=256, num_heads=2, num_kv_heads=1, kv_dtype="f32")),  # 4 rope pairs a lane, f32 cache
    (1, 290, dict(max_seq_len=320, sm_count=4, attention_stages=3)),  # 5-tile chunks, pos's tile past the prologue
], ids=("item-a-cta", "items-a-cta", "llama", "group16-bf16", "hd256-f32", "long-chunks"))
def test_head_prep_in_attention_gives_the_same_bits(layers, pos, extra):
    """head_prep = "attention" runs the same norm and rope (the same macros on the same f32 rows)
    in phase C instead of phase A: x and both caches keep every bit of the count-in kernel's, it
    meets the reference, and it leaves no counter behind."""
    def decoder(head_prep):
        return make_kernel("persistent_decoder", name="pd", **{**TINY, **extra}, num_layers=layers, head_prep=head_prep)

    kernel = decoder("attention")
    kind = kernel.definition
    assert kind.params()[[p.name for p in kind.params()].index("counters")].shape == (kind.config.num_kv_heads,)
    inputs = kind.sample_inputs(np.random.default_rng(pos), {"pos": pos})
    out = decoder_run(kernel, inputs, pos)
    check_against_reference(kernel, out, inputs, pos)
    plain = decoder_run(decoder("count_in"), inputs, pos)
    assert_same_bits(out, plain)


@pytest.mark.parametrize("barrier, finding", [
    ("C_K_MADE:\n\tbar.sync 0;\n", "global-memory race: reads k_cache"),  # k's row before the ring reads it
    ("C_Q0_MADE:\n\n\tbar.sync 0;\n", "which no thread of this CTA has written"),  # q before its fragments
], ids=("k-row", "q-heads"))
def test_head_prep_in_attention_barriers_are_load_bearing(barrier, finding):
    """Without the CTA barrier after warp 0 writes k's row at pos, the ring's cp.async reads it
    unordered; without the one after the q heads are stored, lanes read shared q no one wrote yet:
    the sanitizer names each."""
    kernel = kernel_for(1, ctas=3, head_prep="attention")
    ptx = kernel.variant("sm_80").ptx
    assert ptx.count(barrier) == 1
    inputs = kernel.definition.sample_inputs(np.random.default_rng(37), {"pos": 37})
    with pytest.raises(SanitizerError, match=re.escape(finding)):
        decoder_run(kernel, inputs, 37, ptx=ptx.replace(barrier, barrier[:barrier.index("\tbar.sync")]))


def test_head_prep_in_attention_keeps_q_heads_past_the_attention_scratch():
    """The q heads (f32[group, head_dim] at q_smem_offset) lie past all of attn_split's scratch,
    16-byte aligned and inside the launch's dynamic shared memory, at every buildable head_dim,
    warps, cache dtype, ring depth and group up to 64. No run tells an overlap with the scratch's
    last bytes from none (the last ring stage's row padding, the last merge row's (m, l) or the
    score exchange's last slot: none is live from q's store to its load), so the layout is
    checked as intervals."""
    ends = set()
    for head_dim, warps, kv_dtype, stages, group in itertools.product(
            HEAD_DIMS, (8, 12), ("f16", "bf16", "f32"), (None, 1, 2, 3, 4), (1, 2, 3, 4, 8, 16, 32, 64)):
        kind = kind_of(make_config("persistent_decoder", name="v", hidden=256, intermediate=256, num_layers=1,
                                   max_seq_len=64, num_heads=4 * group, num_kv_heads=4, head_dim=head_dim,
                                   kv_dtype=kv_dtype, warps=warps, attention_stages=stages, head_prep="attention"))
        if kind.unbuildable():
            continue
        plan, q = kind.attention, kind.q_smem_offset
        q_end = q + 4 * group * head_dim
        where = f"head_dim {head_dim}, {warps} warps, {kv_dtype}, stages {plan.stages}, group {group}"
        assert q % 16 == 0 and plan.shared_bytes <= q, f"{where}: q heads at {q}, scratch [0, {plan.shared_bytes})"
        assert q_end <= kind.dynamic_shared, f"{where}: q heads end at {q_end} > {kind.dynamic_shared} bytes"
        ends.add("exchange" if plan.exchange_bytes else "ring" if plan.ring_bytes >= plan.merge_bytes else "merge")
    assert ends == {"ring", "merge", "exchange"}, f"the scratch's last bytes were only ever {ends}"


# Every schedule knob that keeps the default's arithmetic, at once.
ALL_KNOBS = dict(head_prep="attention", barrier_acquire=True, poller_prefetch=True, attention_stages=3,
                 kv_prefetch_keys=16, barrier_prefetch=1)


@pytest.mark.parametrize("layers, pos, extra", [
    (2, 33, dict(indirect_pos=True)),
    (2, 17, dict(num_heads=2, num_kv_heads=2)),  # a group of one q head
    (2, 12, dict(timeline=True, ctas=3)),
    (1, 300, dict(max_seq_len=320, sm_count=4, kv_dtype="bf16")),  # 5-tile chunks
    (2, 40, dict(rope_style="interleaved", qk_norm=False, ctas=2, head_dim=64, num_heads=8, warps=12)),
], ids=("indirect-pos", "mha", "timeline", "long-chunks-bf16", "llama-hd64-12warps"))
def test_the_schedule_knobs_together_give_the_defaults_bits(layers, pos, extra):
    """head_prep, barrier_acquire, poller_prefetch, a 3-stage ring and both L2 prefetches at
    once change when things are loaded, never a result: x and both caches keep the default
    kernel's bits, across pos in memory, MHA, the timeline's stamps, long chunks and llama's
    layer at 12 warps."""
    config = {**TINY, **extra}
    kernel = make_kernel("persistent_decoder", name="pd", **config, num_layers=layers, **ALL_KNOBS)
    inputs = kernel.definition.sample_inputs(np.random.default_rng(pos), {"pos": pos})
    out = decoder_run(kernel, inputs, pos)
    plain = decoder_run(make_kernel("persistent_decoder", name="pd", **config, num_layers=layers), inputs, pos)
    assert_same_bits(out, plain)


@pytest.mark.parametrize("stages", (1, 3, 4))
def test_attention_stages_change_when_tiles_are_requested_not_the_bits(stages):
    """attention_stages = 1 (a tile in flight alone), 3 or 4 (two or three ahead of the one in
    use) against the default 2, on chunks of 5 ring tiles (160 keys of 291 over 2 splits): the
    same bits, and the reference met."""
    config = dict(TINY, max_seq_len=320, sm_count=4)
    pos = 290
    kernel = make_kernel("persistent_decoder", name="pd", **config, num_layers=1, attention_stages=stages)
    kind = kernel.definition
    assert kind.attention.stages == stages and kind.attention.split(pos + 1) == (160, 2)
    inputs = kind.sample_inputs(np.random.default_rng(pos), {"pos": pos})
    out = decoder_run(kernel, inputs, pos)
    check_against_reference(kernel, out, inputs, pos)
    plain = decoder_run(make_kernel("persistent_decoder", name="pd", **config, num_layers=1), inputs, pos)
    assert_same_bits(out, plain)


@pytest.mark.parametrize("ctas", (1, 5, None))
def test_barrier_acquire_gives_the_same_bits_on_any_grid(ctas):
    """barrier_acquire = true orders the grid barrier with an acq_rel add and acquire polls, no
    fence: the same work in the same order, so every bit of x, the caches and the barrier word
    is the fenced barrier's."""
    inputs = base_inputs(2, "f16", seed=5)
    grid = {} if ctas is None else {"ctas": ctas}
    out = decoder_run(kernel_for(2, barrier_acquire=True, **grid), inputs, 45)
    check_against_reference(kernel_for(2, barrier_acquire=True, **grid), out, inputs, 45)
    plain = decoder_run(kernel_for(2, **grid), inputs, 45)
    assert_same_bits(out, plain, names=("x", "k_cache", "v_cache", "barrier"))


@pytest.mark.parametrize("acquire, weaker", [
    ("ld.acquire.gpu.global.u32 %bar_t", "ld.relaxed.gpu.global.u32 %bar_t"),  # a poll that acquires nothing
    ("atom.acq_rel.gpu.global.add.u32 %bar_old", "atom.relaxed.gpu.global.add.u32 %bar_old"),  # releases nothing
    ("atom.acq_rel.gpu.global.add.u32 %bar_old", "atom.release.gpu.global.add.u32 %bar_old"),  # the last arriver
], ids=("relaxed-poll", "relaxed-add", "release-add"))
def test_barrier_acquire_needs_each_of_its_orderings(acquire, weaker):
    """Each weakening of barrier_acquire's ordering lets a CTA read another's writes unordered
    (12 CTAs leave phases at different times), and the interpreter's memory-ordering model says
    so: a release-only add leaves the last arriver, which never polls, without an acquire."""
    kernel = kernel_for(2, ctas=12, barrier_acquire=True)
    ptx = kernel.variant("sm_80").ptx
    assert ptx.count(acquire) == PHASE_BARRIERS
    with pytest.raises(SanitizerError, match="global-memory race"):
        decoder_run(kernel, base_inputs(2, "f16", seed=9), 9, ptx=ptx.replace(acquire, weaker))


def test_the_warp_that_completes_a_head_passes_lane_0s_acquire_to_its_lanes():
    """count_in head prep: lane 0 alone acquires the head's other rows (its fence after the
    count), then every lane reads them; without the bar.warp.sync between, lanes 1-31 read them
    unordered (an acquire orders its own thread's reads only), and the sanitizer says so."""
    kernel = kernel_for(1, ctas=3)
    ptx = kernel.variant("sm_80").ptx
    acquire = "\t@%lane0 fence.acq_rel.gpu;\n\tbar.warp.sync 0xffffffff;\n"
    assert ptx.count(acquire) == 1
    with pytest.raises(SanitizerError, match=r"global-memory race: reads qkv\[\d+\].*another thread of this CTA "
                                             r"acquired a release of it, but not this thread"):
        decoder_run(kernel, base_inputs(1, "f16", seed=9), 9,
                    ptx=ptx.replace(acquire, "\t@%lane0 fence.acq_rel.gpu;\n"))


def test_gate_and_up_of_different_types_have_no_fused_kernel():
    """A gate row and its up row are one warp task (SwiGLU is its epilogue): they must share a
    type in each layer. The separate step still runs such a model."""
    with pytest.raises(PtxgenError, match=r"pd: weight_quants: w_gate and w_up differ in layer\(s\) 0; the fused "
                                          r"persistent_decoder computes a gate row and its up row in one warp task"):
        make_kernel("persistent_decoder", name="pd", **TINY, num_layers=1, weight_quants=MIXED_ONE_LAYER)


QWEN3_8B = dict(hidden=4096, num_heads=32, num_kv_heads=8, head_dim=128, intermediate=12288, num_layers=36,
                max_seq_len=40960)


def q4_k_m_layers(layers: int) -> tuple[str, ...]:
    """attn_v / ffn_down as llama.cpp's Q4_K_M stores them (ptxgen.generate.more_bits)."""
    return tuple("q6_k" if more_bits(layer, layers) else "q4_k" for layer in range(layers))


@pytest.mark.parametrize("weight_quants", [
    {"wv": q4_k_m_layers(36), "w_down": q4_k_m_layers(36)},
    {weight: ("q8_0",) * 36 for weight in get_args(WeightName)},
    {weight: ("q6_k",) * 36 for weight in get_args(WeightName)},
], ids=("q4_k_m", "q8_0", "q6_k"))
def test_real_file_layouts_of_qwen3_8b_assemble_without_spills(weight_quants):
    """The type layouts real files have, at Qwen3-8B's shapes, on every arch (MAX_UNROLL)."""
    config = make_config("persistent_decoder", name="pd", **QWEN3_8B, weight_quants=weight_quants)
    for arch, res in resources(config).items():
        assert res["spill_stores"] == res["spill_loads"] == res["local_bytes"] == res["stack_bytes"] == 0, (
            f"{arch}: {res}")
def test_weight_quants_in_a_spec_file(tmp_path):
    """TOML gives lists: the types validate as the kind's tuples; a spec entry whose gate and up
    types differ (no fused kernel) is refused by validate (and build) in one line, before
    anything is written."""
    entry = "\n".join(f"{key} = {value}" for key, value in {**TINY, "num_layers": 2}.items())
    spec = tmp_path / "d.toml"
    spec.write_text(f'[[kernels]]\nname = "pd"\nkind = "persistent_decoder"\n{entry}\n'
                    'weight_quants = { wv = ["q6_k", "q8_0"] }\n')
    assert load_spec(spec).spec.kernels[0].weight_quants == {"wv": ("q6_k", "q8_0")}
    assert run_cli("validate", str(spec)).returncode == 0
    spec.write_text(spec.read_text().replace('wv = ["q6_k", "q8_0"]', 'w_up = ["q4_k", "q8_0"]'))
    for command in (["validate", str(spec)], ["build", str(spec), "-o", str(tmp_path / "out")]):
        result = run_cli(*command)
        assert result.returncode == 2 and result.stderr.strip().splitlines() == [
            f"error: {spec}: kernel 'pd' (kernels[0]): weight_quants: w_gate and w_up differ in layer(s) 1; the fused "
            "persistent_decoder computes a gate row and its up row in one warp task, so they need one type a layer "
            "(run this model's layers as separate kernels: ptxgen generate --separate)"]
    assert not (tmp_path / "out").exists()
