"""ptxgen's command line. One boundary (main) turns every PtxgenError into one message + exit 2."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import sys
from dataclasses import asdict
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from . import __version__
from .abi import Param
from .archs import ARCHS
from .errors import LaunchError, PtxgenError
from .quote import clip, echo
from .tables import print_table
from .spec import LoadedSpec, load_spec, with_archs

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, help="Declarative kernel specs -> PTX -> cubins, checked on CPU and GPU.")
cache_app = typer.Typer(no_args_is_help=True, help="The assembled-cubin cache ($PTXGEN_CACHE_DIR).")
app.add_typer(cache_app, name="cache")
spec_app = typer.Typer(no_args_is_help=True, help="Write a spec for a model (from a GGUF file or a Hugging Face config).")
app.add_typer(spec_app, name="spec")
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

DEFAULT_SPEC = Path("specs/qwen3.toml")
H100_TENSOR_TFLOPS = 989.0  # dense f16/bf16

# Paths are not checked by click (readable=False): ptxgen's own checks name an unreadable file in one line.
SpecArg = Annotated[Path, typer.Argument(readable=False, help="Spec file (.toml, .yaml).")]
SpecOption = Annotated[Path, typer.Option("--spec", "-s", readable=False, help="Spec file (.toml, .yaml).")]
QuietOption = Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing but errors.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print a machine-readable JSON summary.")]
ArchOption = Annotated[Optional[str], typer.Option(
    "--arch", help="Use the PTX variant / cubin of this arch (e.g. sm_90a); default the portable PTX.")]
ShowArchOption = Annotated[Optional[str], typer.Option(
    "--arch", help="Show the launch and PTX that a GPU of this arch runs (e.g. sm_90a); default: the launch of "
                   "the cubin --gpu runs, and the portable PTX.")]
VerifyArchOption = Annotated[Optional[str], typer.Option(
    "--arch", help="Check the PTX variant / cubin of this arch (e.g. sm_90a); default: in the emulator the "
                   "portable PTX and each arch-specific variant built (sm_90a), on a device what it runs.")]


class Backend(str, Enum):
    emulator = "emulator"
    device = "device"


class Assembler(str, Enum):
    auto = "auto"
    nvjitlink = "nvjitlink"
    ptxas = "ptxas"
    driver = "driver"


def version_callback(value: bool) -> None:
    if value:
        out.print(f"ptxgen {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: Annotated[bool, typer.Option("--version", callback=version_callback, is_eager=True,
                                          help="Print the version and exit.")] = False,
):
    """Declarative kernel specs -> PTX -> cubins, checked on CPU and GPU."""


# --- output: rich on a terminal, plain text in pipes and files ------------------------------------
def progress_bar(label: str, total: int, enabled: bool) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), console=err,
                    disable=not (enabled and err.is_terminal), transient=True)


def known_arch(arch: str | None) -> str | None:
    """An --arch value, refused unless ptxgen targets it."""
    if arch is not None and arch not in ARCHS:
        raise LaunchError(f"--arch: expected one of {', '.join(ARCHS)}, got {arch!r}")
    return arch


def plural(count: int, word: str, many: str = "") -> str:
    return f"{count} {word if count == 1 else many or word + 's'}"


def compile_one(spec: LoadedSpec, kernel):
    """One kernel of a spec, compiled for the spec's archs (through the cache)."""
    from .pipeline import compile_loaded

    return compile_loaded(spec, (kernel,)).kernels[0]


# --- build ---------------------------------------------------------------------------------------------
@app.command()
def build(
    spec_path: SpecArg,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", readable=False,
                                                   help="Artifact folder (default build/<spec name>).")] = None,
    arch: Annotated[Optional[list[str]], typer.Option("--arch", help="Target arch; repeat for several (default: "
                                                                     "the spec's).")] = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="Assemble in N processes.")] = 1,
    assembler: Annotated[Assembler, typer.Option(
        help="auto: nvJitLink, and ptxas (extra 'ptxas') for PTX with setmaxnreg, which nvJitLink drops; or the "
             "driver's JIT.")] = Assembler.auto,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Assemble everything anew.")] = False,
    check: Annotated[bool, typer.Option("--check", help="Write nothing; exit 1 naming every stale, missing or "
                                                        "unexpected artifact in the folder.")] = False,
    as_json: JsonOption = False,
    quiet: QuietOption = False,
):
    """Render, assemble and write the artifact folder (PTX, cubins, C header, manifest) of a spec."""
    from .artifacts import check_output_folder, compare, write_folder
    from .pipeline import BuildOptions, artifact_files, compile_loaded

    spec = load_spec(spec_path)
    if arch:
        spec = with_archs(spec, tuple(arch))
    target = output if output is not None else Path("build") / spec_path.stem
    if str(target) in ("", "."):
        raise PtxgenError("-o: give a folder for the artifacts (ptxgen owns it and replaces its contents)")
    if not check:
        check_output_folder(target)
        check_cache_outside(target, no_cache)
    total = len(spec.spec.kernels) * len(spec.spec.target.archs)
    notes: list[str] = []
    with progress_bar("assembling", total, not quiet and not as_json) as progress:
        task = progress.add_task("assembling", total=total)
        options = BuildOptions(assembler=assembler.value, jobs=jobs, use_cache=not no_cache,
                               progress=lambda label: progress.update(task, advance=1, description=label),
                               report=notes.append)
        compiled = compile_loaded(spec, options=options)
    for note in notes:
        err.print(f"note: {note}", markup=False)
    files = artifact_files(spec, compiled.kernels)
    manifest = json.loads(files["manifest.json"])
    if check:
        difference = compare(target, files)
        if as_json:
            sys.stdout.write(json.dumps({"output": str(target), "up_to_date": not difference.lines(),
                                         **asdict(difference)}, sort_keys=True, indent=2) + "\n")
        else:
            for line in difference.lines():
                out.print(f"{target}: {line}", markup=False)
        if difference.lines():
            raise typer.Exit(1)
        if not quiet and not as_json:
            out.print(f"{target}: up to date ({plural(len(files), 'file')})", markup=False)
        return
    write_folder(target, files)
    if as_json:
        summary = {"output": str(target), "assembled": compiled.assembled, "cached": compiled.cached,
                   "manifest": manifest}
        sys.stdout.write(json.dumps(summary, sort_keys=True, indent=2) + "\n")
    elif not quiet:
        rows = []
        for name, meta in manifest["kernels"].items():
            for arch_name, cubin in meta["cubins"].items():
                spills = cubin["spill_stores"] + cubin["spill_loads"]
                rows.append([name, meta["kind"], arch_name, str(cubin["registers"]), str(cubin["shared_bytes"]),
                             str(spills), str(cubin["local_bytes"])])
        print_table(f"{target}  ({compiled.assembled} assembled, {compiled.cached} from cache)",
                    ["kernel", "kind", "arch", "regs", "smem", "spills", "lmem"], rows)


@app.command()
def validate(spec_path: SpecArg):
    """Check a spec without building it."""
    from .pipeline import compile_loaded

    spec = load_spec(spec_path)
    compile_loaded(spec, until="ptx")  # what build refuses as it renders (a kernel named like a name in its PTX)
    out.print(f"{spec_path}: ok, {plural(len(spec.spec.kernels), 'kernel')} for {', '.join(spec.spec.target.archs)}",
              markup=False)


@app.command("list")
def list_kinds():
    """The kernel kinds ptxgen knows, one line each."""
    from .kernels import KINDS

    rows = []
    for name, kind in KINDS.items():
        doc = " ".join((sys.modules[kind.__module__].__doc__ or "").strip().split("\n\n")[0].split())
        rows.append([name, first_clause(doc.split(": ", 1)[-1] if doc.startswith(name) else doc)])
    print_table("", ["kind", "what it computes"], rows)


def first_clause(text: str) -> str:
    """`text` up to its first '.', ':' or ';' that ends a clause (outside parentheses and code),
    without it."""
    depth, code = 0, False
    for index, char in enumerate(text):
        if char == "`":
            code = not code
        elif not code and char in "([":
            depth += 1
        elif not code and char in ")]":
            depth -= 1
        elif not code and depth == 0 and char in ".:;" and text[index + 1:index + 2] in (" ", ""):
            return text[:index]
    return text.removesuffix(".")


def check_cache_outside(target: Path, no_cache: bool) -> None:
    """The cache may not live in the artifact folder, which ptxgen replaces whole (and whose
    foreign files stop a build)."""
    from .settings import SETTINGS

    cache, folder = SETTINGS.cache_dir.absolute(), target.absolute()
    if not no_cache and (cache == folder or folder in cache.parents):
        raise PtxgenError(f"-o {target}: the cache folder (PTXGEN_CACHE_DIR {SETTINGS.cache_dir}) is inside it; "
                          "ptxgen replaces the artifact folder whole: choose another folder or cache")


@app.command()
def show(
    name: Annotated[str, typer.Argument(help="Kernel name in the spec, or a kind (its first instance).")],
    spec_path: SpecOption = DEFAULT_SPEC,
    ptx: Annotated[bool, typer.Option("--ptx", help="Print the PTX text.")] = False,
    sass: Annotated[bool, typer.Option("--sass", help="Print the SASS of the cubin --arch names, else of the one "
                                                      "--gpu runs (nvdisasm, the 'sass' extra).")] = False,
    arch: ShowArchOption = None,
    gpu: Annotated[str, typer.Option(help="GPU of the performance model (h100-sxm, h200, a100-80gb, l40s, "
                                          "rtx4090).")] = "h100-sxm",
    model: Annotated[bool, typer.Option("--model/--no-model", help="Run the performance model (it counts "
                                                                   "instructions in the interpreter).")] = True,
    as_json: JsonOption = False,
    tensor_tflops: Annotated[Optional[float], typer.Option(
        min=1e-6, help="Dense f16 tensor throughput for the roofline and the model, TFLOP/s (default: the --gpu's "
                       "datasheet rate, else 989).")] = None,
    assignments: Annotated[Optional[list[str]], typer.Option(
        "--set", help="Runtime scalar NAME=VALUE to report at (default: the kind's typical call).")] = None,
    tune_fields: Annotated[Optional[list[str]], typer.Option(
        "--tune", help="Config FIELD=VALUE,VALUE,...: the model of every combination beside the spec's config "
                       "(bench --tune times them).")] = None,
):
    """Config, parameters, launch, resources per arch, bytes moved, and the performance model: occupancy,
    instructions per byte, issue-bound time and bytes in flight on a chosen GPU."""
    from . import tune
    from .perf import gpu_named

    chosen = gpu_named(gpu)
    if tensor_tflops is not None:
        if not math.isfinite(tensor_tflops):
            raise PtxgenError(f"--tensor-tflops: expected a finite number, got {tensor_tflops}")
    # one rate for the roofline and the model: a GPU without a datasheet rate here (l40s, rtx4090) takes 989
    chosen = dataclasses.replace(chosen, tensor_tflops=tensor_tflops or chosen.tensor_tflops or H100_TENSOR_TFLOPS)
    tensor_tflops = chosen.tensor_tflops
    arch = known_arch(arch)
    chosen_scalars = single_sets(assignments, "show")
    spec = load_spec(spec_path)
    fields = tune.parse_tune(tune_fields or [])
    if ptx and sass:
        raise LaunchError("--ptx prints the PTX, --sass the SASS: give one or the other")
    if as_json and (ptx or sass):
        raise LaunchError(f"--json prints the report as JSON, {'--ptx' if ptx else '--sass'} the kernel's code: give "
                          "one or the other")
    if fields and (ptx or sass):
        raise LaunchError(f"--tune: compares the variants' models; {'--ptx' if ptx else '--sass'} prints one "
                          "kernel's code (give one or the other)")
    if fields:
        tuned = spec.spec.find(name)
        made, skipped = tune.variants(spec, tuned, fields)
        made = tune.compile_variants(spec, made, skipped)
        reports = [show_report(variant.compiled, spec, chosen, arch, chosen_scalars, model, tensor_tflops)
                   for variant in made]
        section = tune.model_summary(tuned.name, made, skipped, reports)
        if as_json:
            sys.stdout.write(json.dumps(section, indent=2, default=str) + "\n")
            return
        tune.print_models(section, chosen, out, err)
        return
    compiled = compile_one(spec, spec.spec.find(name))
    if ptx or sass:  # the code does not depend on them, but a --set it was given must still be one it takes
        compiled.check_scalars({**compiled.definition.example_scalars(), **chosen_scalars})
    if ptx:
        sys.stdout.write(compiled.variant(arch).ptx)
        return
    if sass:
        sys.stdout.write(sass_listing(compiled, arch, chosen))
        return
    report = show_report(compiled, spec, chosen, arch, chosen_scalars, model, tensor_tflops)
    if as_json:
        sys.stdout.write(json.dumps(report, indent=2, default=str) + "\n")
        return
    print_show(report, chosen)


def sass_listing(compiled, arch: str | None, chosen) -> str:
    """nvdisasm's listing of the cubin a GPU of `arch` runs (as --ptx and the report take it: an
    sm_86 runs sm_80's, an sm_90 sm_90a's), else of the one the GPU `chosen` runs."""
    from .perf import disassemble

    binary = compiled.binary_for(arch or chosen.arch)
    if binary is None:
        wanted = f"--arch {arch}" if arch else f"the {chosen.arch} of --gpu {chosen.name}"
        raise LaunchError(f"--sass: {compiled.name} has no cubin for {wanted}; the spec builds "
                          f"{', '.join(compiled.binaries) or 'none'}")
    listing = disassemble(binary.cubin)
    if listing is None:
        raise LaunchError("--sass: nvdisasm comes from the nvidia-cuda-nvdisasm wheel, which is not installed "
                          "(pip install 'ptxgen[sass]')")
    return listing


def show_report(compiled, spec: LoadedSpec, chosen, arch: str | None, chosen_scalars: dict, model: bool,
                tensor_tflops: float) -> dict:
    """show's report of one compiled kernel (as --json prints it)."""
    from .assemble import performance_losses
    from .perf import arch_launches, evaluate_kernel, occupancy_per_arch

    # Without --arch, the launch the model prices: that of the cubin the chosen GPU runs.
    running = compiled.binary_for(chosen.arch)
    arch = arch or (chosen.arch if running is not None else None)
    variant = compiled.variant(arch)
    kind = compiled.definition
    scalars = {**kind.example_scalars(), **chosen_scalars}
    launch = compiled.launch(scalars, arch)
    traffic = kind.traffic(scalars)
    bandwidth_us = traffic.bytes / (chosen.bandwidth_gbs * 1e3)
    compute_us = traffic.flops / (tensor_tflops * 1e6)
    report = {
        "name": compiled.name, "kind": compiled.kind,
        "config": {k: v for k, v in compiled.config.items() if k not in ("name", "kind")},
        "params": [p.to_json() for p in compiled.params],
        "launch": {"rule": variant.geometry.describe(), "note": variant.note, "ptx_target": variant.target,
                   "scalars": scalars, "grid": list(launch.grid), "block": list(launch.block),
                   "dynamic_shared": launch.dynamic_shared},
        "resources": {a: {"ptx": b.target, **b.resources} for a, b in compiled.binaries.items()},
        "performance_losses": {a: losses for a, b in compiled.binaries.items()
                               if (losses := performance_losses(b.info_log))},
        "gpu_cubin": running.arch if running is not None else None,  # the cubin the chosen GPU runs
        "pdl": [target for target, v in compiled.variants.items() if v.pdl],
        "traffic": {"bytes": traffic.bytes, "flops": traffic.flops},
        "roofline_us": {"memory": bandwidth_us, "compute": compute_us, "floor": max(bandwidth_us, compute_us),
                        "bandwidth_gbs": chosen.bandwidth_gbs, "tensor_tflops": tensor_tflops},
    }
    if model and running is None:
        report["model"] = {"skipped": f"{chosen.name} is {chosen.arch}, which {spec.path} does not build"}
    elif model and not kind.verify_scalars() and kind.model_scaling() is None:
        report["model"] = {"skipped": "too large to interpret: instructions not counted"}
    elif model:
        report["model"] = evaluate_kernel(compiled, chosen, scalars=scalars)
        report["thread_instructions_per_byte"] = report["model"].get("thread_instructions_per_byte")
    fits = occupancy_per_arch(arch_launches(compiled, scalars, compiled.binaries),
                              {arch: dict(b.resources) for arch, b in compiled.binaries.items()})
    report["occupancy"] = {arch: round(fit.fraction, 4) for arch, fit in fits.items()}
    report["occupancy_detail"] = {arch: asdict(fit) for arch, fit in fits.items()}
    return report


def print_show(report: dict, gpu) -> None:
    launch = report["launch"]
    example = ", ".join(f"{k}={v}" for k, v in launch["scalars"].items()) or "(no runtime scalars)"
    out.print(f"{report['name']}  kind {report['kind']}", markup=False)
    out.print("config: " + json.dumps(report["config"], sort_keys=True), markup=False)
    print_table("parameters (PTX order)", ["param", "role", "type / shape"],
                [[p["name"], p["role"], Param.from_json(p).describe()] for p in report["params"]])
    out.print(f"launch ({launch['ptx_target']} PTX): {launch['rule']}", markup=False)
    if launch["note"]:
        out.print(f"  {launch['note']}", markup=False)
    out.print(f"  at {example}: grid={tuple(launch['grid'])} block={tuple(launch['block'])} dynamic shared="
              f"{launch['dynamic_shared']} B", markup=False)
    if report["pdl"]:
        out.print(f"programmatic dependent launch: the {', '.join(report['pdl'])} PTX starts while the previous "
                  "kernel of its stream ends and waits for it (griddepcontrol) before touching anything but its "
                  "stable arrays", markup=False)
    model = report.get("model", {})
    occupancy = report["occupancy_detail"]
    rows = []
    for arch, used in report["resources"].items():
        fit = occupancy.get(arch)
        rows.append([arch, used["ptx"], str(used["registers"]), str(used["shared_bytes"]), str(used["local_bytes"]),
                     f"{used['spill_stores']}/{used['spill_loads']}",
                     f"{fit['ctas_per_sm']} CTAs, {fit['warps_per_sm']} warps ({100 * fit['fraction']:.0f}%, "
                     f"{fit['limiter']})" if fit else "-"])
    print_table("", ["arch", "PTX", "registers", "shared B", "local B", "spill st/ld B", "occupancy"], rows)
    for arch, losses in report["performance_losses"].items():
        for loss in losses:
            out.print(f"  {arch}: the assembler reports {loss}", markup=False)
    traffic, roof = report["traffic"], report["roofline_us"]
    out.print(f"per call at {example}: {traffic['bytes']:,} bytes, {traffic['flops']:,} flops", markup=False)
    out.print(f"roofline floor on {gpu.name}: {roof['floor']:.2f} us (memory {roof['memory']:.2f} us at "
              f"{roof['bandwidth_gbs']:.0f} GB/s, compute {roof['compute']:.2f} us at {roof['tensor_tflops']} "
              "TFLOP/s)", markup=False)
    if "skipped" in model:
        out.print(f"performance model: {model['skipped']}", markup=False)
    elif "bytes_in_flight" in model:
        flight = model["bytes_in_flight"]
        out.print(f"performance model on {gpu.name} ({model['counted']}):", markup=False)
        out.print(f"  {model['thread_instructions']:,} thread-instructions = {model['thread_instructions_per_byte']} "
                  f"per byte; issue-bound {model['issue_time_us']:.2f} us at {gpu.clock_ghz} GHz", markup=False)
        if model.get("tensor_flops"):
            out.print(f"  {model['tensor_flops']:,} matrix FLOPs executed (f16-rate): {model['tensor_time_us']:.2f} us "
                      f"at {model['gpu']['tensor_tflops']:.0f} TFLOP/s", markup=False)
        ring = f", {flight['ring_per_cta']:,} a CTA of them in its mbarrier-fed ring" if flight["ring_per_cta"] else ""
        out.print(f"  bytes in flight per SM {flight['per_sm']:,}{ring} (Little's law needs {flight['needed_per_sm']:,} "
                  f"at {gpu.latency_ns:.0f} ns); {model['rounds_per_warp']} dependent load rounds a warp, "
                  f"{model['generations']} CTA generation(s)", markup=False)
        if "sass" in model:
            sass = model["sass"]
            out.print(f"  SASS of the {report['gpu_cubin']} cubin: {sass['instructions']:,} instructions, loops of "
                      f"{', '.join(map(str, sass['loop_bodies'])) or 'none'} (PTX loops of "
                      f"{', '.join(map(str, sass['ptx_loop_bodies'])) or 'none'}); in loops {sass['loop_spills']} "
                      f"spill accesses, {sass['loop_uniform_copies']} copies to uniform registers (R2UR)", markup=False)
        if "dispatch" in model:
            dispatch = model["dispatch"]
            out.print(f"  CTAs of unequal work dealt over {dispatch['slots']} resident slots in dispatch order: "
                      f"{dispatch['makespan_over_even']}x the larger of an even spread and the longest CTA; "
                      f"the longest CTA alone {dispatch['longest_over_even']}x an even spread; makespan "
                      f"{dispatch['makespan']} work units (Kind.cta_work's)", markup=False)
        out.print(f"  {model['verdict']}", markup=False)
    elif model:
        out.print(f"performance model: {model.get('verdict')}", markup=False)


# --- run and verify ------------------------------------------------------------------------------
def parse_sets(assignments: list[str]) -> dict[str, list[int]]:
    """--set NAME=VALUE[,VALUE...] into {name: [values]}."""
    values = {}
    for assignment in assignments:
        name, equals, text = assignment.partition("=")
        try:
            if not equals or not name.strip():
                raise ValueError
            parsed = [_integer(part) for part in text.split(",")]
        except ValueError:
            raise LaunchError(f"--set: expected NAME=INTEGER[,INTEGER...], got {echo(assignment)}") from None
        if name.strip() in values:
            raise LaunchError(f"--set {clip(name.strip())}: given twice")
        values[name.strip()] = parsed
    return values


def _integer(text: str) -> int:
    """An integer as Python writes one (0x40 too), or decimal with leading zeros (02)."""
    try:
        return int(text, 0)
    except ValueError:
        return int(text, 10)


def single_sets(assignments: list[str] | None, command: str) -> dict[str, int]:
    """--set NAME=VALUE options of a command that takes one value per scalar."""
    chosen = {}
    for name, values in parse_sets(assignments or []).items():
        if len(values) != 1:
            raise LaunchError(f"--set {name}: {command} takes one value, got {len(values)}")
        chosen[name] = values[0]
    return chosen


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
    inputs: Annotated[Path, typer.Option("--inputs", readable=False, help=".npz with one array per array parameter.")],
    outputs: Annotated[Path, typer.Option("--outputs", readable=False, help=".npz to write every array parameter to.")],
    spec_path: SpecOption = DEFAULT_SPEC,
    assignments: Annotated[Optional[list[str]], typer.Option("--set", help="Runtime scalar NAME=VALUE.")] = None,
    backend: Annotated[Optional[Backend], typer.Option(
        help="emulator (CPU interpreter) or device (default: device if a GPU is present).")] = None,
    arch: ArchOption = None,
    gguf: Annotated[Optional[Path], typer.Option(
        "--gguf", readable=False,
        help="GGUF file to take the kernel's quantised weight parameter (Q4_K, Q6_K, Q8_0) from.")] = None,
    tensor: Annotated[Optional[str], typer.Option("--tensor", help="Tensor name in --gguf.")] = None,
):
    """Run one kernel once on IN.npz and write every array parameter to OUT.npz."""
    from .artifacts import check_output_file
    from .npz import load_npz, save_npz, scalar_of
    from .runner import check_arguments
    from .runner import run as run_kernel

    arch = known_arch(arch)
    check_output_file(outputs, "--outputs", ".npz", inputs=(inputs, gguf))
    spec = load_spec(spec_path)
    config = spec.spec.kernel(kernel_name)
    sets = single_sets(assignments, "run")
    if (gguf is None) != (tensor is None):
        raise LaunchError("--gguf and --tensor go together")
    compiled = compile_one(spec, config)

    def scalars_of(members: dict) -> dict[str, int]:
        """The runtime scalars: 0-d arrays of their names (taken out of `members`), then --set."""
        scalars = {}
        for name in list(members):
            if members[name].ndim == 0 and name in compiled.scalar_limits:
                compiled.check_passed_scalar(name, f"--inputs {inputs}: {name}: {compiled.name}")
                scalars[name] = scalar_of(members.pop(name), f"--inputs {inputs}: {name}")
        for name, value in sets.items():
            if name in scalars:
                raise LaunchError(f"--set {name}: --inputs {inputs} gives it too; give it once")
            compiled.check_passed_scalar(name, f"--set {name}: {compiled.name}")
            scalars[name] = value
        return scalars

    def check_declared(declared: dict) -> None:
        members = dict(declared)
        check_arguments(compiled, members, scalars_of(members), complete=False)

    arrays = load_npz(inputs, "--inputs", check=check_declared)
    scalars = scalars_of(arrays)
    check_rested(compiled, arrays, inputs)
    if gguf is not None:
        arrays.update(gguf_weights(compiled, gguf, tensor, given=arrays, inputs=inputs))
    chosen = backend.value if backend else default_backend()
    results = run_kernel(compiled, arrays, scalars, backend=chosen, arch=arch)
    save_npz(outputs, results)
    err.print(f"{compiled.name}: ran on {chosen}, wrote {', '.join(results)} to {outputs}", markup=False)


def check_rested(compiled, arrays: dict, inputs: Path) -> None:
    """A workspace given in --inputs must be as a launch leaves it for the next (Kind.unrested:
    counters and queues back at 0, e.g. an earlier run's output file): other values make the
    kernel's count-ins and queues miscount, and it writes wrong results (an argmax index past x)."""
    for param in compiled.workspaces:
        if param.name in arrays:
            count = compiled.definition.unrested(param, arrays[param.name])
            if count:
                raise LaunchError(f"--inputs {inputs}: workspace {param.name!r} is not at rest: {count} word"
                                  f"{'s' if count > 1 else ''} other than a launch leaves them for the next one "
                                  "(counters and queues at 0); give it as an earlier run wrote it, or leave it out "
                                  "(zeroed)")


def gguf_weights(compiled, path: Path, tensor: str, given: dict, inputs: Path) -> dict:
    """The kernel's one quantised weight parameter (Q4_K, Q6_K, Q8_0, ...), read from a GGUF tensor
    (refused where the --inputs arrays, `given`, hold it too)."""
    from .gguf_model import load_gguf_tensor
    from .quants import QUANT_TYPES

    quantized = [p for p in compiled.params if p.layout in QUANT_TYPES]
    if len(quantized) != 1:
        raise LaunchError(f"{compiled.name}: --gguf needs a kernel with one quantised weight parameter")
    param = quantized[0]
    if param.name in given:
        raise LaunchError(f"--inputs {inputs}: {param.name} comes from --gguf {path} --tensor {tensor}; give it once")
    quant = QUANT_TYPES[param.layout]
    n, row = param.shape[-2], param.shape[-1]
    return {param.name: load_gguf_tensor(path, tensor, n, row // quant.block_bytes * quant.block_weights, quant)}


@app.command()
def verify(
    spec_path: SpecArg,
    kernel_names: Annotated[Optional[list[str]], typer.Option(
        "--kernel", metavar="NAME", help="Only this kernel; repeat for several.")] = None,
    backend: Annotated[Backend, typer.Option(help="Where to run the PTX.")] = Backend.emulator,
    seed: Annotated[int, typer.Option(min=0, help="Seed of the random inputs.")] = 0,
    arch: VerifyArchOption = None,
    sanitize: Annotated[Optional[str], typer.Option(
        "--sanitize", metavar="TOOL[,TOOL...]",
        help="With --backend device: run each kernel's checks under NVIDIA compute-sanitizer with these tools "
             "(memcheck, racecheck, synccheck, initcheck, or all) and name what they find.")] = None,
    launch_timeout: Annotated[int, typer.Option(
        "--launch-timeout", min=0, help="compute-sanitizer's wait for a process's first CUDA call, seconds (0: "
                                        "forever).")] = 120,
    as_json: JsonOption = False,
):
    """Run every kernel on random inputs and compare with its float64 reference."""
    from .device_verify import parse_tools, sanitizer_executable
    from .pipeline import compile_loaded

    arch = known_arch(arch)
    tools = parse_tools(sanitize) if sanitize is not None else []
    if tools and backend != Backend.device:
        raise LaunchError("--sanitize runs the device checks under compute-sanitizer: add --backend device (the "
                          "emulator's own sanitizer checks every run)")
    if tools:
        sanitizer_executable()  # not on PATH: the message, before any work
    spec = load_spec(spec_path)
    # every --kernel given (not only the last), each once, in the spec's order
    chosen = {spec.spec.kernel(name).name for name in kernel_names or ()}
    configs = [config for config in spec.spec.kernels if not chosen or config.name in chosen]
    kernels = compile_loaded(spec, configs).kernels
    with progress_bar("verifying", len(kernels), not as_json) as progress:
        task = progress.add_task("verifying", total=len(kernels))
        step = lambda name: progress.update(task, advance=1, description=name)  # noqa: E731
        if backend == Backend.device:
            from .device_verify import verify_on_device

            runs = verify_on_device(kernels, seed, arch, tools, launch_timeout, step)
        else:
            runs = emulate_checks(kernels, seed, arch, step)
    counts = {status: sum(run.status == status for run in runs) for status in ("pass", "fail", "not checked")}
    if as_json:
        report = {"spec": str(spec_path), "backend": backend.value, "seed": seed, "arch": arch,
                   "runs": [run.to_json() for run in runs],
                   "summary": {"passed": counts["pass"], "failed": counts["fail"],
                               "not_checked": counts["not checked"], "runs": len(runs)}}
        sys.stdout.write(json.dumps(report, sort_keys=True, indent=2) + "\n")
    else:
        print_verify(f"verify {spec_path}", runs, counts, arch, bool(tools))
    if counts["fail"]:
        raise typer.Exit(1)


def print_verify(title: str, runs: list, counts: dict[str, int], arch: str | None, sanitized: bool) -> None:
    """verify's table of checks (and of sanitizer findings), each failure's error, the summary line."""
    rows = []
    for run in runs:
        tag = f" [{run.tool}]" if run.tool else ""
        name = run_title(run, arch)
        if not run.checks and run.failure is None:
            rows.append([name, "-", "-", "-", "-", "-", "skipped (too large to interpret)"])
        for check in run.checks:
            verdict = "pass" if check.passed else f"FAIL ({check.failure})"
            element = "-" if check.element_error is None else f"{check.element_error:.2f}"
            scalars = ", ".join([*(f"{k}={v}" for k, v in check.scalars.items()),
                                 *(["again (reused workspaces)"] if check.again else []),
                                 *([f"at a grid of {check.grid}"] if check.grid else [])])
            rows.append([name, scalars,
                         f"{check.param}{list(check.shape) if check.shape else ''}", f"{check.error:.2e}", f"{check.tolerance:.1e}", element,
                         verdict + tag])
        if run.failure is not None:
            rows.append([name, "-", "-", "-", "-", "-", "FAIL (error below)" + tag])
    print_table(title, ["kernel", "scalars", "output", "rel. L2 error", "tolerance",
                        "worst element / bound", "verdict"], rows)
    if sanitized:
        print_table("compute-sanitizer", ["kernel", "tool", "errors", "findings"],
                    [[run_title(run, arch), run.tool, "-" if run.errors is None else str(run.errors),
                      "; ".join(finding.describe() for finding in run.findings) or "none"] for run in runs])
    for run in runs:
        if run.failure is not None:
            err.print(f"FAIL {run_title(run, arch)}{f' [{run.tool}]' if run.tool else ''}: {run.failure}",
                      markup=False)
    # one line a CI log can be read by: a kernel too large to interpret is checked by nothing
    err.print(f"verify: {counts['pass']} passed, {counts['fail']} failed, {counts['not checked']} not checked (too "
              f"large to interpret) of {plural(len(runs), 'kernel run')}", markup=False)


def run_title(run, arch: str | None) -> str:
    """A run's name in verify's text: the arch of the PTX variant it ran beside it, unless --arch chose it."""
    return f"{run.kernel} ({run.target})" if run.target and not arch else run.kernel


def emulate_checks(kernels, seed: int, arch: str | None, progress) -> list:
    """verify's checks in the PTX interpreter (its sanitizer on), a KernelRun a kernel and PTX:
    with `arch`, the variant that arch runs; without, the portable PTX and each other one the
    kernel builds (its sm_90a variant is another kernel, not the portable one plus a flag; its
    sm_90 PDL variant issues some loads before its griddepcontrol.wait).
    A sanitizer finding or PTX the interpreter cannot run fails that run, with the checks made
    before it; the next kernels are still checked."""
    from .device_verify import KernelRun
    from .errors import InterpError
    from .verify import verify_plan, verify_sizes

    runs = []
    for compiled in kernels:
        progress(compiled.name)
        targets = [arch] if arch else [None, *(target for target in compiled.variants
                                               if target != compiled.portable.target)]
        for label, kernel, sizes in verify_plan(compiled):
            for target in targets:
                run = KernelRun(label, None, target=target)
                try:
                    for checks in verify_sizes(kernel, sizes, seed, arch=target):
                        run.checks += checks
                except InterpError as error:
                    run.failure = str(error)
                runs.append(run)
    return runs


# --- bench -----------------------------------------------------------------------------------------
class PeerTiming(str, Enum):
    all = "all"
    once = "once"
    none = "none"


class TuneRank(str, Enum):
    median = "median"
    batch = "batch"
    graph = "graph"


@app.command()
def bench(
    kernel: Annotated[Optional[str], typer.Argument(
        metavar="KERNEL", help="Kernel name in the spec, or a kind (its first instance); all kernels if omitted.")] = None,
    spec_path: SpecOption = DEFAULT_SPEC,
    assignments: Annotated[Optional[list[str]], typer.Option(
        "--set", help="Runtime scalar NAME=VALUE; a comma list VALUE,VALUE,... sweeps (one row each).")] = None,
    iters: Annotated[int, typer.Option("--iters", min=100, help="Timed runs per figure.")] = 100,
    json_path: Annotated[Optional[Path], typer.Option("--json", readable=False,
                                                      help="Write every figure to this JSON file.")] = None,
    plot_path: Annotated[Optional[Path], typer.Option(
        "--plot", readable=False, help="Write a roofline-style chart (PNG; needs matplotlib).")] = None,
    graph: Annotated[bool, typer.Option("--graph", help="Also time each kernel as CUDA-graph replays.")] = False,
    tune_fields: Annotated[Optional[list[str]], typer.Option(
        "--tune", help="Config FIELD=VALUE,VALUE,... of KERNEL (dotted into a table: sm90a.block_n): time every "
                       "combination beside the spec's config and print the fastest's spec entry.")] = None,
    rank: Annotated[TuneRank, typer.Option("--rank", help="The --tune figure that ranks variants: each run alone "
                                                          "(median), back to back (batch) or graph replays.")]
        = TuneRank.median,
    peers: Annotated[PeerTiming, typer.Option(
        "--peers", help="Time the peers of every row (all), none, or once for rows of one kind with the same "
                        "shapes and scalars, and a fused kind's separate kernels likewise (once: variants of a "
                        "kernel's schedule; --tune always does)."
    )] = PeerTiming.all,
):
    """Check kernels on the GPU, then time them: median/p10/p90, GB/s, TFLOP/s, % of copy bandwidth, peers."""
    import itertools

    from .artifacts import check_output_file
    from .bench import failures, plot, print_results, require_matplotlib, run_bench, write_json
    from .device import driver
    from .pipeline import compile_loaded
    from . import tune

    spec = load_spec(spec_path)
    for path, option, suffix in ((json_path, "--json", ".json"), (plot_path, "--plot", ".png")):
        if path is not None:
            check_output_file(path, option, suffix, inputs=(spec.path,))
    sweeps = parse_sets(assignments or [])
    fields = tune.parse_tune(tune_fields or [])
    if rank is not TuneRank.median and not fields:
        raise LaunchError("--rank: ranks the variants of --tune; give --tune FIELD=VALUE,... too")
    if rank is TuneRank.graph and not graph:
        raise LaunchError("--rank graph: graph replays are timed only with --graph")
    if fields and not kernel:
        raise LaunchError("--tune: name the kernel to tune (ptxgen bench KERNEL --tune FIELD=VALUE,...)")
    made = skipped = None
    if fields:
        tuned = spec.spec.find(kernel)
        made, skipped = tune.variants(spec, tuned, fields)
    # No driver or GPU: DeviceUnavailable (exit 2) before anything costly.
    driver(instead="bench times kernels on a GPU (ptxgen show gives the performance model without one)")
    if plot_path is not None:
        require_matplotlib()
    if made:
        made = tune.compile_variants(spec, made, skipped)
        compiled = [variant.compiled for variant in made]
    else:
        configs = [spec.spec.find(kernel)] if kernel else list(spec.spec.kernels)
        compiled = compile_loaded(spec, configs).kernels
    if not kernel:
        known = set().union(*(c.scalar_limits for c in compiled))
        for scalar in sweeps:
            if scalar not in known:
                raise LaunchError(f"--set {scalar}: no kernel of {spec.path} takes a runtime scalar of that name")
    plan = []
    for one in compiled:
        names = [scalar for scalar in sweeps if kernel or scalar in one.scalar_limits]
        for values in itertools.product(*(sweeps[scalar] for scalar in names)):
            scalars = {**one.definition.example_scalars(), **dict(zip(names, values))}
            one.check_scalars(scalars)  # a bad --set stops here, before any GPU work
            plan.append((one, scalars))
    extra = {"tune": tune.summary(tuned.name, fields, rank.value, made, skipped)} if made else {}
    with progress_bar("benchmarking", len(plan), len(plan) > 1) as progress:
        task = progress.add_task("benchmarking", total=len(plan))
        results = run_bench({"file": str(spec.path), "sha256": spec.sha256}, plan, iters, graph,
                            progress=lambda label: progress.update(task, advance=1, description=label),
                            row_done=(lambda so_far: write_json(json_path, {**so_far, **extra})) if json_path
                            else lambda _: None, peers="once" if made else peers.value)
    results.update(extra)
    print_results(results, out, err)
    if made:
        results["tune"]["fastest"] = tune.fastest(results, tuned.name, made, rank.value)
        tune.print_tune(results, made, out, err)
    if json_path is not None:
        write_json(json_path, results)
        err.print(f"wrote {json_path}", markup=False)
    if plot_path is not None:
        plot(plot_path, results)
        err.print(f"wrote {plot_path}", markup=False)
    problems = failures(results)
    for line in problems:
        err.print(f"FAIL {line}", markup=False)
    if problems:
        raise typer.Exit(1)


# --- specs for models ------------------------------------------------------------------------------
OutputSpec = Annotated[Optional[Path], typer.Option("--output", "-o", readable=False,
                                                    help="Write the spec here (default: print it).")]
ForceOption = Annotated[bool, typer.Option("--force", help="Replace an existing --output file.")]
# No min=1: ModelConfig.cache_positions refuses 0 in one line (click's usage error takes four).
MaxSeqLen = Annotated[Optional[int], typer.Option("--max-seq-len", help="KV-cache length (default: the model's "
                                                                        "context length).")]
Prefix = Annotated[Optional[str], typer.Option("--prefix", help="Kernel name prefix (default: from the model).")]


def emit_spec(make_text, output: Path | None, force: bool, source: Path) -> None:
    """The spec `make_text()` generates from `source`, printed or written to `output` (checked
    before any work: its name, that it is not `source`, that it may be replaced)."""
    from .artifacts import check_output_file
    from .specgen import write_spec

    if output is not None:
        if output.suffix.lower() != ".toml":
            raise PtxgenError(f"--output {output}: the spec is written as TOML; give a .toml file name")
        check_output_file(output, "--output", inputs=(source,))
        if output.exists() and not force:
            raise PtxgenError(f"--output {output}: already exists; refusing to replace it (--force replaces it)")
    text = make_text()
    if output is None:
        sys.stdout.write(text)
        return
    write_spec(text, output, overwrite=force)
    err.print(f"wrote {output}", markup=False)


@spec_app.command("from-gguf")
def spec_from_gguf_command(model: Annotated[Path, typer.Argument(readable=False, help="A .gguf model file.")],
                           output: OutputSpec = None,
                           max_seq_len: MaxSeqLen = None, prefix: Prefix = None, force: ForceOption = False):
    """Every kernel a GGUF model needs (its shapes, its tensors' quant types, its rope convention):
    those ptxgen generate launches, and prefill attention."""
    from .specgen import spec_from_gguf

    emit_spec(lambda: spec_from_gguf(model, max_seq_len, prefix), output, force, model)


@spec_app.command("from-hf")
def spec_from_hf_command(config: Annotated[Path, typer.Argument(readable=False, help="A Hugging Face config.json.")],
                         quant: Annotated[str, typer.Option("--quant", help="Weight type: q4_k, q6_k or q8_0.")],
                         output: OutputSpec = None, max_seq_len: MaxSeqLen = None, prefix: Prefix = None,
                         force: ForceOption = False):
    """Every kernel a Hugging Face model needs, with every matrix of the given quant type."""
    from .specgen import spec_from_hf_config

    emit_spec(lambda: spec_from_hf_config(config, quant, max_seq_len, prefix), output, force, config)


# --- generate -------------------------------------------------------------------------------------------
def parse_tokens(text: str) -> list[int]:
    """--tokens: decimal ids in ASCII digits (int() would also take 1_0, +5 or other scripts' digits)."""
    parts = text.split(",")
    if not all(re.fullmatch(r"\s*-?[0-9]+\s*", part) for part in parts):
        raise PtxgenError(f"--tokens: expected comma-separated token ids (e.g. 1,2,3), got {text!r}")
    return [int(part) for part in parts]


@app.command()
def generate(
    model: Annotated[Path, typer.Argument(readable=False,
                                          help="A .gguf model file (qwen3 or llama; matrices Q4_K, Q6_K or Q8_0).")],
    tokens: Annotated[Optional[str], typer.Option("--tokens", help="Prompt token ids, comma-separated (or "
                                                  "--prompt).")] = None,
    prompt_text: Annotated[Optional[str], typer.Option("--prompt", help="Prompt text, encoded by the model file's "
                                                       "tokenizer (byte-level BPE: Qwen2/3, Llama 3); the generated "
                                                       "tokens are printed as text.")] = None,
    chat: Annotated[bool, typer.Option("--chat", help="--prompt as a user's message in the model file's chat "
                                       "template (tokenizer.chat_template), the assistant's turn opened.")] = False,
    system: Annotated[Optional[str], typer.Option("--system", help="With --chat: a system message before the "
                                                  "prompt.")] = None,
    think: Annotated[Optional[bool], typer.Option("--think/--no-think", help="With --chat: the template's "
                                                  "enable_thinking (Qwen3; default: the template's own).",
                                                  show_default=False)] = None,
    max_new: Annotated[int, typer.Option("--max-new", help="Tokens to generate at most.")] = 16,
    ignore_eos: Annotated[bool, typer.Option("--ignore-eos", help="Do not stop at an end-of-generation token "
                                             "(the file's eos/eot/eom ids, <|im_end|>, <|eot_id|>, ...).")] = False,
    backend: Annotated[Backend, typer.Option(help="device (GPU) or emulator (the PTX interpreter on the CPU: "
                                                  "small models only).")] = Backend.device,
    fused: Annotated[Optional[bool], typer.Option("--fused/--separate", help="The layers as one persistent_decoder "
                                                  "launch a token, or as launches of the separate kernels (default: "
                                                  "fused where the model allows it: each layer's ffn_gate and ffn_up "
                                                  "of one type).", show_default=False)] = None,
    max_seq_len: Annotated[Optional[int], typer.Option("--max-seq-len", help="KV-cache positions "
                                                       "(default: the model's context length).")] = None,
    save_logits: Annotated[Optional[Path], typer.Option("--save-logits", readable=False, help="Write the logits of "
                                                        "each generated token, float32 [generated, vocab], to this "
                                                        ".npy file.")] = None,
    as_json: JsonOption = False,
):
    """Greedy decoding with ptxgen's kernels: each token's embedding row (dequantised on the host),
    every layer, the final norm, the lm_head GEMV and argmax on the device, the KV cache kept there.
    The prompt is fed through the same decode kernels one token at a time (no prefill kernel).
    tokens/s counts the decode steps after the first new token, wall clock, launches included.
    The layers run as the persistent decoder unless the model rules it out or --separate is given:
    on an H200 (2026-11-28, Qwen3-8B's 36 layers at pos 4095, one call at a time) its one launch
    took 2060 us on the wall clock, the separate kernels launched one by one from Python 3220.
    Generation stops after an end-of-generation token, as llama.cpp's does, unless --ignore-eos."""
    import io

    import numpy as np

    from .artifacts import check_output_file, write_file
    from .chat import chat_prompt
    from .generate import Generator, check_request, step_kernels
    from .gguf_model import GGUFModel
    from .tokenizer import Tokenizer

    if (tokens is None) == (prompt_text is None):
        raise PtxgenError("give the prompt as --prompt TEXT or as --tokens IDS (one of them)")
    if chat and tokens is not None:
        raise PtxgenError("--chat: give the user's message as --prompt TEXT (--tokens are ids, not a message)")
    for option, value in (("--system", system), ("--think" if think else "--no-think", think)):
        if value is not None and not chat:
            raise PtxgenError(f"{option} is a chat setting: give it with --chat")
    prompt = parse_tokens(tokens) if tokens is not None else None
    if save_logits is not None:
        check_output_file(save_logits, "--save-logits", ".npy", inputs=(model,))
    loaded = GGUFModel(model)
    tokenizer = Tokenizer(loaded)
    if chat:
        prompt_text = chat_prompt(loaded, tokenizer, prompt_text, system, think)
    if prompt is None:
        prompt = tokenizer.encode(prompt_text)
    # Known before any work: --prompt needs the text of whatever the model outputs; --tokens prints ids.
    undecodable = tokenizer.undecodable(loaded.config.vocab_size)
    if undecodable and prompt_text is not None:
        raise PtxgenError(undecodable)
    check_request(loaded.config, max_seq_len, prompt, max_new, "--tokens" if tokens is not None else "--prompt")
    # Planned once, before any note: a model no path can take is one error.
    kernels = step_kernels(loaded.config, loaded.config.cache_positions(max_seq_len))
    if fused is None:
        fused = kernels.fused_refusal is None
        if not fused:
            err.print(f"note: the layers run as separate kernels: {kernels.fused_refusal}", markup=False)
    with progress_bar("loading", 0, True) as progress:
        task = progress.add_task("loading weights", total=None)
        generator = Generator(loaded, backend.value, fused=fused, kernels=kernels,
                              progress=lambda done, total, tensor: progress.update(task, completed=done, total=total,
                                                                                   description=tensor))
    try:
        result = generator.generate(prompt, max_new, keep_logits=save_logits is not None,
                                    stop_tokens=frozenset() if ignore_eos else tokenizer.end_of_generation)
    finally:
        generator.close()
    if save_logits is not None:
        buffer = io.BytesIO()
        np.save(buffer, result.logits)
        write_file(save_logits, buffer.getvalue(), "--save-logits")
    rate = result.tokens_per_s
    layers = "persistent_decoder" if fused else "separate kernels"
    text = None if undecodable else tokenizer.decode(result.tokens)
    if as_json:
        summary = {"prompt_text": prompt_text, "prompt_tokens": result.prompt, "generated_tokens": result.tokens,
                   "text": text, "stop": result.stop, "tokens_per_s": rate, "decode_steps": result.decode_steps,
                   "device": generator.device, "backend": backend.value, "layers": layers,
                   "max_seq_len": generator.max_seq_len}
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
        return
    if prompt_text is not None:
        write_text(text + "\n")
    else:
        out.print(",".join(map(str, result.tokens)), markup=False)
    speed = f"{rate:.1f} tokens/s over {plural(result.decode_steps, 'decode step')}" if rate else "no decode step timed"
    stopped = f"; stopped at end-of-generation token {result.tokens[-1]}" if result.stop == "eos" else ""
    err.print(f"{len(prompt)} prompt + {len(result.tokens)} generated tokens on {generator.device} (layers: {layers}): "
              f"{speed}{stopped}", markup=False)


def write_text(text: str) -> None:
    """Text of any content on standard output: characters its encoding lacks (an ASCII or Latin-1
    locale's) as '?', not a UnicodeEncodeError."""
    encoding = sys.stdout.encoding or "utf-8"
    sys.stdout.write(text.encode(encoding, "replace").decode(encoding))


# --- the cache ----------------------------------------------------------------------------------------
@cache_app.command("info")
def cache_info():
    """Where the cache is, how many cubins it holds and their size."""
    from .cache import Cache, check_cache_root
    from .settings import SETTINGS

    check_cache_root(SETTINGS.cache_dir)
    if not SETTINGS.cache_dir.is_dir():
        out.print(f"{SETTINGS.cache_dir}: empty (not created yet)", markup=False)
        return
    info = Cache(SETTINGS.cache_dir).info()
    out.print(f"{info.root}: {plural(info.entries, 'entry', 'entries')}, {info.bytes / 1e6:.1f} MB", markup=False)


@cache_app.command("clean")
def cache_clean():
    """Remove every cached cubin (and Jinja's compiled templates)."""
    from .cache import Cache, check_cache_root
    from .settings import SETTINGS

    check_cache_root(SETTINGS.cache_dir)
    removed = Cache(SETTINGS.cache_dir).clean()
    out.print(f"{SETTINGS.cache_dir}: removed {plural(removed, 'entry', 'entries')}", markup=False)


def main() -> None:
    """Entry point: the one error boundary of the CLI (usage errors exit 2 inside typer)."""
    try:
        if sys.stdout is None:  # started with file descriptor 1 closed
            raise PtxgenError("standard output is closed; ptxgen prints its results there (redirect it to a file or "
                              "/dev/null)")
        try:
            app()
        finally:
            sys.stdout.flush()
    except PtxgenError as error:
        err.print(f"[red]error:[/red] {escape(str(error))}")
        sys.exit(2)
    except OSError as error:  # files are read and written under os_errors: this is standard output, full or gone
        with contextlib.suppress(OSError, ValueError):  # nothing left to flush at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        where = f"{error.filename}" if error.filename else "standard output: cannot write"
        err.print(f"[red]error:[/red] {escape(where)} ({escape(error.strerror or str(error))})")
        sys.exit(2)
    except SystemExit as done:
        if done.code == 130:  # typer's exit for a KeyboardInterrupt in a command, which it does not report
            err.print("interrupted", markup=False)
        raise
    except KeyboardInterrupt:
        err.print("interrupted", markup=False)
        sys.exit(130)


if __name__ == "__main__":
    main()
