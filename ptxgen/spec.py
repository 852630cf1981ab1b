"""Spec files (TOML or YAML): pydantic models discriminated by kind, one-line errors.

Values are taken strictly (no "4096" or 4096.0 for an integer, no `true` for a number; an integer
is a fine float); the file itself is read by ptxgen.specfile.
"""

from __future__ import annotations

import hashlib
import re
from functools import cache
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, field_validator, model_validator

from .archs import ARCHS, DEFAULT_ARCHS, STATIC_SHARED_LIMIT, format_version, serving_target
from .errors import SpecError
from .header import defined_names
from .kernels import KINDS, KernelEntry, kind_of, rendered_targets
from .kernels.base import PDL_TARGET, list_as_tuple
from .quote import clip, echo
from .specfile import read_document

MAX_ERROR_LINES = 20


@cache
def ptx_isa_versions() -> tuple[tuple[int, int], ...]:
    """PTX ISA versions a spec may ask for: every released one (there never was a 7.9 or 8.9) up
    to the newest the installed nvJitLink assembles. pyproject asks for nvJitLink 13, and CUDA 13.m
    ships PTX ISA 9.m (nvJitLink 13.5 takes 9.5 and refuses 9.6); a later major takes every 9.x."""
    from .assemble import nvjitlink_version

    major, minor = (int(part) for part in nvjitlink_version().split("."))
    known = [(7, m) for m in range(9)] + [(8, m) for m in range(9)] + [(9, m) for m in range(10)]
    return tuple(version for version in known if major > 13 or version <= (9, minor))


class Target(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    archs: Annotated[tuple[str, ...], BeforeValidator(list_as_tuple)] = DEFAULT_ARCHS
    ptx_version: str | None = None

    @field_validator("archs")
    @classmethod
    def known_archs(cls, archs: tuple[str, ...]) -> tuple[str, ...]:
        if not archs:
            raise ValueError("expected at least one arch")
        for arch in archs:
            if arch not in ARCHS:
                raise ValueError(f"expected one of {', '.join(ARCHS)}, got {arch!r}")
        return tuple(sorted(set(archs), key=list(ARCHS).index))

    @field_validator("ptx_version", mode="before")
    @classmethod
    def known_version(cls, version: Any) -> Any:
        """MAJOR.MINOR of a PTX ISA that exists and that nvJitLink assembles, written as build
        writes it (so "7.80" or "07.8" is refused, not passed on to fail in the assembler)."""
        if version is None:
            return None
        known = ptx_isa_versions()
        expected = f"a quoted PTX ISA version from {format_version(known[0])} to {format_version(known[-1])}"
        if not isinstance(version, str):
            raise ValueError(f"expected {expected} such as \"8.0\", got {echo(version)}")
        found = re.fullmatch(r"([0-9])\.([0-9])", version)  # ASCII digits: str.isdigit takes "²"
        if not found or (int(found[1]), int(found[2])) not in known:
            raise ValueError(f"expected {expected} ({format_version(known[-1])}: the newest this nvJitLink "
                             f"assembles), got {echo(version)}")
        return version


class Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    target: Target = Target()
    kernels: Annotated[tuple[KernelEntry, ...], BeforeValidator(list_as_tuple)]

    @model_validator(mode="after")
    def unique_names(self) -> Spec:
        if not self.kernels:
            raise ValueError("expected at least one [[kernels]] entry")
        seen, defined = set(), {}
        for index, kernel in enumerate(self.kernels):
            if kernel.name in seen:
                raise ValueError(f"kernels[{index}].name: {kernel.name!r} is used twice; names must be unique")
            seen.add(kernel.name)
            for symbol in sorted(defined_names(kernel.name, rendered_targets(kernel, self.target.archs))):
                if symbol in defined:
                    raise ValueError(f"kernels[{index}].name: {kernel.name!r} and {defined[symbol]!r} would both define "
                                     f"{symbol} in the C header; rename one")
                defined[symbol] = kernel.name
        return self

    def kernel(self, name: str):
        for kernel in self.kernels:
            if kernel.name == name:
                return kernel
        raise SpecError(f"no kernel named {name!r} in the spec (have: {', '.join(k.name for k in self.kernels)})")

    def find(self, name_or_kind: str):
        """A kernel by its name, or the first kernel of that kind."""
        for kernel in self.kernels:
            if kernel.name == name_or_kind:
                return kernel
        for kernel in self.kernels:
            if kernel.kind == name_or_kind:
                return kernel
        known = ", ".join(k.name for k in self.kernels)
        raise SpecError(f"no kernel named {name_or_kind!r} and no kernel of that kind (kernels: {known})")

    def ptx_version(self, kernel, target: str | None = None) -> tuple[int, int]:
        """The explicit target version, else the oldest that the arch(s) the PTX serves and the kind
        accept."""
        if self.target.ptx_version:
            major, minor = self.target.ptx_version.split(".")
            return int(major), int(minor)
        return max([kind_of(kernel, target).ptx_version, ARCHS[target or self.ptx_target].ptx_version])

    @property
    def ptx_target(self) -> str:
        """The portable PTX is written for the oldest arch and assembled for each (later archs
        accept it); for its base arch where that is arch-specific (sm_90a: sm_90), since PTX
        for sm_90a serves no later arch (the kinds' sm_90a variants are rendered apart)."""
        return self.target.archs[0].removesuffix("a")


class LoadedSpec(BaseModel):
    """A validated spec with where it came from."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    path: str
    sha256: str
    spec: Spec


def load_spec(path: str | Path) -> LoadedSpec:
    path = Path(path)
    try:
        str(path).encode()
    except UnicodeEncodeError:
        raise SpecError(f"{ascii(str(path))}: the file name is not valid UTF-8 (its artifacts name it): rename "
                        "the file") from None
    raw_bytes, data = read_document(path)
    spec = validate(path, data)
    check_against_archs(path, spec)
    return LoadedSpec(path=str(path), sha256=hashlib.sha256(raw_bytes).hexdigest(), spec=spec)


def validate(path: Path, data: dict) -> Spec:
    """Strictly, nested models included (a flash_attention entry's sm90a table)."""
    try:
        return Spec.model_validate(data, strict=True)
    except ValidationError as error:
        raise SpecError("\n".join(describe_errors(path, data, error))) from None


def with_archs(loaded: LoadedSpec, archs: tuple[str, ...], option: str = "--arch") -> LoadedSpec:
    """The same spec retargeted (the CLI's --arch, `option` in messages), validated again against
    the new archs' limits."""
    path = Path(loaded.path)
    data = loaded.spec.model_dump(mode="json")
    data["target"]["archs"] = list(archs)
    try:
        spec = validate(path, data)
    except SpecError as error:
        raise SpecError(str(error).replace(f"{path}: target.", f"{option}: ")) from None
    check_against_archs(path, spec)
    return loaded.model_copy(update={"spec": spec})


def describe_errors(path: Path, data: dict, error: ValidationError) -> list[str]:
    """One line per problem (at most MAX_ERROR_LINES): file, kernel name, field, what was expected,
    what was given (a few hundred characters of it at most)."""
    lines = []
    problems = error.errors(include_url=False)
    for item in problems[:MAX_ERROR_LINES]:
        location = list(item["loc"])
        where, index = "", None
        if location[:1] == ["kernels"] and len(location) > 1 and isinstance(location[1], int):
            index = location[1]
            entry = data.get("kernels", [])[index] if isinstance(data.get("kernels"), list) else None
            name = entry.get("name") if isinstance(entry, dict) else None
            where = f"kernel {echo(name)} (kernels[{index}])" if name else f"kernels[{index}]"
            location = location[2:]
            if location and isinstance(entry, dict) and location[0] == entry.get("kind"):
                location = location[1:]  # pydantic names the union member; the user wrote `kind`
        field = clip(".".join(str(part) if isinstance(part, int) or part.isidentifier() else echo(part)
                              for part in location))
        message = "expected a list" if item["type"] == "tuple_type" else clip(item["msg"].removeprefix("Value error, "))
        given = "" if item["type"] in ("value_error", "missing") else f" (got {echo(item['input'])})"
        if item["type"] in ("union_tag_invalid", "union_tag_not_found") and not location and index is not None:
            # a kernel's `kind` missing or unknown: every kind, unclipped (not pydantic's truncated
            # list and the whole entry echoed), and what was written as written (3, not '3')
            field = "kind"
            if item["type"] == "union_tag_not_found":
                message, given = "Field required", ""
            else:
                message = f"expected one of {', '.join(KINDS)}"
                given = f" (got {echo(entry.get('kind') if isinstance(entry, dict) else item['input'])})"
        lines.append(": ".join(part for part in (str(path), where, field, message + given) if part))
    if len(problems) > MAX_ERROR_LINES:
        lines.append(f"{path}: ... and {len(problems) - MAX_ERROR_LINES} more problems")
    return lines


def check_against_archs(path: Path, spec: Spec) -> None:
    """Each config must have a kernel (Kind.unbuildable), and its threads and shared memory must
    fit every target arch."""
    problems = []
    for index, kernel in enumerate(spec.kernels):
        variants = rendered_targets(kernel, spec.target.archs)
        targets = {spec.ptx_target: False, **{target: target == PDL_TARGET for target in variants}}
        where = f"{path}: kernel {kernel.name!r} (kernels[{index}])"
        refusal = kind_of(kernel).unbuildable()
        if refusal:
            problems.append(f"{where}: {refusal}")
            continue
        short = {}  # (what, needed, allowed) -> archs, so one line says it for every arch alike
        for arch_name in spec.target.archs:
            served_by = serving_target(targets, arch_name)  # as the pipeline picks each arch's PTX
            kind = kind_of(kernel, served_by if served_by in variants else None)
            arch = ARCHS[arch_name]
            try:
                threads, shared = kind.resources()
            except ValueError as error:  # a variant's knobs that cannot work
                problems.append(f"{where}: {arch_name}: {error}")
                continue
            static = kind.static_shared()
            if threads > arch.max_threads_per_cta:
                short.setdefault(("threads per CTA", threads, arch.max_threads_per_cta), []).append(arch_name)
            if shared > arch.max_shared_per_cta:
                short.setdefault(("bytes of shared memory", shared, arch.max_shared_per_cta), []).append(arch_name)
            if static > STATIC_SHARED_LIMIT:
                problems.append(f"{where}: declares {static} bytes of static shared memory, the limit is {STATIC_SHARED_LIMIT}")
        for (what, needed, allowed), archs in short.items():
            named = " and ".join([", ".join(archs[:-1]), archs[-1]] if len(archs) > 1 else archs)
            problems.append(f"{where}: needs {needed} {what}, {named} allow{'s' * (len(archs) == 1)} {allowed}")
        for own in [None, *variants]:
            needed = max(kind_of(kernel, own).ptx_version, ARCHS[own or spec.ptx_target].ptx_version)
            if spec.target.ptx_version and spec.ptx_version(kernel, own) < needed:
                problems.append(
                    f"{path}: target.ptx_version: kernel {kernel.name!r} needs at least {format_version(needed)} "
                    f"for its instructions and archs{' (' + own + ' PTX)' if own else ''} (got "
                    f"{spec.target.ptx_version!r})"
                )
    if problems:
        raise SpecError("\n".join(dict.fromkeys(problems)))
