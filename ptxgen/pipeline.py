"""The build pipeline as an ordered table of stages: spec -> ptx -> cubin, then the artifacts.

Each stage fills the per-kernel metadata that becomes the manifest. Nothing is written to the
output folder until every kernel of every arch has assembled, so a failure leaves no half build.
"""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import __version__
from .cache import Cache, cache_key, write_if_changed
from .device import ASSEMBLERS, Assembled, assembler_version, parse_resources, resolve_assembler
from .archs import format_version
from .kernels import kind_of
from .settings import SETTINGS
from .spec import LoadedSpec

ASSEMBLER_OPTIONS = {"verbose": True}  # part of the cache key


@dataclass
class Unit:
    """One kernel of the spec travelling through the stages."""

    kernel: object
    ptx: str = ""
    cubins: dict[str, bytes] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)


@dataclass
class BuildOptions:
    assembler: str = "auto"
    jobs: int = 1
    use_cache: bool = True
    progress: Callable[[str], None] = lambda label: None


@dataclass
class BuildResult:
    manifest: dict
    assembled: int  # kernel x arch pairs assembled now (cache misses)
    cached: int


def stage_ptx(spec: LoadedSpec, units: list[Unit], options: BuildOptions) -> None:
    for unit in units:
        kernel, kind = unit.kernel, kind_of(unit.kernel)
        version = spec.spec.ptx_version(kernel)
        unit.ptx = spec.spec.ptx(kernel)
        unit.meta.update(
            kind=kind.name,
            config=kernel.model_dump(mode="json"),
            ptx=f"{kernel.name}.ptx",
            ptx_sha256=hashlib.sha256(unit.ptx.encode()).hexdigest(),
            ptx_version=format_version(version),
            ptx_target=spec.spec.ptx_target,
            params=[{"name": p.name, "dtype": p.dtype, "shape": list(p.shape), "role": p.role} for p in kind.params()],
            launch=kind.launch_rule(),
            scalar_limits={name: list(limits) for name, limits in kind.scalar_limits().items()},
        )


def assemble_one(assembler: str, ptx: str, arch: str) -> Assembled:
    """Module-level so worker processes can run it."""
    return ASSEMBLERS[assembler](ptx, arch)


def stage_cubin(spec: LoadedSpec, units: list[Unit], options: BuildOptions) -> tuple[int, int]:
    assembler = resolve_assembler(options.assembler)
    version = assembler_version(assembler)
    cache = Cache(SETTINGS.cache_dir if options.use_cache else None)
    misses = []
    for unit in units:
        for arch in spec.spec.target.archs:
            key = cache_key(unit.ptx, arch, assembler, version, ASSEMBLER_OPTIONS)
            hit = cache.get(key)
            if hit:
                record_cubin(unit, arch, Assembled(*hit))
                options.progress(f"{unit.kernel.name} {arch} (cached)")
            else:
                misses.append((unit, arch, key))
    jobs = min(options.jobs, len(misses))
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(assemble_one, assembler, unit.ptx, arch) for unit, arch, _ in misses]
            results = [future.result() for future in futures]
    else:
        results = [assemble_one(assembler, unit.ptx, arch) for unit, arch, _ in misses]
    for (unit, arch, key), assembled in zip(misses, results):
        cache.put(key, assembled.cubin, assembled.info_log)
        record_cubin(unit, arch, assembled)
        options.progress(f"{unit.kernel.name} {arch}")
    for unit in units:
        unit.meta["assembler"] = {"name": assembler, "version": version}
    return len(misses), len(units) * len(spec.spec.target.archs) - len(misses)


def record_cubin(unit: Unit, arch: str, assembled: Assembled) -> None:
    unit.cubins[arch] = assembled.cubin
    unit.meta.setdefault("cubins", {})[arch] = {
        "file": f"{arch}/{unit.kernel.name}.cubin",
        "sha256": hashlib.sha256(assembled.cubin).hexdigest(),
        "info_log": assembled.info_log,
        **parse_resources(assembled.info_log),
    }


STAGES = {"ptx": stage_ptx, "cubin": stage_cubin}


def build(spec: LoadedSpec, options: BuildOptions, until: str = "cubin") -> tuple[list[Unit], int, int]:
    """Run the stages in order up to and including `until`."""
    units = [Unit(kernel) for kernel in spec.spec.kernels]
    counts = (0, 0)
    for name, stage in STAGES.items():
        counts = stage(spec, units, options) or counts
        if name == until:
            break
    return units, *counts


def manifest_of(spec: LoadedSpec, units: list[Unit]) -> dict:
    return {
        "ptxgen_version": __version__,
        "spec": {"file": Path(spec.path).name, "sha256": spec.sha256},
        "archs": list(spec.spec.target.archs),
        "kernels": {unit.kernel.name: unit.meta for unit in units},
    }


def write_artifacts(out: Path, units: list[Unit], manifest: dict) -> None:
    """Write DIR/<name>.ptx, DIR/<arch>/<name>.cubin, DIR/manifest.json; drop stale ones."""
    wanted = {out / "manifest.json"}
    for unit in units:
        wanted.add(out / f"{unit.kernel.name}.ptx")
        write_if_changed(out / f"{unit.kernel.name}.ptx", unit.ptx.encode())
        for arch, cubin in unit.cubins.items():
            wanted.add(out / arch / f"{unit.kernel.name}.cubin")
            write_if_changed(out / arch / f"{unit.kernel.name}.cubin", cubin)
    text = json.dumps(manifest, sort_keys=True, indent=2) + "\n"
    write_if_changed(out / "manifest.json", text.encode())
    for stale in [*out.glob("*.ptx"), *out.glob("sm_*/*.cubin")]:
        if stale not in wanted:
            stale.unlink()


def run_build(spec: LoadedSpec, out: Path, options: BuildOptions) -> BuildResult:
    units, assembled, cached = build(spec, options)
    manifest = manifest_of(spec, units)
    write_artifacts(out, units, manifest)
    return BuildResult(manifest=manifest, assembled=assembled, cached=cached)
