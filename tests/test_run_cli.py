"""`ptxgen run` and `ptxgen verify` from the command line, per the I/O contract of KERNELS.md."""

from __future__ import annotations

import numpy as np
import pytest

from ptxgen.verify import relative_l2

from helpers import ROOT, run_cli, spec_kernel

SPEC = ROOT / "specs" / "qwen3.toml"


@pytest.fixture
def norm_inputs(tmp_path):
    rng = np.random.default_rng(7)
    path = tmp_path / "in.npz"
    x = rng.standard_normal((3, 4096)).astype(np.float32)
    gamma = (1 + 0.1 * rng.standard_normal(4096)).astype(np.float32)
    np.savez(path, x=x, gamma=gamma)
    return path, x, gamma


def test_run_writes_every_array_parameter(tmp_path, norm_inputs):
    path, x, gamma = norm_inputs
    out = tmp_path / "out.npz"
    result = run_cli("run", "qwen3_8b_rmsnorm", "--spec", str(SPEC), "--inputs", str(path), "--outputs", str(out),
                     "--set", "rows=3", "--backend", "emulator")
    assert result.returncode == 0, result.stderr
    with np.load(out) as saved:
        assert sorted(saved.files) == ["gamma", "x", "y"]
        np.testing.assert_array_equal(saved["x"], x)
        kind = spec_kernel(SPEC, "qwen3_8b_rmsnorm").definition
        reference = kind.reference({"x": x, "gamma": gamma}, {"rows": 3})["y"]
        assert relative_l2(saved["y"].astype(np.float64), reference) < 1e-5


def test_scalar_from_npz(tmp_path, norm_inputs):
    _, x, gamma = norm_inputs
    path = tmp_path / "with_rows.npz"
    np.savez(path, x=x[:2], gamma=gamma, rows=np.uint32(2))
    result = run_cli("run", "qwen3_8b_rmsnorm", "--spec", str(SPEC), "--inputs", str(path),
                     "--outputs", str(tmp_path / "o.npz"), "--backend", "emulator")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("arrays, extra, message", [
    ({"x": np.zeros((3, 4096), np.float64), "gamma": np.ones(4096, np.float32)}, ["--set", "rows=3"], "'x'"),
    ({"x": np.zeros((3, 4096), np.float32), "gamma": np.ones(4096, np.float32)}, ["--set", "rows=4"], "'x'"),
    ({"x": np.zeros((3, 4096), np.float32)}, ["--set", "rows=3"], "'gamma'"),
    ({"x": np.zeros((3, 4096), np.float32), "gamma": np.ones(4096, np.float32)}, [], "'rows' is missing"),
    ({"x": np.zeros((3, 4096), np.float32), "gamma": np.ones(4096, np.float32)}, ["--set", "rows=three"], "--set"),
    ({"x": np.zeros((3, 4096), np.float32), "gamma": np.ones(4096, np.float32)}, ["--set", "rows=-1"], "rows"),
])
def test_bad_inputs_exit_2_naming_the_parameter(tmp_path, arrays, extra, message):
    path = tmp_path / "in.npz"
    np.savez(path, **arrays)
    out = tmp_path / "out.npz"
    result = run_cli("run", "qwen3_8b_rmsnorm", "--spec", str(SPEC), "--inputs", str(path), "--outputs", str(out),
                     "--backend", "emulator", *extra)
    assert result.returncode == 2, result
    assert message in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert not out.exists(), "nothing may be written after a refused run"


def test_missing_inputs_file_and_unknown_kernel(tmp_path):
    result = run_cli("run", "qwen3_8b_rmsnorm", "--spec", str(SPEC), "--inputs", str(tmp_path / "none.npz"),
                     "--outputs", str(tmp_path / "o.npz"), "--backend", "emulator")
    assert result.returncode == 2 and "none.npz" in result.stderr
    np.savez(tmp_path / "in.npz", x=np.zeros(1))
    result = run_cli("run", "no_kernel", "--spec", str(SPEC), "--inputs", str(tmp_path / "in.npz"),
                     "--outputs", str(tmp_path / "o.npz"))
    assert result.returncode == 2 and "no_kernel" in result.stderr


def test_verify_one_kernel_table_and_exit_code():
    result = run_cli("verify", str(SPEC), "--kernel", "qwen3_8b_q_norm", "--seed", "3")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "qwen3_8b_q_norm" in result.stdout and "pass" in result.stdout


def test_verify_says_which_kernels_it_cannot_interpret():
    result = run_cli("verify", str(ROOT / "specs" / "qwen3_decoder.toml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("skipped") == 2 and "too large to interpret" in result.stdout
