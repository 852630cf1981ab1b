"""Test helpers: build a kernel config without a spec file, render it, run the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
