"""Test helpers: compile a kernel config without a spec file, run the CLI, compare weights."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ptxgen.archs import DEFAULT_ARCHS
from ptxgen.assemble import ptxas_binary, wheel_binary
from ptxgen.compiled import CompiledKernel
from ptxgen.kernels import config_from_json
from ptxgen.pipeline import compile_kernel, compile_spec
from ptxgen.spec import load_spec

ROOT = Path(__file__).resolve().parent.parent
SPECS = sorted((ROOT / "specs").glob("*.*"))
# A spec of one small Q4_K GEMV (one warp step a row): the `--tune` tests' (bench and show, fuzzed).
# The optional tools `make build` installs (pyproject's extras): where they are missing (the Python
# 3.10 venv, a bare `pip install ptxgen[test]`) the tests of what they make are skipped, not failed.
needs_ptxas = pytest.mark.skipif(ptxas_binary() is None, reason="ptxas (the ptxas extra) is not installed: "
                                 "nvJitLink ignores setmaxnreg, so the sm_90a kernels' register budgets differ")
needs_nvdisasm = pytest.mark.skipif(wheel_binary("nvidia-cuda-nvdisasm", "nvdisasm") is None,
                                    reason="nvdisasm (the sass extra) is not installed")

TUNE_SPEC = '[target]\narchs = ["sm_90"]\n\n[[kernels]]\nname = "small_gemv"\nkind = "q4k_gemv"\nn = 64\nk = 512\n'


def make_config(kind: str, name: str = "test_kernel", **config):
    """A validated kernel config, as if it came from a spec entry."""
    return config_from_json({"name": name, "kind": kind, **config})


def make_kernel(kind: str, name: str = "test_kernel", **config) -> CompiledKernel:
    """A kernel config compiled to PTX (sm_80 target; no cubins: the interpreter runs the PTX)."""
    return compile_kernel(make_config(kind, name, **config), until="ptx")


def spec_kernel(path, name: str, until: str = "ptx") -> CompiledKernel:
    """One kernel of a spec file, compiled for the spec's archs (to PTX unless `until` says cubin)."""
    spec = load_spec(path).spec
    return compile_spec(spec.model_copy(update={"kernels": (spec.kernel(name),)}), until=until).kernels[0]


def with_ptx(kernel: CompiledKernel, ptx: str, target: str | None = None) -> CompiledKernel:
    """The kernel with the PTX of `target` (default: the portable one) replaced (a planted bug, for
    tests that must catch it)."""
    variant = dataclasses.replace(kernel.variants[target] if target else kernel.portable, ptx=ptx)
    return dataclasses.replace(kernel, variants={**kernel.variants, variant.target: variant})


def unprivileged() -> list[str] | None:
    """A command prefix under which file permissions bind (root's capabilities to bypass them
    dropped), or None where that cannot be done."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    caps = "-dac_override,-dac_read_search"
    return None if setpriv is None else [setpriv, f"--bounding-set={caps}", f"--inh-caps={caps}"]


def run_cli(*args: str, cwd: Path = ROOT, env: dict | None = None, prefix=()) -> subprocess.CompletedProcess:
    """Run `ptxgen ARGS` in a subprocess exactly as a user would (exit code, stdout, stderr), under
    a command `prefix` (e.g. unprivileged()'s) if given."""
    return subprocess.run([*prefix, sys.executable, "-m", "ptxgen.cli", *args], cwd=cwd, capture_output=True,
                          text=True, env={**os.environ, "COLUMNS": "200", **(env or {})}, timeout=600)


def assert_passes(checks) -> None:
    """Every written output fully written, kept elements unchanged, within its tolerance of the
    float64 reference and every element within the kind's error bound."""
    assert checks, "nothing was compared"
    for check in checks:
        assert check.passed, f"{check.kernel} {check.scalars}: {check.param}: {check.failure}"


def resources(kernel, archs: tuple[str, ...] = DEFAULT_ARCHS) -> dict[str, dict]:
    """The assembler's resource report (registers, spills, ...) per arch of a kernel (a config or a
    CompiledKernel), assembled through the cache."""
    config = config_from_json(dict(kernel.config)) if isinstance(kernel, CompiledKernel) else kernel
    assembled = compile_kernel(config, archs)
    return {arch: dict(binary.resources) for arch, binary in assembled.binaries.items()}


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


@dataclasses.dataclass(frozen=True)
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def run_cli_in_process(*args: str) -> CliResult:
    """`ptxgen ARGS` through the CLI's own entry point (ptxgen.cli.main) in this process: as
    run_cli, but cheap enough for hundreds of calls. An exception that escapes main() (a
    traceback for a user) escapes here too."""
    import contextlib
    import io
    from unittest import mock

    from ptxgen.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr), \
            mock.patch.object(sys, "argv", ["ptxgen", *args]):
        try:
            main()
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else int(exit.code is not None)
    return CliResult(code, stdout.getvalue(), stderr.getvalue())


def prefetched_lines(monkeypatch, launch) -> list[tuple[str, int]]:
    """(array, byte offset) of every prefetch that `launch()` (interpreted launches) executes,
    thread by thread; a prefetch outside every array fails."""
    import importlib

    from ptxgen.interp import ops

    interp_launch = importlib.import_module("ptxgen.interp.launch")  # the module (the package exports its function)
    seen = []

    def recording(c):
        space = c.space()
        address = c.address(c.ops[0], space)

        def record(st, sel):
            addr = address(st, sel)
            region = st.memory.locate(addr, 1)
            assert (region >= 0).all(), "a prefetch outside every array"
            seen.extend((st.memory.names[r], int(a - st.memory.bases[r])) for r, a in zip(region, addr))
        return c.alu(record)

    monkeypatch.setitem(ops.COMPILERS, "prefetch", recording)
    monkeypatch.setattr(interp_launch, "_CACHE", {})     # compiled anew, with the recording prefetch
    launch()
    return seen
