"""q4k_gemv and fused_rmsnorm_q4k_gemv: the real PTX in the interpreter (sanitizer on) against
float64 references built from gguf's own Q4_K dequantisation; geometry, specs, assembly, GGUF."""

from __future__ import annotations

import functools
import re

import gguf
import numpy as np
import pytest

from ptxgen import q4k
from ptxgen.errors import PtxgenError, SpecError
from ptxgen.runner import run
from ptxgen.spec import load_spec
from ptxgen.verify import relative_l2

from helpers import ROOT, make_config, make_kernel, resources, run_cli

KINDS = ("q4k_gemv", "fused_rmsnorm_q4k_gemv")
EPS = 1e-6
F32_EPS = 2.0**-24

# Relative L2 error of y against float64 over a whole output of n >= 3 rows. Each row is an f32
# dot product of k terms: per-lane chains of 16 fmas per half sub-block plus a few terms per
# block, then a 5-level shuffle tree, so a row's error is a few ulps of sum|w_i a_i|, while
# random signs make |y| far smaller than that sum (by ~sqrt(k), more for unlucky rows).
# Measured over every shape and geometry below: at most 2.6e-6 (k = 256, n = 5), typically
# 6e-7..1.3e-6; the tolerance is the f32 default of ptxgen (base.TOLERANCE). With n < 3 the L2
# is one or two dot products and measures their cancellation more than the kernel (a single
# row reached 1.2e-5), so those rely on the per-element bound below.
REL_L2_TOL = 1e-5
# Every element, whatever its cancellation: |y - ref| <= DOT_ULPS * 2^-24 * sum_i |w_i a_i|,
# the classic dot-product error bound with the sum of magnitudes as the scale. Measured max
# 4.3 (k = 256, where a lane's 16-term chains carry most of each row); it covers coding the
# 4-bit q as 1 + q/16 (about 2 bits lost in a half sub-block's dot before sum(x) is taken
# off) and, fused, rsqrt.approx's 2^-22.9 relative error.
DOT_ULPS = 24


@functools.lru_cache(maxsize=None)
def weights(n: int, k: int) -> np.ndarray:
    """Quantised Gaussian rows, deterministic per shape (shared by both kinds; read-only)."""
    w = q4k.random_weights(np.random.default_rng(1000 * n + k // 256), n, k)
    w.setflags(write=False)
    return w


def dequant64(w: np.ndarray) -> np.ndarray:
    """Ground truth: gguf's Q4_K dequantisation, widened to float64."""
    return gguf.quants.dequantize(w, gguf.GGMLQuantizationType.Q4_K).astype(np.float64)


def inputs_for(kind: str, n: int, k: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(k) + 0.25
    x[x == 0] = 0.5  # non-zero
    arrays = {"w": np.array(weights(n, k)), "x": x.astype(np.float32)}
    if kind == "fused_rmsnorm_q4k_gemv":
        arrays["gamma"] = (1.0 + 0.25 * rng.standard_normal(k)).astype(np.float32)
    return arrays


def activations64(kind: str, arrays: dict[str, np.ndarray]) -> np.ndarray:
    """What W multiplies, per KERNELS.md, in float64."""
    x = arrays["x"].astype(np.float64)
    if kind == "q4k_gemv":
        return x
    return x / np.sqrt(np.mean(x * x) + EPS) * arrays["gamma"].astype(np.float64)


def check_against_reference(kernel, arrays: dict[str, np.ndarray]) -> None:
    kind = kernel.kind
    n, k = kernel.config["n"], kernel.config["k"]
    result = run(kernel, arrays, {})  # outputs start NaN-poisoned, sanitizer on
    y = result["y"]
    assert y.shape == (n,) and y.dtype == np.float32
    np.testing.assert_array_equal(result["x"], arrays["x"], err_msg="x must only be read")
    unwritten = np.flatnonzero(~np.isfinite(y))
    assert unwritten.size == 0, f"{kind} n={n} k={k}: rows {unwritten[:10]} never written (still NaN)"
    w64 = dequant64(arrays["w"])
    a64 = activations64(kind, arrays)
    ref = w64 @ a64
    bound = DOT_ULPS * F32_EPS * (np.abs(w64) @ np.abs(a64))
    err = np.abs(y.astype(np.float64) - ref)
    worst = int(np.argmax(err / bound))
    assert (err <= bound).all(), (
        f"{kind} n={n} k={k}: row {worst} off by {err[worst]:.3e} = {err[worst] / bound[worst] * DOT_ULPS:.1f} "
        f"ulps of sum|w a| (allowed {DOT_ULPS}); y={y[worst]!r}, reference {ref[worst]!r}")
    if n >= 3:
        rel = relative_l2(y.astype(np.float64), ref)
        assert rel <= REL_L2_TOL, f"{kind} n={n} k={k}: relative L2 error {rel:.3e} > {REL_L2_TOL:.0e}"


# Every k multiple of 256 the issue names (Qwen3/Llama down projections are 12288 and 14336),
# with n = 1, a few odd n and 64: partial steps (k = 256, 768), the unrolled loop, clamped rows.
SHAPES = [(n, k) for k in (256, 768, 4096, 12288, 16384) for n in (1, 3, 5, 33, 64)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n, k", SHAPES)
def test_matches_float64_reference(kind, n, k):
    kernel = make_kernel(kind, n=n, k=k)
    check_against_reference(kernel, inputs_for(kind, n, k, seed=n + k))


# Geometry knobs and the code paths they select: k = 1280 has 5 blocks (no full loop trip, a
# partial second step), 3840 one trip then a tail of 2 steps with 3 of 4 blocks, 4352 two
# trips and a 1-block tail; two rows a warp with odd n (the last warp recomputes clamped rows
# and stores only its own); n = 2049 takes the large-n default (2 rows a warp, 8 warps, 129
# CTAs, the last nearly empty); warps=8 with n=40 leaves most warps past the end and a partial
# last staging round (3 units a thread); warps=1, rows_per_warp 1..4, unroll 1..4.
GEOMETRIES = [
    dict(n=7, k=1280), dict(n=9, k=3840, unroll=1), dict(n=9, k=3840, rows_per_warp=2),
    dict(n=6, k=4352, unroll=3), dict(n=33, k=4096, rows_per_warp=2), dict(n=5, k=12288, rows_per_warp=2, warps=4),
    dict(n=3, k=16384, rows_per_warp=2), dict(n=1, k=768, rows_per_warp=2), dict(n=2049, k=512),
    dict(n=40, k=12288, warps=8), dict(n=5, k=2048, warps=1, rows_per_warp=4),
    dict(n=11, k=4352, rows_per_warp=3, warps=2), dict(n=2, k=768, unroll=4), dict(n=100, k=512, warps=16),
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("config", GEOMETRIES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_geometries(kind, config):
    kernel = make_kernel(kind, **config)
    check_against_reference(kernel, inputs_for(kind, config["n"], config["k"], seed=7))


def test_fused_rms_factor_is_of_x_not_of_gamma_or_rows():
    """Scaling x by 1000 must not change y (RMSNorm is scale-free); scaling gamma does."""
    kernel = make_kernel("fused_rmsnorm_q4k_gemv", n=5, k=512)
    arrays = inputs_for(kernel.kind, 5, 512, seed=3)
    base = run(kernel, arrays, {})["y"].astype(np.float64)
    scaled = run(kernel, {**arrays, "x": arrays["x"] * np.float32(1000)}, {})["y"].astype(np.float64)
    assert relative_l2(scaled, base) < 1e-5, "y must not depend on the scale of x"
    doubled = run(kernel, {**arrays, "gamma": arrays["gamma"] * np.float32(2)}, {})["y"].astype(np.float64)
    assert relative_l2(doubled, 2 * base) < 1e-6


def test_kind_reference_is_the_contract_formula():
    for kind_name in KINDS:
        kernel = make_kernel(kind_name, n=3, k=512, eps=0.5) if kind_name != "q4k_gemv" else make_kernel(kind_name, n=3, k=512)
        kind = kernel.definition
        arrays = kind.sample_inputs(np.random.default_rng(0), {})
        assert set(arrays) == {p.name for p in kind.params() if p.role == "in"}
        assert all(np.all(a != 0) for name, a in arrays.items() if name != "w"), "sample inputs must be non-zero"
        x = arrays["x"].astype(np.float64)
        a = x if kind_name == "q4k_gemv" else x / np.sqrt(np.mean(x * x) + 0.5) * arrays["gamma"]
        np.testing.assert_allclose(kind.reference(arrays, {})["y"], dequant64(arrays["w"]) @ a, rtol=1e-12)


def test_traffic_and_launch():
    plain = make_kernel("q4k_gemv", n=4096, k=12288).definition
    fused = make_kernel("fused_rmsnorm_q4k_gemv", n=4096, k=12288).definition
    weight_bytes = 4096 * 48 * 144
    assert plain.traffic({}).bytes == weight_bytes + 4 * 12288 + 4 * 4096
    assert fused.traffic({}).bytes == weight_bytes + 8 * 12288 + 4 * 4096
    assert plain.traffic({}).flops == fused.traffic({}).flops == 2 * 4096 * 12288
    assert plain.scalar_limits() == {} == fused.scalar_limits()
    launch = plain.launch({})
    assert launch.grid == (256, 1, 1) and launch.block == (256, 1, 1)  # 16 rows per CTA
    assert launch.dynamic_shared == 4 * 12288 + 4 * 12288 // 16
    # Below 2048 rows a warp takes one row (4 steps of loads in flight): 8 rows per CTA.
    small = make_kernel("q4k_gemv", n=1024, k=4096).definition.launch({})
    assert small.grid == (128, 1, 1) and small.block == (256, 1, 1)
    assert make_kernel("q4k_gemv", n=1, k=4096).definition.launch({}).block == (32, 1, 1)


@pytest.mark.parametrize("config, field, message", [
    (dict(n=4, k=300), "k", "expected a multiple of 256 (Q4_K block) of at least 256, got 300"),
    (dict(n=4, k=128), "k", "got 128"),
    (dict(n=4, k=0), "k", "got 0"),
    (dict(n=0, k=256), "n", "greater than or equal to 1"),
    (dict(n=4, k=256, rows_per_warp=4, unroll=2), "unroll", "rows_per_warp * unroll <= 4"),
    (dict(n=4, k=256, warps=17), "warps", "less than or equal to 16"),
])
@pytest.mark.parametrize("kind", KINDS)
def test_spec_errors_name_the_field(tmp_path, kind, config, field, message):
    spec = tmp_path / "bad.toml"
    fields = "\n".join(f"{key} = {value}" for key, value in config.items())
    spec.write_text(f'[[kernels]]\nname = "proj"\nkind = "{kind}"\n{fields}\n')
    with pytest.raises(SpecError) as error:
        load_spec(spec)
    text = str(error.value)
    assert f"kernel 'proj' (kernels[0]): {field}: " in text and message in text, text


def test_shared_memory_is_checked_per_arch(tmp_path):
    # k = 32768 stages 136 KB of x: fine on sm_80/sm_90, too much for sm_86.
    spec = tmp_path / "big.toml"
    spec.write_text('[target]\narchs = ["sm_80", "sm_86"]\n[[kernels]]\nname = "p"\nkind = "q4k_gemv"\nn = 8\nk = 32768\n')
    with pytest.raises(SpecError, match=r"needs 139264 bytes of shared memory, sm_86 allows 101376"):
        load_spec(spec)
    spec.write_text('[target]\narchs = ["sm_80", "sm_90"]\n[[kernels]]\nname = "p"\nkind = "q4k_gemv"\nn = 8\nk = 32768\n')
    load_spec(spec)


# Default geometry over the shapes that select different code paths, plus the spec's instances.
ASSEMBLY_SHAPES = [(1, 256), (33, 768), (1, 4096), (1024, 4096), (4096, 4096), (4096, 4352), (12288, 4096),
                   (4096, 12288), (4096, 14336), (64, 16384)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n, k", ASSEMBLY_SHAPES)
def test_assembles_for_every_arch_without_spills(kind, n, k):
    for arch, used in resources(make_config(kind, n=n, k=k)).items():
        assert used["spill_stores"] == 0 and used["spill_loads"] == 0, f"{kind} n={n} k={k} {arch}: spills {used}"
        assert used["local_bytes"] == 0 and used["stack_bytes"] == 0, f"{kind} n={n} k={k} {arch}: {used}"
        assert used["registers"] <= 128, f"{kind} n={n} k={k} {arch}: {used['registers']} registers"


def test_spec_instances():
    """The Qwen3-8B projections of the issue, plain and with the preceding norm fused."""
    spec = load_spec(ROOT / "specs" / "qwen3.toml").spec
    shapes = {kernel.name: (kernel.kind, kernel.n, kernel.k) for kernel in spec.kernels if kernel.kind in KINDS}
    assert shapes["qwen3_8b_q_proj"] == ("q4k_gemv", 4096, 4096)
    assert shapes["qwen3_8b_kv_proj"] == ("q4k_gemv", 1024, 4096)
    assert shapes["qwen3_8b_o_proj"] == ("q4k_gemv", 4096, 4096)
    assert shapes["qwen3_8b_gate_up_proj"] == ("q4k_gemv", 12288, 4096)
    assert shapes["qwen3_8b_down_proj"] == ("q4k_gemv", 4096, 12288)
    assert shapes["qwen3_8b_attn_norm_q_proj"] == ("fused_rmsnorm_q4k_gemv", 4096, 4096)
    assert shapes["qwen3_8b_ffn_norm_gate_up_proj"] == ("fused_rmsnorm_q4k_gemv", 12288, 4096)
    # (their assembly for every arch, spill-free, is tests/test_build.py's; the same shapes are
    # in ASSEMBLY_SHAPES above)


# --- performance properties of the PTX (in addition to the correctness tests above) --------
@pytest.mark.parametrize("kind", KINDS)
def test_weights_are_read_in_16_byte_vectors_with_loads_in_flight(kind):
    ptx = make_kernel(kind, n=4096, k=4096).ptx
    weight_loads = re.findall(r"\n\s*(?:@\S+\s+)?(ld\.\S+)[^\n]*\[%w[qh]\+", ptx)
    assert weight_loads and set(weight_loads) == {"ld.global.nc.v4.u32"}, set(weight_loads)
    # The loads of a trip (2 steps x 2 rows x {quants, header}) are issued back to back, before use.
    assert re.search(r"(\n\s*ld\.global\.nc\.v4\.u32[^\n]*\[%w[qh]\+[^\n]*){8}", ptx), "expected 8 loads in a row"
    body = ptx[ptx.index("MAIN:"):ptx.index("MAIN_DONE:")]
    assert not re.search(r"\b(div|rem)\.", body), "no division in the inner loop"
    assert "ld.shared.v4.f32" in body, "x comes from shared memory"
    assert "shfl.sync.bfly" in ptx[ptx.index("MAIN_DONE:"):], "rows are reduced with shuffles"
    assert re.findall(r"st\.global\S*\s+\[(%\w+)", ptx) == ["%y"] * 2, "only y is written"


def test_fused_norm_is_computed_once_per_cta():
    ptx = make_kernel("fused_rmsnorm_q4k_gemv", n=4096, k=4096).ptx
    assert ptx.count("rsqrt.approx.f32") == 1
    main = ptx[ptx.index("MAIN:"):]
    assert "rsqrt" not in main and "%sum_sq" not in main, "the RMS factor must not be recomputed per row"


# --- GGUF ---------------------------------------------------------------------------------
@pytest.fixture
def gguf_file(tmp_path):
    """A tiny GGUF with a Q4_K tensor from our quantiser (3 rows of 512) and an F32 tensor."""
    path = tmp_path / "tiny.gguf"
    w = weights(3, 512)
    writer = gguf.GGUFWriter(str(path), "qwen3")
    writer.add_tensor("blk.0.attn_q.weight", np.array(w), raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    writer.add_tensor("blk.0.attn_norm.weight", np.linspace(0.5, 1.5, 512, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, w


def test_load_gguf_tensor_round_trip(gguf_file):
    path, w = gguf_file
    loaded = q4k.load_gguf_tensor(path, "blk.0.attn_q.weight", 3, 512)
    assert loaded.dtype == np.uint8 and loaded.shape == (3, 288) and loaded.flags.owndata
    np.testing.assert_array_equal(loaded, w)
    # and the kernel on it, against gguf's dequantisation of the same bytes
    kernel = make_kernel("q4k_gemv", n=3, k=512)
    check_against_reference(kernel, {**inputs_for("q4k_gemv", 3, 512, seed=1), "w": loaded})


@pytest.mark.parametrize("name, n, k, message", [
    ("blk.0.missing", 3, 512, r"no tensor named 'blk\.0\.missing' \(tensors: blk\.0\.attn_norm\.weight, blk\.0\.attn_q\.weight\)"),
    ("blk.0.attn_norm.weight", 1, 512, r"tensor 'blk\.0\.attn_norm\.weight' is F32, expected Q4_K"),
    ("blk.0.attn_q.weight", 4, 512, r"has shape \[3, 512\] \(rows, weights per row\), expected \[4, 512\]"),
    ("blk.0.attn_q.weight", 3, 256, r"has shape \[3, 512\] .*expected \[3, 256\]"),
    ("blk.0.attn_q.weight", 3, 300, r"multiple of 256, got k=300"),
])
def test_load_gguf_tensor_errors(gguf_file, name, n, k, message):
    path, _ = gguf_file
    with pytest.raises(PtxgenError, match=message):
        q4k.load_gguf_tensor(path, name, n, k)


def test_load_gguf_file_errors(tmp_path):
    with pytest.raises(PtxgenError, match=r"missing\.gguf: cannot read GGUF file"):
        q4k.load_gguf_tensor(tmp_path / "missing.gguf", "w", 3, 512)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all" * 4)
    with pytest.raises(PtxgenError, match=r"junk\.gguf: not a readable GGUF file"):
        q4k.load_gguf_tensor(junk, "w", 3, 512)


def test_cli_run_takes_weights_from_gguf(tmp_path, gguf_file):
    path, w = gguf_file
    spec = tmp_path / "spec.toml"
    spec.write_text('[[kernels]]\nname = "q_proj"\nkind = "q4k_gemv"\nn = 3\nk = 512\n')
    arrays = inputs_for("q4k_gemv", 3, 512, seed=2)
    np.savez(tmp_path / "in.npz", x=arrays["x"])
    result = run_cli("run", "q_proj", "--spec", str(spec), "--inputs", str(tmp_path / "in.npz"),
                     "--outputs", str(tmp_path / "out.npz"), "--backend", "emulator",
                     "--gguf", str(path), "--tensor", "blk.0.attn_q.weight")
    assert result.returncode == 0, result.stderr
    with np.load(tmp_path / "out.npz") as saved:
        np.testing.assert_array_equal(saved["w"], w)
        ref = dequant64(w) @ arrays["x"].astype(np.float64)
        assert relative_l2(saved["y"].astype(np.float64), ref) < REL_L2_TOL
    bad = run_cli("run", "q_proj", "--spec", str(spec), "--inputs", str(tmp_path / "in.npz"),
                  "--outputs", str(tmp_path / "bad.npz"), "--backend", "emulator",
                  "--gguf", str(path), "--tensor", "blk.0.attn_norm.weight")
    assert bad.returncode == 2 and "is F32, expected Q4_K" in bad.stderr and "Traceback" not in bad.stderr
