"""CompiledKernel: what `ptxgen build` makes of one spec entry, and what everything else launches.

The stage table (pipeline.py) makes it through the cache; it is also read back from an artifact
folder's manifest.json without pydantic or Jinja (ptxgen.load). The interpreter, `ptxgen run`,
`verify`, `bench`, the tests and the Python API all take one, so PTX is rendered once, assembled
once, and launch arguments are put in PTX order in one place (`args`).
"""

from __future__ import annotations

import hashlib
import json
import operator
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping

from .abi import Geometry, Launch, Param, TensorMap
from .archs import arch_version, serving_target
from .errors import LaunchError, PtxgenError

# Runtime resource figures parsed from the assembler's info log, per arch.
RESOURCE_KEYS = ("registers", "shared_bytes", "local_bytes", "stack_bytes", "spill_stores", "spill_loads")


@dataclass(frozen=True)
class Variant:
    """One PTX text of a kernel: the portable one (`.target` = the oldest arch of the spec), or an
    arch-specific one (e.g. `sm_90a`) with its own body and launch geometry."""

    target: str
    ptx: str
    ptx_version: str
    geometry: Geometry
    note: str = ""  # the launch rule's explanation, for people
    # Made for programmatic dependent launch (kernels/base.py, PDL_TARGET): launched with
    # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (correct without it too).
    pdl: bool = False
    # Tensor maps its entry takes after the kernel's parameters (abi.TensorMap): the launchers encode
    # them from the arrays, so a caller's arguments are the same for every variant.
    tensor_maps: tuple[TensorMap, ...] = ()

    @cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.ptx.encode()).hexdigest()


@dataclass(frozen=True)
class Binary:
    """The cubin of one arch, assembled from the variant of PTX target `target`."""

    arch: str
    target: str
    cubin: bytes
    info_log: str
    resources: Mapping[str, int]

    @cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.cubin).hexdigest()


@dataclass(frozen=True)
class CompiledKernel:
    name: str  # the PTX entry
    kind: str
    config: Mapping[str, Any]  # the spec entry, as JSON
    params: tuple[Param, ...]  # in PTX order
    scalar_limits: Mapping[str, tuple[int, int]]  # inclusive ranges; names that are not params are size hints
    variants: Mapping[str, Variant]  # PTX target -> variant; the first is the portable one
    binaries: Mapping[str, Binary]  # arch -> cubin (empty when built only to the ptx stage)
    assembler: Mapping[str, str] = field(default_factory=dict)

    # --- what a kernel is ------------------------------------------------------------------
    @property
    def portable(self) -> Variant:
        return next(iter(self.variants.values()))

    @property
    def ptx(self) -> str:
        """The portable PTX text (what the interpreter runs by default)."""
        return self.portable.ptx

    @property
    def cubin(self) -> dict[str, bytes]:
        return {arch: binary.cubin for arch, binary in self.binaries.items()}

    def variant(self, arch: str | None = None) -> Variant:
        """The variant whose code runs on a GPU of `arch`: the one its cubin was made from
        (binary_for: an sm_90 GPU runs the sm_90a cubin when there is one), else the PTX the driver
        would JIT; the portable one for None. Launch geometry, the interpreter and grading all
        follow it, so they agree with what the device loads."""
        if arch is None:
            return self.portable
        if not re.fullmatch(r"sm_[1-9][0-9]+a?", arch):
            raise LaunchError(f"{self.name}: {arch!r} is not an arch (expected e.g. sm_90)")
        binary = self.binary_for(arch)
        if binary is not None:
            return self.variants[binary.target]
        variant = self.jit_variant(arch)
        if variant is None:
            raise LaunchError(f"{self.name}: nothing runs on {arch}: PTX for {', '.join(self.variants)}")
        return variant

    def binary_for(self, device_arch: str) -> Binary | None:
        """The cubin that runs on a GPU of `device_arch` (e.g. sm_90): its arch-specific (sm_90a)
        or exact cubin first, else the newest one of the same major version below it (SASS runs
        on later minor revisions of its major); None when none fits (the driver then JITs PTX)."""
        major, minor, _ = arch_version(device_arch)
        fitting = []
        for arch, binary in self.binaries.items():
            b_major, b_minor, specific = arch_version(arch)
            if b_major == major and (b_minor == minor or (b_minor < minor and not specific)):
                fitting.append(((b_minor, specific), binary))
        return max(fitting, key=lambda item: item[0])[1] if fitting else None

    def jit_variant(self, device_arch: str) -> Variant | None:
        """The PTX the driver can JIT for `device_arch` when no cubin fits: the variant made for
        exactly this GPU, else the newest variant it can run (serving_variant)."""
        return self.variants.get(device_arch + "a") or serving_variant(self.variants, device_arch)

    def param(self, name: str) -> Param:
        for param in self.params:
            if param.name == name:
                return param
        raise PtxgenError(f"{self.name}: no parameter named {name!r}")

    @property
    def arrays(self) -> tuple[Param, ...]:
        """The array parameters a caller passes (workspaces are the launcher's)."""
        return tuple(p for p in self.params if p.is_array and p.role != "workspace")

    @property
    def scalars(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.role == "scalar")

    @property
    def workspaces(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.role == "workspace")

    @cached_property
    def definition(self):
        """The kind's Python definition for this config (references, sample inputs, traffic,
        optional hooks). Imports pydantic and the kind registry: not needed to launch."""
        from .kernels import kind_from_json

        return kind_from_json(dict(self.config))

    def definition_for(self, target: str | None):
        """The definition of PTX `target`'s variant: an arch-specific variant's own (its arithmetic
        and blocks may differ), else the portable kind's."""
        if target is None or target == self.portable.target:
            return self.definition
        from .kernels import kind_from_json

        return kind_from_json(dict(self.config), target)

    # --- launching -------------------------------------------------------------------------
    def check_scalars(self, scalars: Mapping[str, int]) -> None:
        """Reject missing, unknown or out-of-range runtime scalars before any launch."""
        required = {p.name for p in self.scalars}
        unknown = sorted(set(scalars) - set(self.scalar_limits))
        if unknown:  # first: a misnamed scalar would otherwise be reported as the real one missing
            known = ", ".join(self.scalar_limits) or "none"
            if any(p.name == unknown[0] for p in self.params):
                raise LaunchError(f"{self.name}: '{unknown[0]}' is an array parameter, not a runtime scalar "
                                  f"(known: {known})")
            raise LaunchError(f"{self.name}: unknown runtime scalar '{unknown[0]}' (known: {known})")
        for name, (low, high) in self.scalar_limits.items():
            if name not in scalars:
                if name not in required:
                    continue  # a size hint (e.g. the length behind a device-side pointer)
                raise LaunchError(f"{self.name}: runtime scalar '{name}' is missing (expected {low}..{high})")
            value = scalars[name]
            try:  # an int or an integer 0-d array (numpy's own bool and float arrays refuse __index__)
                number = None if isinstance(value, bool) else operator.index(value)
            except TypeError:
                number = None
            if number is None or not low <= number <= high:
                raise LaunchError(f"{self.name}: runtime scalar '{name}': expected an integer in {low}..{high}, "
                                  f"got {value!r}")

    def check_passed_scalar(self, name: str, where: str = "") -> None:
        """Refuse runtime scalar `name` from a caller where it is only a size hint (decode
        attention's `seq_len` with `indirect_seq_len`, the decoder's `pos` with `indirect_pos`): the
        kernel reads that value on the device, from an array, so a value given here would be
        ignored. `where` says where it came from (default: the kernel's name)."""
        if name in self.scalar_limits and all(p.name != name for p in self.scalars):
            device_read = ", ".join(p.name for p in self.arrays if p.values is not None) or "an array argument"
            raise LaunchError(f"{where or self.name}: {name!r} is not an argument of this kernel: it reads that value "
                              f"on the device, from {device_read}")

    def check_values(self, arrays: Mapping[str, Any]) -> None:
        """Reject host arrays whose elements break their parameter's `values` (a device-side
        length or position out of range); on the GPU the kernel clamps them instead."""
        for param in self.arrays:
            problem = param.out_of_range(arrays[param.name]) if param.name in arrays else None
            if problem:
                raise LaunchError(f"{self.name}: {param.name}{problem}")

    def launch(self, scalars: Mapping[str, int], arch: str | None = None) -> Launch:
        """The launch geometry at these runtime scalars (checked first)."""
        self.check_scalars(scalars)
        return self.variant(arch).geometry.at(dict(scalars))

    @property
    def written(self) -> frozenset[str]:
        """The arrays the kernel may write: outputs, in-out arrays and workspaces."""
        return frozenset(param.name for param in self.params if param.written or param.role == "workspace")

    @property
    def stable(self) -> frozenset[str]:
        """The arrays that are the same in every launch of a step (Param.stable)."""
        return frozenset(param.name for param in self.params if param.stable)

    def args(self, buffers: Mapping[str, Any], scalars: Mapping[str, int]) -> list:
        """Launch arguments in PTX parameter order: buffers[name] for every array parameter
        (workspaces included), int(scalars[name]) for every scalar."""
        out = []
        for param in self.params:
            source = buffers if param.is_array else scalars
            if param.name not in source:
                what = "array" if param.is_array else "runtime scalar"
                raise LaunchError(f"{self.name}: {what} {param.name!r} is missing ({param.describe()})")
            out.append(source[param.name] if param.is_array else int(source[param.name]))
        return out

    # --- the manifest ------------------------------------------------------------------------
    def ptx_file(self, target: str) -> str:
        return f"{self.name}.ptx" if target == self.portable.target else f"{self.name}.{target}.ptx"

    def cubin_file(self, arch: str) -> str:
        return f"{arch}/{self.name}.cubin"

    def files(self) -> dict[str, bytes]:
        """Artifact files, relative path -> bytes."""
        files = {self.ptx_file(t): v.ptx.encode() for t, v in self.variants.items()}
        files.update({self.cubin_file(arch): b.cubin for arch, b in self.binaries.items()})
        return files

    def manifest_entry(self) -> dict:
        portable = self.portable
        return {
            "kind": self.kind,
            "config": dict(self.config),
            "ptx": self.ptx_file(portable.target),
            "ptx_sha256": portable.sha256,
            "ptx_version": portable.ptx_version,
            "ptx_target": portable.target,
            "variants": {target: {"ptx": self.ptx_file(target), "ptx_sha256": v.sha256, "ptx_version": v.ptx_version,
                                  "geometry": v.geometry.to_json(), "note": v.note, "launch": launch_rule(v),
                                  "pdl": v.pdl, "tensor_maps": [m.to_json() for m in v.tensor_maps]}
                         for target, v in self.variants.items()},
            "params": [p.to_json() for p in self.params],
            "launch": launch_rule(portable),
            "scalar_limits": {name: list(limits) for name, limits in self.scalar_limits.items()},
            "cubins": {arch: {"file": self.cubin_file(arch), "ptx": self.ptx_file(b.target), "sha256": b.sha256,
                              "info_log": b.info_log, **b.resources}
                       for arch, b in self.binaries.items()},
            "assembler": dict(self.assembler),
        }

    @classmethod
    def from_manifest(cls, name: str, entry: dict, folder: Path) -> CompiledKernel:
        """Read one kernel of an artifact folder back, checking every file against its digest."""
        def read(relative: str, digest: str) -> bytes:
            if not isinstance(relative, str) or Path(relative).is_absolute() or ".." in Path(relative).parts:
                raise ValueError(f"file {relative!r} is not a path inside the folder")
            path = folder / relative
            try:
                data = path.read_bytes()
            except OSError as error:
                raise PtxgenError(f"{path}: cannot read ({error.strerror or error}); rebuild the folder") from None
            if hashlib.sha256(data).hexdigest() != digest:
                raise PtxgenError(f"{path}: does not match its sha256 in manifest.json (changed or truncated "
                                  "since it was built); rebuild the folder")
            return data

        try:
            variants = {
                target: Variant(target, read(v["ptx"], v["ptx_sha256"]).decode(), v["ptx_version"],
                                Geometry.from_json(v["geometry"]), v["note"], v.get("pdl", False),
                                tuple(TensorMap.from_json(m) for m in v.get("tensor_maps", ())))
                for target, v in entry["variants"].items()}
            binaries = {
                arch: Binary(arch, next(t for t in variants if entry["variants"][t]["ptx"] == b["ptx"]),
                             read(b["file"], b["sha256"]), b["info_log"], {k: whole(b[k]) for k in RESOURCE_KEYS})
                for arch, b in entry["cubins"].items()}
            if not variants or not isinstance(entry["params"], list) or not entry["params"]:
                raise ValueError("it lists no PTX variant or no parameters")
            params = tuple(Param.from_json(p) for p in entry["params"])
            limits = {k: (whole(v[0]), whole(v[1])) for k, v in entry["scalar_limits"].items()}
            unknown = {d for p in params for d in p.shape if isinstance(d, str)} - set(limits)
            if unknown:
                raise ValueError(f"shapes name {sorted(unknown)}, which are not runtime scalars")
            for variant in variants.values():  # its launch formulas, at both ends of every scalar's range
                check_geometry(variant.geometry, limits)
            return cls(name, entry["kind"], entry["config"], params, limits, variants, binaries,
                       entry.get("assembler", {}))
        except (KeyError, TypeError, ValueError, IndexError, AttributeError, StopIteration, UnicodeDecodeError,
                OverflowError, ZeroDivisionError) as error:
            raise PtxgenError(f"{folder / 'manifest.json'}: kernel {name!r}: not a ptxgen manifest entry "
                              f"({type(error).__name__}: {error})") from None


def whole(value) -> int:
    """An integer of a manifest (no float, bool or string stands for one)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def check_geometry(geometry: Geometry, limits: Mapping[str, tuple[int, int]]) -> None:
    """A manifest's launch geometry: whole positive block sizes, and formulas that name only the
    runtime scalars and give whole non-negative sizes at the low and the high ends of their ranges."""
    if not all(whole(size) >= 1 for size in geometry.block):
        raise ValueError(f"block {list(geometry.block)} is not positive")
    for end in (0, 1):
        launch = geometry.at({name: pair[end] for name, pair in limits.items()})
        if not all(whole(size) >= 0 for size in (*launch.grid, launch.dynamic_shared)):
            raise ValueError(f"grid {list(launch.grid)} or shared {launch.dynamic_shared} is negative")


def serving_variant(variants: Mapping[str, Variant], arch: str) -> Variant | None:
    """The PTX that serves `arch` (archs.serving_target), None when it can run none."""
    target = serving_target({target: variant.pdl for target, variant in variants.items()}, arch)
    return variants.get(target) if target else None


def launch_rule(variant: Variant) -> str:
    return variant.geometry.describe() + (f": {variant.note}" if variant.note else "")


def load_manifest(folder: Path) -> dict:
    path = folder / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
    except OSError as error:
        raise PtxgenError(f"{path}: cannot read ({error.strerror or error}); is {folder} a `ptxgen build` "
                          "output folder?") from None
    except (ValueError, UnicodeDecodeError, RecursionError) as error:
        raise PtxgenError(f"{path}: not valid JSON ({type(error).__name__}: {error})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("kernels"), dict):
        raise PtxgenError(f"{path}: not a ptxgen manifest (no 'kernels' table)")
    return manifest


def load_folder(folder: Path) -> list[CompiledKernel]:
    """Every kernel of a `ptxgen build` artifact folder, in manifest order."""
    manifest = load_manifest(folder)
    return [CompiledKernel.from_manifest(name, entry, folder) for name, entry in manifest["kernels"].items()]
