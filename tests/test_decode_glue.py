"""residual_add and kv_append (the decode-step glue between the other kinds): the real PTX in the
interpreter (sanitizer on) against float64 / ptxgen.dtypes, element by element and bit for bit.

residual_add's x is read and written ("inout"), so it is not poisoned: every element is checked
bit-exactly against the f32 sum, which an unwritten element would not equal (y != 0). kv_append's
caches are "inout" too: row pos starts NaN (the runner poisons what Kind.rewritten names, so a
row left unwritten fails), the new rows must be the exact from_float bits and every other byte of
both caches must be unchanged (verify.compare checks those too).
"""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from ptxgen.dtypes import from_float
from ptxgen.errors import LaunchError
from ptxgen.interp import launch as interpret
from ptxgen.kernels import KINDS
from ptxgen.kernels.families.elementwise import MAX_N
from ptxgen.runner import prepare_arrays, run
from ptxgen.spec import load_spec
from ptxgen.verify import compare

from helpers import SPECS, assert_passes, make_config, make_kernel, resources, run_cli, spec_kernel

KV_DTYPES = ("f32", "f16", "bf16")


def test_registry_has_both_kinds_and_no_kind_for_the_shared_module():
    assert {"residual_add", "kv_append", "swiglu"} <= set(KINDS)
    assert "elementwise" not in KINDS


# --- residual_add ------------------------------------------------------------------------------
# 1, 3 (tail only), 4 (one vector), 5, 127, 1000, 4099 (vectors + tail, partial CTAs), 70001 (many
# CTAs), 4 * (2^18 + 1) + 3 (4 vectors a thread, guarded, tail), 4 * (2^18 + 1024) (4 a thread, exact).
RESIDUAL_SIZES = (1, 3, 4, 5, 127, 1000, 4099, 70001, 4 * (2**18 + 1) + 3, 4 * (2**18 + 1024))


def assert_sum_exact(x, y, result, what):
    with np.errstate(over="ignore", invalid="ignore"):  # inf and inf - inf are among the cases
        expected = x + y  # numpy's f32 add: IEEE round to nearest even, as add.rn.f32
    same = (result.view(np.uint32) == expected.view(np.uint32)) | (np.isnan(result) & np.isnan(expected))
    if not same.all():
        i = int(np.argmin(same))
        raise AssertionError(f"{what}: x[{i}] = {result[i]!r}, expected {x[i]!r} + {y[i]!r} = {expected[i]!r} "
                             f"({np.count_nonzero(~same)} elements differ)")


@pytest.mark.parametrize("n", RESIDUAL_SIZES)
def test_residual_add_matches_float64_and_the_f32_sum(n):
    kernel = make_kernel("residual_add", n=n)
    kind = kernel.definition
    inputs = kind.sample_inputs(np.random.default_rng(n), {})
    assert np.all(inputs["y"] != 0)
    arrays = run(kernel, inputs, {})
    assert_passes(compare(kernel, arrays, kind.reference(inputs, {}), {}))
    assert_sum_exact(inputs["x"], inputs["y"], arrays["x"], f"residual_add n={n}")
    assert np.array_equal(arrays["y"], inputs["y"]), "y must not change"


def test_residual_add_edge_values():
    """Subnormals (no flush to zero), overflow to inf, cancellation to +0, inf - inf = NaN."""
    tiny = np.float32(1e-45)
    pairs = [(1.0, 2.0**-24), (1.0, 3 * 2.0**-24), (3e38, 3e38), (-3e38, -3e38), (1.5, -1.5), (-0.0, -0.0),
             (tiny, tiny), (1e-38, -9e-39), (np.inf, 1.0), (np.inf, -np.inf), (2.0**-126, -(2.0**-127)),
             (16777216.0, 1.0), (16777216.0, 3.0)]
    x = np.array([a for a, _ in pairs], np.float32)
    y = np.array([b for _, b in pairs], np.float32)
    for n in (len(pairs), 8):  # vectors + a 1-element tail, and two vectors only
        kernel = make_kernel("residual_add", n=n)
        result = run(kernel, {"x": x[:n], "y": y[:n]}, {})["x"]
        assert_sum_exact(x[:n], y[:n], result, f"residual_add edge values, n={n}")


def test_residual_add_reference_and_traffic_are_the_contract():
    kind = make_kernel("residual_add", n=3).definition
    x, y = np.array([1.0, -2.5, 3.0], np.float32), np.array([0.5, 2.5, 1e-8], np.float32)
    np.testing.assert_array_equal(kind.reference({"x": x, "y": y}, {})["x"], [1.5, 0.0, 3.0 + 1e-8])
    assert [(p.name, p.dtype, p.role) for p in kind.params()] == [("x", "f32", "inout"), ("y", "f32", "in")]
    traffic = kind.traffic({})
    assert (traffic.bytes, traffic.flops) == (36, 3)


def test_residual_add_rejects_bad_sizes_and_inputs():
    for n in (0, -1, MAX_N + 1):
        with pytest.raises(ValidationError):
            make_kernel("residual_add", n=n)
    kernel = make_kernel("residual_add", n=8)
    with pytest.raises(LaunchError, match="'y'"):
        run(kernel, {"x": np.ones(8, np.float32), "y": np.ones(8, np.float64)}, {})


# --- kv_append ---------------------------------------------------------------------------------
def positions(max_seq_len):
    return sorted({0, 1, max_seq_len // 2, max_seq_len - 1})


def expected_caches(kind, inputs, pos):
    """The input caches with row pos replaced by from_float of k / v: the exact expected bytes."""
    out = {}
    for name in ("k", "v"):
        cache = inputs[f"{name}_cache"].copy()
        with np.errstate(over="ignore"):  # f16 overflow to inf is the expected rounding
            cache[:, pos] = from_float(inputs[name], kind.config.kv_dtype)
        out[f"{name}_cache"] = cache
    return out


def assert_caches_exact(kind, inputs, arrays, pos, what):
    for name, expected in expected_caches(kind, inputs, pos).items():
        got = arrays[name]
        rows = np.ones(got.shape[1], bool)
        rows[pos] = False
        assert np.array_equal(got[:, rows].view(np.uint8), expected[:, rows].view(np.uint8)), \
            f"{what}: {name} rows other than {pos} changed"
        new, want = got[:, pos].view(np.uint8), expected[:, pos].view(np.uint8)
        if not np.array_equal(new, want):
            g, d = np.argwhere((got[:, pos] != expected[:, pos]) | np.isnan(got[:, pos].astype(np.float64)))[0]
            raise AssertionError(f"{what}: {name}[{g}, {pos}, {d}] = {got[g, pos, d]!r}, expected "
                                 f"{expected[g, pos, d]!r} (from {inputs[name[0]][g, d]!r})")


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("head_dim", (64, 128, 40, 7))
@pytest.mark.parametrize("num_kv_heads", (1, 3, 8))
def test_kv_append_writes_exact_rows_and_nothing_else(kv_dtype, head_dim, num_kv_heads):
    max_seq_len = 37
    kernel = make_kernel("kv_append", num_kv_heads=num_kv_heads, head_dim=head_dim, max_seq_len=max_seq_len,
                         kv_dtype=kv_dtype)
    kind = kernel.definition
    rng = np.random.default_rng(num_kv_heads * 1000 + head_dim)
    for pos in positions(max_seq_len):
        scalars = {"pos": pos}
        inputs = kind.sample_inputs(rng, scalars)
        arrays = run(kernel, inputs, scalars)
        assert_passes(compare(kernel, arrays, kind.reference(inputs, scalars), scalars))
        assert_caches_exact(kind, inputs, arrays, pos, f"kv_append {num_kv_heads}x{head_dim} {kv_dtype} pos {pos}")


# Rounding cases: f16 ties (to even), f16 subnormals and their underflow (to +-0), f16 overflow
# (65519 stays 65504, 65520 is inf), bf16 ties, f32 subnormals (kept by bf16), +-0, +-inf, f32 max.
EDGE_VALUES = [1 + 2**-11, 1 + 3 * 2**-11, 2049.0, 2051.0, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 1e-8, -1e-8, 65504.0,
               65519.0, 65520.0, 1e5, -1e5, 1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 1e-40, -1e-40, 0.0, -0.0,
               np.inf, -np.inf, 3.4028234663852886e38, 2.0**-126, 1 / 3, -2 / 3, 1e-5, 6e-5, 6.1e-5]


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("head_dim", (40, 7))
def test_kv_append_rounds_edge_values_like_from_float(kv_dtype, head_dim):
    values = np.resize(np.array(EDGE_VALUES, np.float32), 2 * head_dim)
    kernel = make_kernel("kv_append", num_kv_heads=2, head_dim=head_dim, max_seq_len=5, kv_dtype=kv_dtype)
    kind = kernel.definition
    inputs = kind.sample_inputs(np.random.default_rng(3), {"pos": 2})
    inputs["k"] = values.reshape(2, head_dim)
    inputs["v"] = -values[::-1].reshape(2, head_dim)
    arrays = run(kernel, inputs, {"pos": 2})
    assert_caches_exact(kind, inputs, arrays, 2, f"kv_append edge values {kv_dtype} head_dim {head_dim}")


def test_kv_append_contract_reference_and_traffic():
    kind = make_kernel("kv_append", num_kv_heads=2, head_dim=3, max_seq_len=4, kv_dtype="f16").definition
    assert [(p.name, p.dtype, p.shape, p.role) for p in kind.params()] == [
        ("k", "f32", (2, 3), "in"), ("v", "f32", (2, 3), "in"), ("k_cache", "f16", (2, 4, 3), "inout"),
        ("v_cache", "f16", (2, 4, 3), "inout"), ("pos", "u32", (), "scalar")]
    k = np.array([[1.0, 1 + 2**-11, 1e5], [-2.0, 1e-8, 0.1]], np.float32)
    caches = np.arange(24, dtype=np.float16).reshape(2, 4, 3)
    ref = kind.reference({"k": k, "v": -k, "k_cache": caches, "v_cache": caches}, {"pos": 3})
    expected = caches.astype(np.float64)
    expected[:, 3] = [[1.0, 1.0, np.inf], [-2.0, 0.0, float(np.float16(0.1))]]
    np.testing.assert_array_equal(ref["k_cache"], expected)
    expected[:, 3] = -expected[:, 3]
    np.testing.assert_array_equal(ref["v_cache"], expected)
    assert kind.traffic({"pos": 3}).bytes == 2 * 2 * 3 * (4 + 2) and kind.traffic({"pos": 3}).flops == 0
    assert kind.scalar_limits() == {"pos": (0, 3)} and kind.example_scalars() == {"pos": 3}
    assert kind.verify_scalars() == [{"pos": 0}, {"pos": 1}, {"pos": 3}]
    big = make_kernel("kv_append", num_kv_heads=8, head_dim=128, max_seq_len=40960).definition
    assert big.example_scalars() == {"pos": 4095}
    assert big.verify_scalars() == [{"pos": 0}, {"pos": 1}, {"pos": 20479}, {"pos": 40959}]


@pytest.mark.parametrize("config", [
    {"num_kv_heads": 0}, {"num_kv_heads": 257}, {"head_dim": 0}, {"head_dim": 1025}, {"max_seq_len": 0},
    {"max_seq_len": 2**24 + 1}, {"kv_dtype": "u8"}, {"kv_dtype": "f64"},
])
def test_kv_append_rejects_bad_configs(config):
    with pytest.raises(ValidationError):
        make_kernel("kv_append", **{"num_kv_heads": 8, "head_dim": 128, "max_seq_len": 64, **config})


def test_kv_append_launcher_refuses_positions_past_the_cache():
    kernel = make_kernel("kv_append", num_kv_heads=2, head_dim=8, max_seq_len=16)
    kind = kernel.definition
    inputs = kind.sample_inputs(np.random.default_rng(0), {"pos": 0})
    for bad in (16, 17, -1, 2**32, 1.5):
        with pytest.raises(LaunchError, match="'pos'"):
            run(kernel, inputs, {"pos": bad})
    with pytest.raises(LaunchError, match="'pos' is missing"):
        run(kernel, inputs, {})


@pytest.mark.parametrize("kv_dtype, head_dim", [("f16", 128), ("f32", 7), ("bf16", 40)])
def test_kv_append_kernel_itself_writes_nothing_past_the_cache(kv_dtype, head_dim):
    """Launched directly (no launcher check): pos >= max_seq_len changes no byte and the sanitizer
    sees no access outside the arrays. (Unguarded, pos = max_seq_len would land in the next KV
    head's row 0, inside the array: only the byte comparison would notice.)"""
    kernel = make_kernel("kv_append", num_kv_heads=3, head_dim=head_dim, max_seq_len=16, kv_dtype=kv_dtype)
    kind = kernel.definition
    inputs = kind.sample_inputs(np.random.default_rng(1), {"pos": 5})
    arrays = prepare_arrays(kernel, inputs, {"pos": 5})
    before = {name: arrays[name].copy() for name in ("k_cache", "v_cache")}  # row 5 poisoned
    launch = kernel.launch({"pos": 5})
    for pos in (16, 17, 3 * 16, 2**31, 2**32 - 1):
        args = kernel.args(arrays, {"pos": pos})  # no launcher check
        interpret(kernel.ptx, kernel.name, launch.grid, launch.block, args, sanitize=True)
        for name in ("k_cache", "v_cache"):
            assert np.array_equal(arrays[name].view(np.uint8), before[name].view(np.uint8)), \
                f"kv_append {kv_dtype}: pos {pos} >= max_seq_len 16 changed {name}"


def test_run_cli_refuses_pos_past_the_cache_and_writes_nothing(tmp_path):
    spec = tmp_path / "glue.toml"
    spec.write_text('[[kernels]]\nname = "glue_kv_append"\nkind = "kv_append"\nnum_kv_heads = 3\nhead_dim = 40\n'
                    'max_seq_len = 16\nkv_dtype = "bf16"\n')
    kind = spec_kernel(spec, "glue_kv_append").definition
    inputs = kind.sample_inputs(np.random.default_rng(2), {"pos": 15})
    path, out = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(path, **inputs)
    for extra in (["--set", "pos=16"], ["--set", "pos=4294967295"]):
        result = run_cli("run", "glue_kv_append", "--spec", str(spec), "--inputs", str(path), "--outputs", str(out),
                         "--backend", "emulator", *extra)
        assert result.returncode == 2, result
        assert "'pos'" in result.stderr and "0..15" in result.stderr and "Traceback" not in result.stderr, \
            result.stderr
        assert not out.exists(), "nothing may be written after a refused run"
    result = run_cli("run", "glue_kv_append", "--spec", str(spec), "--inputs", str(path), "--outputs", str(out),
                     "--backend", "emulator", "--set", "pos=15")
    assert result.returncode == 0, result.stderr
    with np.load(out) as saved:
        assert_caches_exact(kind, inputs, {name: saved[name] for name in saved.files}, 15, "ptxgen run pos=15")


# --- performance properties and assembly ------------------------------------------------------
def test_vector_accesses_where_the_shape_allows():
    """Performance property (not correctness): 16-byte global accesses on the model shapes."""
    add = make_kernel("residual_add", n=4096).ptx
    assert add.count("ld.global.v4.f32") == 1 and add.count("ld.global.nc.v4.f32") == 1  # x is written: not .nc
    assert add.count("st.global.v4.f32") == 1 and "ld.global.f32" not in add, "n = 4096 needs no scalar tail"
    half = make_kernel("kv_append", num_kv_heads=8, head_dim=128, max_seq_len=40960, kv_dtype="f16").ptx
    assert half.count("ld.global.nc.v4.f32") == 2 and half.count("st.global.v4.b32") == 1
    full = make_kernel("kv_append", num_kv_heads=8, head_dim=128, max_seq_len=8192, kv_dtype="f32").ptx
    assert full.count("ld.global.nc.v4.f32") == 1 and full.count("st.global.v4.f32") == 1
    launch = make_kernel("kv_append", num_kv_heads=8, head_dim=128, max_seq_len=40960).definition.launch({"pos": 0})
    assert launch.grid == (1, 1, 1) and launch.block == (256, 1, 1)


SPEC_KERNELS = [kernel for path in SPECS for kernel in load_spec(path).spec.kernels
                if kernel.kind in ("residual_add", "kv_append")]
ODD_KERNELS = [make_config("residual_add", n=n) for n in (1, 4099, 4 * (2**18 + 1) + 3, MAX_N)] + [
    make_config("kv_append", num_kv_heads=h, head_dim=d, max_seq_len=s, kv_dtype=t)
    for h, d, s, t in ((1, 7, 1, "f32"), (256, 1024, 2**24, "bf16"), (256, 1023, 2**24, "f16"), (3, 6, 5, "f16"))]


def test_spec_instances_exist():
    assert sorted(k.name for k in SPEC_KERNELS) == ["llama3_8b_kv_append", "llama3_8b_residual_add",
                                                   "qwen3_8b_kv_append", "qwen3_8b_residual_add"]


@pytest.mark.parametrize("kernel", SPEC_KERNELS + ODD_KERNELS, ids=lambda k: f"{k.kind}:{k.model_dump()}")
def test_assembles_for_every_arch_without_spills(kernel):
    for arch, used in resources(kernel).items():
        assert used["spill_stores"] == used["spill_loads"] == 0, f"{kernel} {arch}: {used}"
        assert used["local_bytes"] == 0 and used["stack_bytes"] == 0, f"{kernel} {arch}: {used}"
