"""`ptxgen verify --backend device [--sanitize TOOLS]`: each kernel's checks in a device worker.

A kernel that faults ends its own run with the CUDA error (its remaining sizes are not run) and the
next kernel runs in a fresh worker process (ptxgen.worker). With --sanitize, each kernel runs once
per compute-sanitizer tool, in its own worker under `compute-sanitizer --tool TOOL`, and the
findings in the sanitizer's log are that kernel's (one kernel a process).
"""

from __future__ import annotations

import itertools
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from .compiled import CompiledKernel
from .errors import LaunchError, PtxgenError
from .verify import Check, verify_plan, verify_sizes
from .worker import DeviceWorker

TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
PREFIX = "========="  # compute-sanitizer's line prefix
SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) error")
LOCATION = re.compile(r"^\s*(at .+|by thread .+|Address .+)$")
# Lines at a report's indentation that are not reports.
NOT_FINDINGS = ("COMPUTE-SANITIZER", "ERROR SUMMARY", "RACECHECK SUMMARY", "LEAK SUMMARY")


@dataclass(frozen=True)
class Finding:
    """One kind of report of a sanitizer tool: its first line, where (`at kernel+0x70`, the thread
    and block), and how many reports had both."""

    headline: str
    where: str
    count: int = 1

    def describe(self) -> str:
        return f"{self.headline}{f' {self.where}' if self.where else ''}" + (f" (x{self.count})" if self.count > 1 else "")


@dataclass
class KernelRun:
    """One kernel's checks (on the device: under a sanitizer tool or none)."""

    kernel: str
    tool: str | None
    checks: list[Check] = field(default_factory=list)
    failure: str | None = None  # the error that ended the run (a fault: the CUDA error)
    findings: list[Finding] = field(default_factory=list)
    errors: int | None = None  # the sanitizer's error count (None: no summary, or no sanitizer)
    target: str | None = None  # the arch whose PTX variant ran (None: the portable PTX, or what the GPU runs)

    @property
    def passed(self) -> bool:
        return self.failure is None and not self.findings and not self.errors and all(c.passed for c in self.checks)

    @property
    def status(self) -> str:
        """pass, fail, or "not checked" (too large to interpret: no checks, and no failure)."""
        if not self.passed:
            return "fail"
        return "pass" if self.checks else "not checked"

    def to_json(self) -> dict:
        """verify --json's run: its status, the check farthest from its bounds (`worst`: a failed
        one first, as one fails for unwritten or changed elements or an unrested workspace within
        its bounds), every check."""
        worst = max(self.checks, key=lambda check: (not check.passed, check.worst_ratio), default=None)
        return {"kernel": self.kernel, "target": self.target, "tool": self.tool, "status": self.status,
                "failure": self.failure, "worst": None if worst is None else worst.to_json(),
                "checks": [check.to_json() for check in self.checks],
                "findings": [asdict(finding) for finding in self.findings], "sanitizer_errors": self.errors}


def parse_tools(text: str) -> list[str]:
    """--sanitize's value: tools separated by commas, or `all`."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if names == ["all"]:
        return list(TOOLS)
    unknown = [name for name in names if name not in TOOLS]
    if unknown or not names:
        raise LaunchError(f"--sanitize: expected tools among {', '.join(TOOLS)} (comma-separated) or all, got {text!r}")
    return list(dict.fromkeys(names))


def sanitizer_executable() -> str:
    found = shutil.which("compute-sanitizer")
    if found is None:
        raise PtxgenError("--sanitize: compute-sanitizer is not on PATH (it comes with the CUDA toolkit, in its "
                          "bin folder, e.g. /usr/local/cuda/bin)")
    return found


def sanitizer_command(executable: str, tool: str, log: Path, launch_timeout: int) -> list[str]:
    """compute-sanitizer in front of a device worker. --launch-timeout: how long it waits for the
    process's first CUDA call (its default, 10 s, was too short for a 36-layer decoder's inputs
    on an H100); the worker also opens the device first thing."""
    return [executable, "--tool", tool, "--launch-timeout", str(launch_timeout), "--log-file", str(log)]


def parse_report(text: str) -> tuple[list[Finding], int | None]:
    """(findings, error count of its summary line) of a compute-sanitizer log."""
    findings: dict[tuple[str, str], int] = {}
    errors = None
    headline, where = None, []

    def close() -> None:
        if headline is not None:
            key = (headline, " ".join(where))
            findings[key] = findings.get(key, 0) + 1

    for line in text.splitlines():
        if not line.startswith(PREFIX):
            continue
        body = line[len(PREFIX):]
        summary = SUMMARY.search(body)
        if summary:
            errors = (errors or 0) + int(summary.group(1))
        if not body.strip():
            continue
        if body.startswith(" ") and not body.startswith("  "):  # one space: a new report
            close()
            first = body.strip()
            headline, where = (None if first.startswith(NOT_FINDINGS) else first), []
        elif headline is not None:
            located = LOCATION.match(body)
            if located and len(where) < 2:  # `at kernel+0x..` and `by thread ...`, not the host backtrace
                where.append(located.group(1).strip())
    close()
    return [Finding(h, w, n) for (h, w), n in findings.items()], errors


def open_device() -> str:
    """Create the worker's CUDA context now (so a sanitizer attaches before the inputs are made)."""
    from .device import session

    return session().name


def run_kernel_checks(worker, compiled: CompiledKernel, cases: list[dict], seed: int, arch: str | None,
                      run: KernelRun) -> None:
    try:
        for checks in verify_sizes(compiled, cases, seed, call=worker.call, backend="device", arch=arch):
            run.checks += checks
    except LaunchError as error:
        run.failure = str(error)


def verify_on_device(kernels: list[CompiledKernel], seed: int, arch: str | None, tools: list[str],
                     launch_timeout: int, progress: Callable[[str], None] = lambda name: None) -> list[KernelRun]:
    """One KernelRun per launch plan of a kernel (verify_plan: the kernel at its verify sizes, or
    its stand-ins; per tool with `tools`)."""
    runs = []
    if not tools:
        with DeviceWorker() as worker:
            for compiled in kernels:
                progress(compiled.name)
                for label, kernel, sizes in verify_plan(compiled):
                    run = KernelRun(label, None, target=arch)
                    run_kernel_checks(worker, kernel, sizes, seed, arch, run)
                    runs.append(run)
        return runs
    executable = sanitizer_executable()
    for compiled in kernels:
        progress(compiled.name)
        for (label, kernel, sizes), tool in itertools.product(verify_plan(compiled), tools):
            run = KernelRun(label, tool, target=arch)
            with tempfile.TemporaryDirectory(prefix="ptxgen-sanitizer-") as folder:
                log = Path(folder) / "log.txt"
                with DeviceWorker(sanitizer_command(executable, tool, log, launch_timeout)) as worker:
                    try:
                        worker.call(open_device)
                    except LaunchError as error:
                        run.failure = str(error)
                    else:
                        run_kernel_checks(worker, kernel, sizes, seed, arch, run)
                report = log.read_text(errors="replace") if log.exists() else ""
            run.findings, run.errors = parse_report(report)
            if run.errors is None and run.failure is None:
                run.failure = f"compute-sanitizer --tool {tool} wrote no summary (its log: {report[-300:]!r})"
            runs.append(run)
    return runs
