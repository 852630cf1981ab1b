"""ptxgen's command line. One boundary (main) turns every PtxgenError into a message + exit 2."""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import numpy as np
import typer
import rich.markup
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from .bench import bench_command
from .errors import LaunchError, PtxgenError, SpecError
from .kernels import KINDS, kind_of
from .spec import LoadedSpec, load_spec, with_archs

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Declarative kernel specs -> PTX -> cubins, checked on CPU and GPU.")
out = Console()
err = Console(stderr=True)

DEFAULT_SPEC = Path("specs/qwen3.toml")
H100_BANDWIDTH_TBS = 3.35
H100_TENSOR_TFLOPS = 989.0  # dense f16/bf16

SpecArg = Annotated[Path, typer.Argument(help="Spec file (.toml, .yaml).")]
SpecOption = Annotated[Path, typer.Option("--spec", "-s", help="Spec file (.toml, .yaml).")]
QuietOption = Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing but errors.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print a machine-readable JSON summary.")]


class Backend(str, Enum):
    emulator = "emulator"
    device = "device"


class Assembler(str, Enum):
    auto = "auto"
    nvjitlink = "nvjitlink"
    driver = "driver"


def find_kernel(spec: LoadedSpec, name_or_kind: str):
    """A kernel by its name in the spec, or the spec's first kernel of that kind."""
    for kernel in spec.spec.kernels:
        if kernel.name == name_or_kind:
            return kernel
    for kernel in spec.spec.kernels:
        if kernel.kind == name_or_kind:
            return kernel
    known = ", ".join(k.name for k in spec.spec.kernels)
    raise SpecError(f"{spec.path}: no kernel named {name_or_kind!r} and no kernel of that kind (kernels: {known})")


@app.command()
def build(
    spec_path: SpecArg,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Artifact folder [build/<spec name>].")] = None,
    arch: Annotated[Optional[list[str]], typer.Option("--arch", help="Target arch; repeat for several [spec's].")] = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="Assemble in N processes.")] = 1,
    assembler: Annotated[Assembler, typer.Option(help="nvJitLink (offline) or the driver's JIT.")] = Assembler.auto,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Assemble everything anew.")] = False,
    as_json: JsonOption = False,
    quiet: QuietOption = False,
):
    """Render, assemble and write the artifact folder and manifest of a spec."""
    from .pipeline import BuildOptions, run_build

    spec = load_spec(spec_path)
    if arch:
        spec = with_archs(spec, tuple(arch))
    target = output or Path("build") / spec_path.stem
    total = len(spec.spec.kernels) * len(spec.spec.target.archs)
    show_progress = err.is_terminal and not quiet and not as_json
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), console=err,
                  disable=not show_progress, transient=True) as progress:
        task = progress.add_task("assembling", total=total)
        options = BuildOptions(assembler=assembler.value, jobs=jobs, use_cache=not no_cache,
                               progress=lambda label: progress.update(task, advance=1, description=label))
        result = run_build(spec, target, options)
    if as_json:
        summary = {"output": str(target), "assembled": result.assembled, "cached": result.cached,
                   "manifest": result.manifest}
        out.print_json(json.dumps(summary, sort_keys=True))
    elif not quiet:
        print_build_table(result.manifest, target, result.assembled, result.cached)


def print_build_table(manifest: dict, target: Path, assembled: int, cached: int) -> None:
    table = Table(title=f"{target}  ({assembled} assembled, {cached} from cache)")
    for column in ("kernel", "kind", "arch", "regs", "smem", "spills", "lmem"):
        table.add_column(column, justify="left" if column in ("kernel", "kind", "arch") else "right")
    for name, meta in manifest["kernels"].items():
        for arch, cubin in meta["cubins"].items():
            spills = cubin["spill_stores"] + cubin["spill_loads"]
            table.add_row(name, meta["kind"], arch, str(cubin["registers"]), str(cubin["shared_bytes"]),
                          f"[red]{spills}[/red]" if spills else "0", str(cubin["local_bytes"]))
    out.print(table)


@app.command()
def validate(spec_path: SpecArg):
    """Check a spec without building it."""
    spec = load_spec(spec_path)
    out.print(f"{spec_path}: ok, {len(spec.spec.kernels)} kernels for {', '.join(spec.spec.target.archs)}")


@app.command("list")
def list_kinds():
    """The kernel kinds ptxgen knows, one line each."""
    for name, kind in KINDS.items():
        doc = (sys.modules[kind.__module__].__doc__ or "").strip().splitlines()[0]
        summary = doc.split(": ", 1)[-1] if doc.startswith(name) else doc
        out.print(f"[bold]{name}[/bold]  {rich.markup.escape(summary)}")


@app.command()
def show(
    name: Annotated[str, typer.Argument(help="Kernel name in the spec, or a kind (its first instance).")],
    spec_path: SpecOption = DEFAULT_SPEC,
    ptx: Annotated[bool, typer.Option("--ptx", help="Print the PTX text.")] = False,
    bandwidth: Annotated[float, typer.Option(help="Memory bandwidth for the roofline, TB/s.")] = H100_BANDWIDTH_TBS,
    tensor_tflops: Annotated[float, typer.Option(help="Tensor throughput for the roofline, TFLOP/s.")] = H100_TENSOR_TFLOPS,
):
    """Config, parameters, launch geometry, resources per arch and bytes moved per call."""
    from .pipeline import BuildOptions, build as build_units

    spec = load_spec(spec_path)
    kernel = find_kernel(spec, name)
    kind = kind_of(kernel)
    single = LoadedSpec(path=spec.path, sha256=spec.sha256, spec=spec.spec.model_copy(update={"kernels": (kernel,)}))
    units, _, _ = build_units(single, BuildOptions())
    unit = units[0]
    if ptx:
        out.print(unit.ptx, markup=False, highlight=False, end="")
        return
    scalars = kind.example_scalars()
    launch = kind.launch(scalars)
    traffic = kind.traffic(scalars)
    out.print(f"[bold]{kernel.name}[/bold]  kind {kind.name}")
    out.print("config: " + json.dumps(kernel.model_dump(mode="json", exclude={"name", "kind"}), sort_keys=True))
    params = Table("param", "role", "type / shape", title="parameters (PTX order)")
    for param in kind.params():
        params.add_row(param.name, param.role, rich.markup.escape(param.describe()))
    out.print(params)
    out.print(f"launch: {kind.launch_rule()}")
    example = ", ".join(f"{k}={v}" for k, v in scalars.items()) or "(no runtime scalars)"
    out.print(f"  at {example}: grid={launch.grid} block={launch.block} dynamic shared={launch.dynamic_shared} B")
    resources = Table("arch", "registers", "shared B", "local B", "spill st/ld B")
    for arch, cubin in unit.meta["cubins"].items():
        resources.add_row(arch, str(cubin["registers"]), str(cubin["shared_bytes"]), str(cubin["local_bytes"]),
                          f"{cubin['spill_stores']}/{cubin['spill_loads']}")
    out.print(resources)
    memory_us = traffic.bytes / (bandwidth * 1e12) * 1e6
    compute_us = traffic.flops / (tensor_tflops * 1e12) * 1e6
    out.print(f"per call at {example}: {traffic.bytes:,} bytes, {traffic.flops:,} flops")
    out.print(f"roofline floor: {max(memory_us, compute_us):.2f} us "
              f"(memory {memory_us:.2f} us at {bandwidth} TB/s, compute {compute_us:.2f} us at {tensor_tflops} TFLOP/s)")


def parse_sets(assignments: list[str]) -> dict[str, list[int]]:
    """--set NAME=VALUE[,VALUE...] into {name: [values]}."""
    values = {}
    for assignment in assignments:
        name, equals, text = assignment.partition("=")
        try:
            if not equals or not name:
                raise ValueError
            values[name.strip()] = [int(part, 0) for part in text.split(",")]
        except ValueError:
            raise LaunchError(f"--set: expected NAME=INTEGER[,INTEGER...], got {assignment!r}") from None
    return values


def load_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except (OSError, ValueError) as error:
        raise LaunchError(f"--inputs {path}: cannot read as .npz: {error}") from None


def default_backend() -> str:
    from .device import driver
    from .errors import DeviceUnavailable

    try:
        driver()
        return "device"
    except DeviceUnavailable:
        return "emulator"


@app.command()
def run(
    kernel_name: Annotated[str, typer.Argument(metavar="KERNEL", help="Kernel name in the spec.")],
    inputs: Annotated[Path, typer.Option("--inputs", help=".npz with one array per array parameter.")],
    outputs: Annotated[Path, typer.Option("--outputs", help=".npz to write every array parameter to.")],
    spec_path: SpecOption = DEFAULT_SPEC,
    assignments: Annotated[Optional[list[str]], typer.Option("--set", help="Runtime scalar NAME=VALUE.")] = None,
    backend: Annotated[Optional[Backend], typer.Option(help="emulator (CPU interpreter) or device [device if a GPU is present].")] = None,
    gguf: Annotated[Optional[Path], typer.Option("--gguf", help="GGUF file to take the Q4_K weight parameter from.")] = None,
    tensor: Annotated[Optional[str], typer.Option("--tensor", help="Tensor name in --gguf.")] = None,
):
    """Run one kernel once on IN.npz and write every array parameter to OUT.npz."""
    from .runner import run as run_kernel

    spec = load_spec(spec_path)
    kernel = spec.spec.kernel(kernel_name)
    kind = kind_of(kernel)
    arrays = load_npz(inputs)
    scalars = {name: int(arrays.pop(name)) for name in list(arrays) if arrays[name].ndim == 0}
    scalars.update({name: values[0] for name, values in parse_sets(assignments or []).items()})
    if (gguf is None) != (tensor is None):
        raise LaunchError("--gguf and --tensor go together")
    if gguf is not None:
        arrays.update(gguf_weights(kind, gguf, tensor))
    chosen = backend.value if backend else default_backend()
    results = run_kernel(kernel, spec.spec.ptx(kernel), arrays, scalars, backend=chosen)
    save_npz(outputs, results)
    err.print(f"{kernel.name}: ran on {chosen}, wrote {', '.join(results)} to {outputs}")


def gguf_weights(kind, path: Path, tensor: str) -> dict[str, np.ndarray]:
    """The kind's one Q4_K parameter, read from a GGUF tensor."""
    from .q4k import BLOCK_BYTES, BLOCK_WEIGHTS, load_gguf_tensor

    quantized = [p for p in kind.params() if p.layout == "q4_k"]
    if len(quantized) != 1:
        raise LaunchError(f"{kind.config.name}: --gguf needs a kernel with one Q4_K weight parameter")
    param = quantized[0]
    n, row = param.shape[-2], param.shape[-1]
    return {param.name: load_gguf_tensor(path, tensor, n, row // BLOCK_BYTES * BLOCK_WEIGHTS)}


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write the .npz whole or not at all."""
    import io

    from .cache import write_if_changed

    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    write_if_changed(path, buffer.getvalue())


@app.command()
def verify(
    spec_path: SpecArg,
    kernel_name: Annotated[Optional[str], typer.Option("--kernel", help="Only this kernel.")] = None,
    backend: Annotated[Backend, typer.Option(help="Where to run the PTX.")] = Backend.emulator,
    seed: Annotated[int, typer.Option(help="Seed of the random inputs.")] = 0,
):
    """Run every kernel on random inputs and compare with its float64 reference."""
    from .verify import verify_kernel

    spec = load_spec(spec_path)
    kernels = [spec.spec.kernel(kernel_name)] if kernel_name else list(spec.spec.kernels)
    table = Table("kernel", "scalars", "output", "rel. L2 error", "tolerance", "verdict", title=f"verify {spec_path}")
    failures = 0
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), console=err,
                  disable=not err.is_terminal, transient=True) as progress:
        task = progress.add_task("verifying", total=len(kernels))
        for kernel in kernels:
            progress.update(task, description=kernel.name)
            ptx = spec.spec.ptx(kernel)
            cases = kind_of(kernel).verify_scalars()
            if not cases:
                table.add_row(kernel.name, "-", "-", "-", "-",
                              "[yellow]skipped[/yellow] (too large to interpret)")
            for scalars in cases:
                for check in verify_kernel(kernel, ptx, scalars, seed=seed, backend=backend.value):
                    failures += not check.passed
                    verdict = "[green]pass[/green]" if check.passed else (
                        f"[red]FAIL[/red] ({check.unwritten} unwritten)" if check.unwritten else "[red]FAIL[/red]")
                    table.add_row(kernel.name, ", ".join(f"{k}={v}" for k, v in scalars.items()),
                                  f"{check.param}{list(check.shape)}", f"{check.error:.2e}", f"{check.tolerance:.0e}",
                                  verdict)
            progress.advance(task)
    out.print(table)
    if failures:
        raise typer.Exit(1)


app.command("bench")(bench_command)


def main() -> None:
    """Entry point: the one error boundary of the CLI (usage errors exit 2 inside typer)."""
    try:
        app()
    except PtxgenError as error:
        err.print(f"[red]error:[/red] {rich.markup.escape(str(error))}", highlight=False)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
