"""The Q6_K and Q8_0 GEMV kinds (q6k_gemv, q8_0_gemv: the quantised GEMV family's skeleton with
their own loads and block dot products): the real PTX in the interpreter (sanitizer on, outputs
NaN-poisoned) against float64 references built from gguf-py's dequantisation and the kernels'
int8 quantisation of x, every element within the kind's derived error bound; bugs planted in the
PTX are caught; spec errors; assembly without spills; the performance model's figures."""

from __future__ import annotations

import re

import gguf
import numpy as np
import pytest
from fixtures.make_tiny_gguf import rewrite_gguf, write_tiny_gguf

from ptxgen import perf
from ptxgen.errors import SpecError
from ptxgen.quants import GEMV_KINDS
from ptxgen.gguf_model import GGUFModel
from ptxgen.interp import launch as interpret
from ptxgen.kernels import kind_of
from ptxgen.kernels.families.quant_gemv import dequantize_x, quantize_x
from ptxgen.model_reference import generate as reference_generate
from ptxgen.pipeline import compile_kernel
from ptxgen.quants import QUANT_TYPES
from ptxgen.runner import prepare_arrays, run
from ptxgen.spec import load_spec
from ptxgen.verify import compare

from helpers import ROOT, make_config, make_kernel, prefetched_lines, resources, run_cli_in_process, with_ptx

QUANT = {"q6k_gemv": "q6_k", "q8_0_gemv": "q8_0"}
KINDS = tuple(QUANT)


def inputs_for(kind: str, n: int, k: int, seed: int) -> dict[str, np.ndarray]:
    """Quantised Gaussian rows (ptxgen's Q6_K quantiser, gguf-py's Q8_0) and non-zero x."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(k) + 0.25
    x[x == 0] = 0.5
    return {"w": QUANT_TYPES[QUANT[kind]].random_weights(rng, n, k), "x": x.astype(np.float32)}


def contract_reference(kind: str, arrays) -> np.ndarray:
    """y = dequant(w) @ xq in float64, dequant(w) by gguf-py, xq the kernels' int8 x."""
    ggml = gguf.GGMLQuantizationType[QUANT[kind].upper()]
    return gguf.quants.dequantize(arrays["w"], ggml).astype(np.float64) @ dequantize_x(arrays["x"])


def check(kernel, arrays) -> dict[str, np.ndarray]:
    """Run (outputs NaN-poisoned, sanitizer on); every row written, within the kind's per-element
    error bound of the contract's float64 reference and its relative L2 tolerance."""
    kind, (n, k) = kernel.kind, (kernel.config["n"], kernel.config["k"])
    result = run(kernel, arrays, {})
    y, ref = result["y"], contract_reference(kind, arrays)
    np.testing.assert_array_equal(result["x"], arrays["x"], err_msg="x must only be read")
    assert np.isfinite(y).all(), f"{kind} n={n} k={k}: rows {np.flatnonzero(~np.isfinite(y))[:10]} never written"
    definition = kernel.definition
    bound = definition.error_bound(definition.param("y"), arrays, ref, {})
    err = np.abs(y.astype(np.float64) - ref)
    worst = int(np.argmax(err / bound))
    assert (err <= bound).all(), (f"{kind} n={n} k={k}: row {worst} off by {err[worst]:.3e}, "
                                  f"{err[worst] / bound[worst]:.2f} of its bound; y={y[worst]!r}, ref {ref[worst]!r}")
    checks = compare(kernel, result, {"y": ref}, {})
    assert checks and all(c.passed for c in checks), [c.failure for c in checks]
    return result


# k at the type's minimum (Q6_K: one block; Q8_0: a lane's two blocks), a partial step, whole steps
# and several with split-K; n = 1, odd, a partial last CTA or unit.
SHAPES = {
    "q6k_gemv": [(1, 256), (5, 768), (37, 4096 + 3 * 256), (3, 4096), (9, 12288), (64, 16384)],
    "q8_0_gemv": [(1, 64), (5, 192), (37, 2048 + 5 * 64), (3, 4096), (9, 12288), (64, 16384)],
}
CASES = [(kind, n, k) for kind, shapes in SHAPES.items() for n, k in shapes]


@pytest.mark.parametrize("schedule", ["static", "queue"])
@pytest.mark.parametrize("kind, n, k", CASES)
def test_matches_float64_reference(kind, n, k, schedule):
    kernel = make_kernel(kind, n=n, k=k, schedule=schedule, sm_count=2)
    assert kernel.definition.plan.queue == (schedule == "queue")
    check(kernel, inputs_for(kind, n, k, seed=n + k))


# The tuning fields' code paths: split-K with a partial last part, several rows a warp (clamped
# last group, a loop of trips), two register slots, a small CTA with several staging rounds,
# queued units of two rows and two parts.
GEOMETRIES = [
    dict(n=11, k=4352, split_k=3, warps=3), dict(n=33, k=4096, rows_per_warp=3), dict(n=9, k=2304, unroll=2),
    dict(n=7, k=6144, warps=2, rows_per_warp=2, split_k=1), dict(n=20, k=1280, rows_per_warp=4, unroll=2),
    dict(n=50, k=4096, schedule="queue", rows_per_warp=2, split_k=2, warps=4, sm_count=3),
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("config", GEOMETRIES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_geometries(kind, config):
    check(make_kernel(kind, **config), inputs_for(kind, config["n"], config["k"], seed=3))


@pytest.mark.parametrize("kind", KINDS)
def test_queue_is_right_on_any_grid_and_leaves_its_counter_at_zero(kind):
    kernel = make_kernel(kind, n=150, k=1280, schedule="queue", warps=4, sm_count=1)
    launch = kernel.launch({})
    assert launch.any_grid and kernel.definition.plan.units > launch.grid[0]
    arrays = prepare_arrays(kernel, inputs_for(kind, 150, 1280, seed=4), {})
    first = check(kernel, arrays)["y"]
    for grid in (1, 3, 25):
        interpret(kernel.ptx, kernel.name, (grid, 1, 1), launch.block, kernel.args(arrays, {}),
                  dynamic_shared=launch.dynamic_shared, seed=grid)
        assert not arrays["queue"].any(), f"grid {grid}: the queue workspace is left at {arrays['queue']}"
        np.testing.assert_array_equal(arrays["y"].view(np.uint32), first.view(np.uint32), err_msg=f"grid {grid}")


@pytest.mark.parametrize("kind", KINDS)
def test_sample_weights_dequantise_to_gguf(kind):
    """The kind's own test data are GGUF blocks: ptxgen's dequantiser equals gguf-py's bit for bit,
    and the rows hold the type's block layout (Q6_K scales and d, Q8_0 d, all finite)."""
    definition = make_kernel(kind, n=6, k=512).definition
    w = definition.sample_inputs(np.random.default_rng(9), {})["w"]
    quant = QUANT_TYPES[QUANT[kind]]
    assert w.shape == definition.param("w").shape == (6, quant.row_bytes(512)) and w.dtype == np.uint8
    ours = quant.dequantize(w, 512)
    theirs = gguf.quants.dequantize(w, quant.ggml_type)
    np.testing.assert_array_equal(ours.view(np.uint32), theirs.astype(np.float32).view(np.uint32))
    assert np.isfinite(ours).all() and np.count_nonzero(ours) > ours.size // 2


# --- planted bugs: each must fail the same checks the clean PTX passes -------------------------------
PLANTED = {
    # Q6_K's q - 32 offset with the wrong sign: the staged -32 * sum(x codes) made +32 * sum.
    "q6_k-offset-sign": ("q6k_gemv", r"0xE0E0E0E0", "0x20202020"),
    # Q6_K's scales of pieces 1 and 2 swapped (sc[is + 2] for sc[is + 4]).
    "q6_k-scale-index": ("q6k_gemv", r"(mul\.lo\.s32 %idot, %idot, %sc)1;", r"\g<1>2;"),
    # Q6_K's 2-byte realignment dropped (the selector of every prmt left at bytes 0-3).
    "q6_k-alignment": ("q6k_gemv", r"mad\.lo\.u32 %sel, %t, 0x1111, 0x3210;", "mov.u32 %sel, 0x3210;"),
    # Q8_0's second block scaled by the first block's d.
    "q8_0-d-of-block": ("q8_0_gemv", r"mov\.b32 \{ %other16, %d16 \}, %q(\d+);", r"mov.b32 { %d16, %other16 }, %q0;"),
    # Q8_0's first block read without its 2-byte shift.
    "q8_0-code-offset": ("q8_0_gemv", r"0x5432;", "0x3210;"),
}


@pytest.mark.parametrize("bug", PLANTED)
def test_planted_bug_is_caught(bug):
    kind, pattern, replacement = PLANTED[bug]
    kernel = make_kernel(kind, n=9, k=2048 + 256)
    arrays = inputs_for(kind, 9, 2048 + 256, seed=5)
    check(kernel, arrays)
    planted_ptx, found = re.subn(pattern, replacement, kernel.ptx)
    assert found, f"{bug}: the pattern is not in the PTX"
    planted = with_ptx(kernel, planted_ptx)
    result = run(planted, arrays, {})
    checks = compare(planted, result, {"y": contract_reference(kind, arrays)}, {})
    assert not all(c.passed for c in checks), f"{bug}: the planted bug passes"


@pytest.mark.parametrize("kind", ["q4k_gemv", "q6k_gemv", "q8_0_gemv", "fused_rmsnorm_q4k_gemv"])
def test_one_row_is_graded_against_its_terms_not_its_cancelled_sum(kind):
    """One output row: |y| can fall far below its terms (a 1-row Q4_K GEMV at k=256 was 52x over
    the tolerance against |y|, 1% of its per-element bound). The relative L2 error is measured
    against the root-sum-square of y's terms (Kind.error_scale), which the rounded partial sums
    follow: those rows pass, and an error of 3 tolerances on that scale still fails."""
    from ptxgen.verify import verify_kernel

    kernel = make_kernel(kind, n=1, k=256)
    for seed in range(4):
        checks = verify_kernel(kernel, {}, seed=seed)
        assert checks and all(c.passed for c in checks), [c.failure for c in checks]
    definition = kernel.definition
    inputs = definition.sample_inputs(np.random.default_rng(0), {})
    arrays = prepare_arrays(kernel, inputs, {})
    reference = definition.reference(inputs, {})
    scale = definition.error_scale(kernel.param("y"), arrays, reference["y"], {})
    off = {**arrays, "y": (reference["y"] + 3 * definition.tolerance(kernel.param("y")) * scale).astype(np.float32)}
    (graded,) = compare(kernel, off, reference, {})
    assert graded.failure.startswith("rel. L2 error"), graded


# --- spec errors ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kind, k, message", [
    ("q6k_gemv", 300, "multiple of 256 (Q6_K block) of at least 256, got 300"),
    ("q6k_gemv", 128, "multiple of 256 (Q6_K block) of at least 256, got 128"),
    ("q8_0_gemv", 96, "multiple of 64 (2 Q8_0 blocks: a lane's part of a row) of at least 64, got 96"),
    ("q8_0_gemv", 32, "multiple of 64 (2 Q8_0 blocks: a lane's part of a row) of at least 64, got 32"),
    ("q8_0_gemv", 2 * 65536, "at most 65536"),
])
def test_k_not_whole_blocks_is_one_spec_error(tmp_path, kind, k, message):
    spec = tmp_path / "spec.toml"
    spec.write_text(f'[[kernels]]\nname = "lm_head"\nkind = "{kind}"\nn = 1000\nk = {k}\n')
    with pytest.raises(SpecError, match=re.escape(message)) as caught:
        load_spec(spec)
    assert "lm_head" in str(caught.value) and "k" in str(caught.value)


# --- assembly and the performance model -------------------------------------------------------------
# Llama/Qwen shapes in these types: projections, the down projections (Qwen2-7B's: 3584 x 18944,
# a partial last step and x staged in two rounds, queued), its gate/up (18944 x 3584), lm_heads
# (Qwen3-8B: 151936 x 4096, Qwen3-14B: x 5120).
ASSEMBLY_SHAPES = [(1, 256), (33, 768), (1024, 4096), (4096, 4096), (12288, 4096), (4096, 12288), (4096, 14336),
                   (64, 16384), (3584, 18944), (18944, 3584), (8192, 28672), (151936, 4096), (151936, 5120)]


@pytest.mark.parametrize("kind, n, k", [(kind, n, k) for kind in KINDS for n, k in ASSEMBLY_SHAPES])
def test_assembles_for_every_arch_without_spills(kind, n, k):
    for arch, figures in resources(make_config(kind, n=n, k=k)).items():
        assert figures["spill_stores"] == figures["spill_loads"] == figures["local_bytes"] == 0, (
            f"{kind} n={n} k={k} {arch}: spills {figures}")
        assert figures["registers"] <= 64, f"{kind} n={n} k={k} {arch}: {figures['registers']} registers"


# Thread instructions a byte that the model counts at 4096 x 4096 on sm_90 (the kinds' docstrings;
# Q4_K: 3.3), with a 3% margin: a regression guard, not a speed claim.
INSTRUCTIONS_PER_BYTE = {"q6k_gemv": 4.3, "q8_0_gemv": 2.2}


@pytest.mark.parametrize("kind", KINDS)
def test_traffic_and_the_performance_model(kind):
    """Bytes: the weights once (the type's row bytes), x, y; the model counts the real PTX."""
    n, k = 4096, 4096
    kernel = compile_kernel(make_config(kind, n=n, k=k), ("sm_90",))
    traffic = kernel.definition.traffic({})
    assert traffic.bytes == n * QUANT_TYPES[QUANT[kind]].row_bytes(k) + 4 * k + 4 * n and traffic.flops == 2 * n * k
    report = perf.evaluate_kernel(kernel, perf.gpu_named("h100-sxm"))
    assert report["bytes"] == traffic.bytes and report["occupancy"]["sm_90"] >= 0.5, report["occupancy"]
    per_byte = report["thread_instructions_per_byte"]
    assert 0 < per_byte <= INSTRUCTIONS_PER_BYTE[kind], per_byte
    assert report["bytes_in_flight"]["per_thread"] >= 68, report["bytes_in_flight"]


@pytest.mark.parametrize("kind", KINDS)
def test_weights_are_read_in_16_byte_vectors_and_multiplied_with_dp4a(kind):
    """A lane-item's weights: Q6_K six 16-byte loads (its ql and qh pieces' windows) and 5 scalar
    ones (scales, d); Q8_0 four 16-byte loads and 1-4 words. No other global loads but x's."""
    ptx = make_kernel(kind, n=4096, k=4096).ptx
    loads = re.findall(r"\n\s*(?:@\S+\s+)?(ld\.global\S*)", ptx)
    vectors, items = loads.count("ld.global.nc.v4.u32"), ptx.count("// Weights of item")
    if kind == "q6k_gemv":
        assert vectors == 6 * items and loads.count("ld.global.nc.s8") == 4 * items, loads
        assert loads.count("ld.global.nc.b16") == items
    else:
        assert vectors == 4 * items and loads.count("ld.global.nc.u32") == 4 * items, loads
    body = ptx[ptx.index("// Row 0"):]
    assert body.count("dp4a.") == 16 * body.count("// Row "), "16 dp4a per 64 weights"
    assert re.findall(r"st\.global\S*\s+\[(%\w+)", ptx) == ["%off"], "only y is written, once"


# --- models whose lm_head is Q6_K (a Q4_K_M file's output.weight) or Q8_0 ------------------------------
@pytest.mark.parametrize("quant", ["q6_k", "q8_0"])
def test_model_with_such_an_lm_head_gets_a_spec_that_builds_verifies_and_generates(tmp_path, quant):
    """The tiny Qwen3 fixture, its layers Q4_K and its output.weight of the type: `spec from-gguf`
    gives the lm_head this type's GEMV, and the spec builds and verifies; `generate` in the
    interpreter picks the same tokens as the float64 reference model with the kernels' int8 x."""
    base = write_tiny_gguf(tmp_path / "q4k.gguf", quant="q4_k")
    head = GGUFModel(base).config.lm_head
    weights = QUANT_TYPES[quant].random_weights(np.random.default_rng(8), head.rows, head.k, 2 * head.k ** -0.5)
    model = rewrite_gguf(base, tmp_path / "model.gguf", drop_tensors=("output.weight",),
                         add_tensors=(("output.weight", weights, QUANT_TYPES[quant].ggml_type),))
    assert GGUFModel(model).config.lm_head.quant == quant
    spec = tmp_path / "model.toml"
    assert run_cli_in_process("spec", "from-gguf", str(model), "--max-seq-len", "16", "-o", str(spec)).returncode == 0
    heads = [k for k in load_spec(spec).spec.kernels
             if k.kind == GEMV_KINDS[quant] and (k.n, k.k) == (head.rows, head.k)]
    assert len(heads) == 1, [k.kind for k in load_spec(spec).spec.kernels]
    built = run_cli_in_process("build", str(spec), "-o", str(tmp_path / "out"), "--arch", "sm_90", "-q")
    assert built.returncode == 0, built.stderr
    verified = run_cli_in_process("verify", str(spec), "--kernel", heads[0].name)
    assert verified.returncode == 0 and "FAIL" not in verified.stdout, verified.stdout + verified.stderr
    generated = run_cli_in_process("generate", str(model), "--tokens", "5,999,17", "--max-new", "3",
                                   "--backend", "emulator")
    assert generated.returncode == 0, generated.stderr
    tokens = [int(t) for t in generated.stdout.strip().split(",")]
    assert tokens == reference_generate(GGUFModel(model), [5, 999, 17], 3, "f16", True).tokens


def test_spec_instances():
    """specs/qwen3.toml: Qwen3-8B's lm_head as a Q4_K_M file stores it (Q6_K) and a Q8_0 gate|up."""
    kernels = {kernel.name: kernel for kernel in load_spec(ROOT / "specs" / "qwen3.toml").spec.kernels}
    shapes = {name: (k.kind, k.n, k.k) for name, k in kernels.items() if k.kind in KINDS}
    assert shapes == {"qwen3_8b_lm_head": ("q6k_gemv", 151936, 4096),
                      "qwen3_8b_gate_up_proj_q8_0": ("q8_0_gemv", 12288, 4096)}
    # `ptxgen verify` runs both at their full shape (the lm_head's 622M weights included:
    # tests/test_verify_specs.py does, about 2 minutes a launch).
    assert kind_of(kernels["qwen3_8b_lm_head"]).verify_scalars() == [{}]
    assert kind_of(kernels["qwen3_8b_gate_up_proj_q8_0"]).verify_scalars() == [{}]


# --- the Q4_K kinds' derived tolerance and bounds ------------------------------------------------------
@pytest.mark.parametrize("kind, config", [
    ("q4k_gemv", dict(n=37, k=4352, split_k=3, warps=6)),
    ("q4k_gemv", dict(n=150, k=1280, schedule="queue", warps=4, sm_count=1)),
    ("fused_rmsnorm_q4k_gemv", dict(n=33, k=12288)),
    ("q4k_gemv_group", dict(k=1280, matrices={"q": 33, "k": 9}, schedule="queue", warps=4, sm_count=2)),
    ("fused_rmsnorm_q4k_gemv_group", dict(k=768, matrices={"gate": 40, "up": 40}, rows_per_warp=3)),
], ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}{v}" for k, v in v.items() if k != "matrices"))
def test_q4k_kinds_meet_their_derived_bounds(kind, config):
    """verify's checks with the kinds' own tolerance and per-element bound (gamma of the rounding
    depth, times the terms' magnitudes: q4k_gemv's error analysis; the fused kinds add the RMS
    factor's error) on sampled inputs, every output."""
    kernel = make_kernel(kind, **config)
    definition = kernel.definition
    arrays = definition.sample_inputs(np.random.default_rng(6), {})
    checks = compare(kernel, run(kernel, arrays, {}), definition.reference(arrays, {}), {})
    assert len(checks) == len(definition.matrices) and all(c.passed for c in checks), [c.failure for c in checks]
    u = 2.0**-24
    depth = definition.plan.output_roundings
    assert depth * u < definition.tolerance(definition.param(checks[0].param)) < 2 * depth * u + 1e-6


def test_cli_run_takes_a_q6k_weight_from_gguf(tmp_path):
    """`ptxgen run --gguf` loads the one quantised weight of any type: the Q4_K_M-like fixture's
    blk.0.attn_v (Q6_K, 256 x 256) into a q6k_gemv, checked against the kind's reference and bound."""
    model_path = write_tiny_gguf(tmp_path / "m.gguf")
    packed = GGUFModel(model_path).tensor_bytes("blk.0.attn_v.weight")
    spec = tmp_path / "spec.toml"
    spec.write_text('[[kernels]]\nname = "v_proj"\nkind = "q6k_gemv"\nn = 256\nk = 256\n')
    x = np.random.default_rng(3).standard_normal(256).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    result = run_cli_in_process("run", "v_proj", "--spec", str(spec), "--inputs", str(tmp_path / "in.npz"),
                                "--outputs", str(tmp_path / "out.npz"), "--backend", "emulator",
                                "--gguf", str(model_path), "--tensor", "blk.0.attn_v.weight")
    assert result.returncode == 0, result.stderr
    with np.load(tmp_path / "out.npz") as saved:
        arrays = {name: saved[name] for name in saved.files}
    np.testing.assert_array_equal(arrays["w"], packed)
    definition = make_kernel("q6k_gemv", n=256, k=256).definition
    ref = definition.reference(arrays, {})["y"]
    bound = definition.error_bound(definition.param("y"), arrays, ref, {})
    assert (np.abs(arrays["y"].astype(np.float64) - ref) <= bound).all()
    wrong = run_cli_in_process("run", "v_proj", "--spec", str(spec), "--inputs", str(tmp_path / "in.npz"),
                               "--outputs", str(tmp_path / "bad.npz"), "--backend", "emulator",
                               "--gguf", str(model_path), "--tensor", "blk.0.attn_q.weight")
    assert wrong.returncode == 2 and "is Q4_K, expected Q6_K" in wrong.stderr


@pytest.mark.parametrize("kind, fields", [
    ("q4k_gemv", dict(n=301, k=2304)),                                   # static; a 1-row last unit
    ("q4k_gemv", dict(n=700, k=512, schedule="queue", sm_count=3)),      # queue: each CTA's first unit
    ("q6k_gemv", dict(n=100, k=512)),                                    # 420-byte rows: lines shared by units
    ("fused_rmsnorm_q4k_gemv_group", dict(k=512, matrices={"q": 64, "k": 32})),   # a unit per matrix
], ids=("static", "queue", "q6k", "fused_group"))
def test_prefetch_rows_asks_for_each_ctas_rows_and_changes_no_bits(monkeypatch, kind, fields):
    """prefetch_rows asks L2 for every 128-byte line of each CTA's rows (its first unit's with the
    queue), once a CTA (a line two units share, twice), inside the weights; on the portable PTX
    and on the PDL one (the requests before griddepcontrol.wait, which the sanitizer's PDL check
    allows for a prefetch) the outputs keep the bits of the kernel without it."""
    archs = ("sm_80", "sm_90")
    kernel = compile_kernel(make_config(kind, name="kern", pdl=True, prefetch_rows=True, **fields), archs, until="ptx")
    plain = compile_kernel(make_config(kind, name="kern", pdl=True, **fields), archs, until="ptx")
    definition = kernel.definition
    plan = definition.plan
    inputs = definition.sample_inputs(np.random.default_rng(5), {})
    seen = prefetched_lines(monkeypatch, lambda: run(kernel, inputs, {}, arch="sm_90"))
    expected = []
    units = [(name, n, unit) for (name, n), count in zip(definition.matrices.items(), plan.matrix_units)
             for unit in range(count)]
    for name, n, unit in units[:plan.ctas]:
        first = unit * plan.rows_per_cta * plan.row_bytes
        last = min(n, (unit + 1) * plan.rows_per_cta) * plan.row_bytes - 1
        expected += [(f"w{name}", max(first, line * 128)) for line in range(first // 128, last // 128 + 1)]
    assert sorted(seen) == sorted(expected)
    monkeypatch.undo()
    for arch in archs:
        ours, theirs = (run(k, inputs, {}, arch=arch) for k in (kernel, plain))
        for param in kernel.params:
            if param.written:
                assert np.array_equal(ours[param.name].view(np.uint8), theirs[param.name].view(np.uint8)), arch


def knife_edge_x(rng, groups: int) -> tuple[np.ndarray, np.ndarray]:
    """x of `groups` groups of 32 with max|v| = b (random, 2^-20..2^20) where two elements v sit on a
    rounding edge of q = rint(v * inv), inv = f32(127 / b): v * inv lies below a half-integer and
    v * next_f32_above(inv) above it (and one the other way round for the f32 below inv). Their q is
    that of quantize_x only if the kernel's inv is the IEEE quotient itself, not an ulp off.
    Returns x and the indices of the edge elements."""
    f32 = np.float32
    x = np.empty(32 * groups, f32)
    edges = []
    for g in range(groups):
        found = {}
        while len(found) < 2:
            found = {}
            b = f32(np.exp2(rng.uniform(-20, 20)))
            inv = f32(127) / b
            above, below = np.nextafter(inv, f32(np.inf)), np.nextafter(inv, f32(0))
            for n in rng.permutation(np.arange(2, 126)):
                v = f32((n + 0.5) / float(inv))
                for cand in (np.nextafter(v, f32(0)), v, np.nextafter(v, f32(np.inf))):
                    p, p_above, p_below = (float(cand) * float(i) for i in (inv, above, below))  # exact
                    if p < n + 0.5 < p_above:
                        found.setdefault("above", cand)
                    if p_below < n + 0.5 < p:
                        found.setdefault("below", cand)
                if len(found) == 2:
                    break
        values = (rng.uniform(-0.9, 0.9, 32) * b).astype(f32)
        values[0] = b * rng.choice([-1, 1])
        values[1] = found["above"] * rng.choice([-1, 1])
        values[2] = found["below"] * rng.choice([-1, 1])
        order = rng.permutation(32)
        x[32 * g:32 * g + 32] = values[order]
        where = np.argsort(order)
        edges += [32 * g + int(where[1]), 32 * g + int(where[2])]
    return x, np.array(edges)


@pytest.mark.parametrize("schedule", ["static", "queue"])
def test_staged_x_is_quantize_x_bit_for_bit_on_the_rounding_edges_of_the_reciprocal(schedule):
    """q8_stage's inv = 127 / max|v| must be the IEEE quotient (quantize_x's contract), not within
    an ulp of it: on random data an ulp off flips a q only where v * inv lies within ~1e-5 of a
    half-integer, which the other tests' inputs almost never hit (dropping the residual correction,
    inv = f32(127 * y1), passed every one of them). Here x puts two elements of every group on such
    an edge, and one-hot Q8_0 rows (d = 1, one code 1) read y[r] = dx * q of one edge element each:
    one rounding of an exact product (the other lanes and blocks add exact zeros), so y is
    f32(q * dx) bit for bit, and a flipped q is off by dx."""
    k = 4096
    x, cols = knife_edge_x(np.random.default_rng(7), k // 32)
    w = np.zeros((len(cols), k // 32, 34), np.uint8)
    one = np.array([1.0], np.float16).view(np.uint8)
    for r, c in enumerate(cols):
        w[r, c // 32, 0:2] = one
        w[r, c // 32, 2 + c % 32] = 1
    kernel = make_kernel("q8_0_gemv", n=len(cols), k=k, schedule=schedule, sm_count=2)
    arrays = {"w": w.reshape(len(cols), -1), "x": x}
    y = check(kernel, arrays)["y"]
    q, dx = quantize_x(x)
    expected = q[cols].astype(np.float32) * dx[cols // 32]
    wrong = np.flatnonzero(y.view(np.uint32) != expected.view(np.uint32))
    assert wrong.size == 0, (f"{wrong.size} of {len(cols)} edge elements quantised unlike quantize_x, e.g. "
                             f"x[{cols[wrong[0]]}] = {x[cols[wrong[0]]]!r}: y = {y[wrong[0]]!r}, "
                             f"expected {expected[wrong[0]]!r}")


@pytest.mark.parametrize("kind, k", [("q4k_gemv", 512), ("q6k_gemv", 512), ("q8_0_gemv", 512)])
def test_a_group_of_x_holding_a_nan_or_an_inf_contributes_nothing(kind, k):
    """quantize_x: a group of 32 whose max|x| is not a normal number (inf, NaN) is all zeros with
    dx = 0, so y is bit for bit y of x with that group zeroed (plain max.f32 dropped a NaN: its
    group was quantised from its other values; found at edge inputs)."""
    kernel = make_kernel(kind, n=8, k=k)
    inputs = kernel.definition.sample_inputs(np.random.default_rng(4), {})
    bad, zeroed = inputs["x"].copy(), inputs["x"].copy()
    bad[5], bad[70] = np.nan, -np.inf
    zeroed[0:32] = zeroed[64:96] = 0
    got = run(kernel, {**inputs, "x": bad}, {})["y"]
    expected = run(kernel, {**inputs, "x": zeroed}, {})["y"]
    assert np.isfinite(expected).all()
    np.testing.assert_array_equal(got, expected)
