"""Test helpers: build a kernel config without a spec file, render it, run the CLI, compare weights."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from pydantic import TypeAdapter

from ptxgen.render import render
from ptxgen.spec import KernelEntry

ROOT = Path(__file__).resolve().parent.parent
SPECS = sorted((ROOT / "specs").glob("*.*"))


def make_kernel(kind: str, name: str = "k", **config):
    """A validated kernel config, as if it came from a spec entry."""
    return TypeAdapter(KernelEntry).validate_python({"name": name, "kind": kind, **config})


def ptx_of(kernel) -> str:
    return render(kernel, (7, 0), "sm_80")


def run_cli(*args: str, cwd: Path = ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `ptxgen ARGS` in a subprocess exactly as a user would (exit code, stdout, stderr)."""
    return subprocess.run([sys.executable, "-m", "ptxgen.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200", **(env or {})}, timeout=600)


def assert_passes(checks) -> None:
    """Every written output fully written and within its tolerance of the float64 reference."""
    assert checks, "nothing was compared"
    for check in checks:
        where = f"{check.kernel} {check.scalars}: {check.param}"
        assert check.unwritten == 0, f"{where}: {check.unwritten} elements never written"
        assert check.error <= check.tolerance, f"{where}: rel. L2 error {check.error:.3e} > {check.tolerance:.1e}"


def assert_bits_equal(a, b) -> None:
    """Two float32 arrays equal bit for bit (so -0.0 vs 0.0 or a 1-ulp slip would show)."""
    assert a.dtype == b.dtype == np.float32 and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def gaussian(rng, n: int, k: int, std: float = 0.02):
    """float32 [n, k] of N(0, std^2) weights."""
    return rng.standard_normal((n, k), dtype=np.float32) * np.float32(std)


def rel_rms(y, x) -> float:
    """Relative RMS error of y against x."""
    x = x.astype(np.float64)
    return float(np.sqrt(np.mean((y - x) ** 2) / np.mean(x**2)))
