"""The build pipeline as an ordered table of stages: spec entry -> ptx -> cubin -> CompiledKernel.

Each stage fills the per-kernel state a CompiledKernel is made of; cubins come through the
content-addressed cache. Nothing is written to an output folder until every kernel of every arch
has assembled (artifacts.py then writes the folder whole), so a failure leaves no half build.
"""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing
import signal
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from pydantic import ValidationError

from . import __version__
from .archs import ARCHS, format_version
from .assemble import (OPTIONS, assemble, assembler_for, assembler_version, parse_resources, performance_losses,
                       resolve_assembler)
from .cache import Cache, cache_key
from .compiled import Binary, CompiledKernel, Variant, serving_variant
from .errors import AssemblerError, PtxgenError, SpecError
from .kernels import kind_of, rendered_targets
from .render import render
from .settings import SETTINGS
from .spec import LoadedSpec, Spec, Target


@dataclass
class Unit:
    """One kernel of the spec travelling through the stages."""

    config: object
    variants: dict[str, Variant] = field(default_factory=dict)
    binaries: dict[str, Binary] = field(default_factory=dict)
    assembler: dict[str, str] = field(default_factory=dict)


@dataclass
class BuildOptions:
    assembler: str = "auto"
    jobs: int = 1
    use_cache: bool = True
    progress: Callable[[str], None] = lambda label: None
    report: Callable[[str], None] = lambda message: None  # e.g. a cache entry found corrupt


@dataclass
class Compiled:
    kernels: list[CompiledKernel]
    assembled: int  # kernel x arch pairs assembled now (cache misses)
    cached: int


def stage_ptx(spec: Spec, units: list[Unit], options: BuildOptions) -> None:
    """The portable PTX (`.target` the spec's oldest arch) and each variant the kind renders on its
    own for the spec's archs (kernels.rendered_targets: sm_90a where listed, the PDL PTX where an
    arch of sm_90 or later is)."""
    for unit in units:
        variants = rendered_targets(unit.config, spec.target.archs)
        for own in [None, *variants]:
            kind = kind_of(unit.config, own)
            version = spec.ptx_version(unit.config, own)
            target = own or spec.ptx_target
            ptx = render(unit.config, version, target, own, compiled_templates=options.use_cache)
            params, maps = {param.name: param for param in kind.params()}, kind.tensor_maps()
            for tensor_map in maps:
                tensor_map.check(params[tensor_map.array])
            unit.variants[target] = Variant(target, ptx, format_version(version), kind.geometry(), kind.launch_note(),
                                            pdl=kind.pdl, tensor_maps=maps)


def stage_cubin(spec: Spec, units: list[Unit], options: BuildOptions) -> tuple[int, int]:
    """One cubin per (kernel, arch), from the PTX that serves that arch (compiled.serving_variant:
    its own variant, else the newest one for an older arch that is not arch-specific), by the
    assembler that PTX gets (assemble.assembler_for)."""
    chosen = resolve_assembler(options.assembler)
    versions: dict[str, str] = {}
    cache = Cache(SETTINGS.cache_dir if options.use_cache else None, report=options.report)
    misses = []
    for unit in units:
        portable = next(iter(unit.variants.values()))
        for arch in spec.target.archs:
            variant = serving_variant(unit.variants, arch) or portable
            assembler = assembler_for(chosen, variant.ptx)
            if assembler not in versions:
                versions[assembler] = assembler_version(assembler)
            version = versions[assembler]
            unit.assembler[arch] = f"{assembler} {version}"
            key = cache_key(variant.ptx, arch, assembler, version, OPTIONS)
            hit = cache.get(key)
            if hit:
                unit.binaries[arch] = Binary(arch, variant.target, hit[0], hit[1], parse_resources(hit[1], hit[0]))
                note_assembler_losses(unit, arch, options)
                options.progress(f"{unit.config.name} {arch} (cached)")
            else:
                misses.append((unit, arch, variant, key, assembler))
    jobs = min(options.jobs, len(misses))
    if jobs > 1:
        # spawn, not fork: a forked child of a process whose libraries started threads can deadlock
        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=end_on_ctrl_c) as pool:
            try:
                with ctrl_c_held():  # submit starts the assembler processes
                    futures = [pool.submit(assemble, assembler, variant.ptx, arch, OPTIONS)
                               for _, arch, variant, _, assembler in misses]
                for (unit, arch, variant, key, _), future in zip(misses, futures):
                    try:
                        assembled = future.result()
                    except AssemblerError as error:
                        raise naming(unit, error) from None
                    except BrokenProcessPool:
                        raise PtxgenError(f"{unit.config.name} {arch}: an assembler process (--jobs) ended abruptly "
                                          "(killed, or out of memory); nothing was written: build again, or with "
                                          "fewer --jobs") from None
                    record(cache, unit, arch, variant, key, assembled, options)
            except KeyboardInterrupt:
                with ctrl_c_held():
                    stop(pool)
                raise
            except AssemblerError:  # nothing is written: the queued assemblies are not waited for
                stop(pool)
                raise
    else:
        for unit, arch, variant, key, assembler in misses:
            try:
                assembled = assemble(assembler, variant.ptx, arch, OPTIONS)
            except AssemblerError as error:
                raise naming(unit, error) from None
            record(cache, unit, arch, variant, key, assembled, options)
    for unit in units:
        # the spec's arch order, whichever cubins came from the cache: the header lists them in it
        unit.binaries = {arch: unit.binaries[arch] for arch in spec.target.archs}
        for arch, binary in unit.binaries.items():
            check_launchable(unit, arch, binary)
    return len(misses), len(units) * len(spec.target.archs) - len(misses)


def naming(unit: Unit, error: AssemblerError) -> AssemblerError:
    """The assembler's error with the kernel it was assembling named first (its log's line
    numbers are that kernel's PTX's)."""
    return AssemblerError(f"kernel {unit.config.name!r}: {error.message}", log=error.log, repro=error.repro)


@contextlib.contextmanager
def ctrl_c_held():
    """Ctrl-C (SIGINT) held back meanwhile and raised as the block ends; processes started meanwhile
    start with SIGINT blocked (a blocked signal stays blocked through exec). Blocking it in this
    thread is not enough: numpy's OpenBLAS threads do not block it, the kernel then delivers it to
    one of them, and Python raises KeyboardInterrupt in the main thread wherever it is, say inside
    ProcessPoolExecutor.submit between starting a worker and recording it: a worker the pool never
    stops, and which multiprocessing's exit waits for, forever. So the Python handler is swapped
    too, for one that only notes the signal (not SIG_IGN, which a background job starts with: the
    processes started meanwhile inherit that)."""
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no signal masks, no process groups
        yield
        return
    pressed = []
    handler = signal.getsignal(signal.SIGINT)
    noted = callable(handler) and threading.current_thread() is threading.main_thread()
    if noted:  # first: once it is in place, no KeyboardInterrupt can interrupt this
        signal.signal(signal.SIGINT, lambda signum, frame: pressed.append(signum))
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # one pending on this thread is noted here
        if noted:
            signal.signal(signal.SIGINT, handler)
            if pressed:
                signal.raise_signal(signal.SIGINT)  # to the handler it had: KeyboardInterrupt, here


def end_on_ctrl_c() -> None:
    """An assembler process's first step (the pool's initializer): Ctrl-C ends it as it ends a C
    program, without a KeyboardInterrupt traceback of its own (Ctrl-C reaches the whole process
    group; the build reports it, once), and a ptxas it runs inherits that; ignored if the build
    ignores it (a background job). It starts with SIGINT blocked (ctrl_c_held): a Ctrl-C pressed
    meanwhile ends it here."""
    if hasattr(signal, "pthread_sigmask"):
        if signal.getsignal(signal.SIGINT) != signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def stop(pool: ProcessPoolExecutor) -> None:
    """End an interrupted (or failed) build's assembler processes now (a Ctrl-C has ended them already, a
    SIGINT to this process alone has not), and with them its queued work: the pool's thread then
    finds them gone, fails the rest and ends, and leaving the `with` block waits for no assembly.
    The pool's own end of its result pipe is closed too: a process ended while sending a cubin
    leaves the thread reading the rest of it, which then ends at end of file instead of never.
    (Private attributes, CPython 3.10-3.13; 3.14 has ProcessPoolExecutor.terminate_workers.)"""
    for worker in list(pool._processes.values()):
        worker.terminate()
    pool._result_queue._writer.close()


def check_launchable(unit: Unit, arch: str, binary: Binary) -> None:
    """A cubin of which no CTA fits an SM's registers could never launch: refused, not shipped
    (the templates' .maxntid lets ptxas keep it within them)."""
    threads = math.prod(unit.variants[binary.target].geometry.block)
    registers = binary.resources["registers"]
    if not ARCHS[arch].fits_registers(threads, registers):
        raise AssemblerError(f"kernel {unit.config.name!r}: {arch}: a CTA of {threads} threads at {registers} "
                             f"registers each does not fit an SM's {ARCHS[arch].registers_per_sm} registers: it "
                             "could never launch")


def record(cache: Cache, unit: Unit, arch: str, variant: Variant, key: str, assembled, options: BuildOptions) -> None:
    cache.put(key, assembled.cubin, assembled.info_log)
    unit.binaries[arch] = Binary(arch, variant.target, assembled.cubin, assembled.info_log,
                                 parse_resources(assembled.info_log, assembled.cubin))
    note_assembler_losses(unit, arch, options)
    options.progress(f"{unit.config.name} {arch}")


def note_assembler_losses(unit: Unit, arch: str, options: BuildOptions) -> None:
    """A note for each performance loss the assembler reports (assemble.performance_losses): a
    setmaxnreg ignored (nvJitLink, C7504: one register budget for every warp, which may spill),
    wgmmas serialised (C7509, C7512, ...: each waits for the one before), ..."""
    for loss in performance_losses(unit.binaries[arch].info_log):
        hint = "; install ptxgen[ptxas] to assemble it as a whole program, which keeps it" if "(C7504)" in loss else ""
        options.report(f"{unit.config.name} {arch}: {unit.assembler[arch]}: {loss}{hint}")


STAGES = {"ptx": stage_ptx, "cubin": stage_cubin}


def compile_spec(spec: Spec, options: BuildOptions | None = None, until: str = "cubin") -> Compiled:
    """Run the stages in order up to and including `until`; one CompiledKernel per spec entry."""
    options = options or BuildOptions()
    units = [Unit(config) for config in spec.kernels]
    counts = (0, 0)
    for name, stage in STAGES.items():
        counts = stage(spec, units, options) or counts
        if name == until:
            break
    return Compiled([compiled_of(unit) for unit in units], *counts)


def compile_loaded(loaded: LoadedSpec, kernels=None, options: BuildOptions | None = None,
                   until: str = "cubin") -> Compiled:
    """compile_spec of a spec file's kernels (those of `kernels` where given): a kernel its PTX
    refuses (render: a name its PTX uses, a value out of range) is named after the file, as
    load_spec's errors are."""
    spec = loaded.spec if kernels is None else loaded.spec.model_copy(update={"kernels": tuple(kernels)})
    try:
        return compile_spec(spec, options, until)
    except SpecError as error:
        raise SpecError(f"{loaded.path}: {error}") from None


def compiled_of(unit: Unit) -> CompiledKernel:
    kind = kind_of(unit.config)
    return CompiledKernel(
        name=unit.config.name,
        kind=kind.name,
        config=unit.config.model_dump(mode="json"),
        params=tuple(kind.params()),
        scalar_limits={name: tuple(limits) for name, limits in kind.scalar_limits().items()},
        variants=dict(unit.variants),
        binaries=dict(unit.binaries),
        assembler=dict(unit.assembler),
    )


def compile_kernel(config, archs: tuple[str, ...] = ("sm_80",), ptx_version: str | None = None,
                   options: BuildOptions | None = None, until: str = "cubin") -> CompiledKernel:
    """One kernel config (as from a spec entry) compiled for `archs`, through the same stages."""
    try:
        spec = Spec(target=Target(archs=archs, ptx_version=ptx_version), kernels=(config,))
    except ValidationError as error:
        raise SpecError(f"kernel {config.name!r}: {error.errors()[0]['msg']}") from None
    return compile_spec(spec, options, until).kernels[0]


def compiler(archs: tuple[str, ...], options: BuildOptions | None = None,
             until: str = "cubin") -> Callable[[object], CompiledKernel]:
    """compile_kernel for `archs`, memoised per config (a multi-kernel step compiles each kernel once)."""
    memo: dict[str, CompiledKernel] = {}

    def compiled_of(config) -> CompiledKernel:
        key = json.dumps(config.model_dump(mode="json"), sort_keys=True)
        if key not in memo:
            memo[key] = compile_kernel(config, archs, options=options, until=until)
        return memo[key]

    return compiled_of


def manifest_of(spec: LoadedSpec, kernels: list[CompiledKernel]) -> dict:
    return {
        "ptxgen_version": __version__,
        "spec": {"file": Path(spec.path).name, "sha256": spec.sha256},
        "archs": list(spec.spec.target.archs),
        "kernels": {kernel.name: kernel.manifest_entry() for kernel in kernels},
    }


def artifact_files(spec: LoadedSpec, kernels: list[CompiledKernel]) -> dict[str, bytes]:
    """Every file of the artifact folder, relative path -> bytes: PTX, cubins, the C header, and
    manifest.json (which lists the others with their digests)."""
    from .header import header_name, render_header

    files = {}
    for kernel in kernels:
        files.update(kernel.files())
    manifest = manifest_of(spec, kernels)
    files[header_name(spec.path)] = render_header(manifest).encode()
    files["manifest.json"] = (json.dumps(manifest, sort_keys=True, indent=2) + "\n").encode()
    return files
