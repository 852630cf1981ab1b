"""Spec files (TOML or YAML): pydantic models discriminated by kind, one-line errors."""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from .archs import ARCHS, DEFAULT_ARCHS, STATIC_SHARED_LIMIT, format_version
from .errors import SpecError
from .kernels import KernelEntry, kind_of, own_targets


class Target(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    archs: tuple[str, ...] = DEFAULT_ARCHS
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

    @field_validator("ptx_version")
    @classmethod
    def version_form(cls, version: str | None) -> str | None:
        if version is not None:
            major, _, minor = version.partition(".")
            if not (major.isdigit() and minor.isdigit()):
                raise ValueError(f"expected MAJOR.MINOR such as '7.8', got {version!r}")
        return version


class Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    target: Target = Target()
    kernels: tuple[KernelEntry, ...]

    @model_validator(mode="after")
    def unique_names(self) -> Spec:
        if not self.kernels:
            raise ValueError("expected at least one [[kernels]] entry")
        seen = set()
        for index, kernel in enumerate(self.kernels):
            if kernel.name in seen:
                raise ValueError(f"kernels[{index}].name: {kernel.name!r} is used twice; names must be unique")
            seen.add(kernel.name)
            params = [p.name for p in kind_of(kernel).params()]
            if kernel.name in params:
                # nvJitLink 13.x can crash the process on an entry named like one of its parameters.
                raise ValueError(f"kernels[{index}].name: expected a name other than the kernel's parameter "
                                 f"names ({', '.join(params)}), got {kernel.name!r}")
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
        """PTX is written for the oldest arch and assembled for each (later archs accept it)."""
        return self.target.archs[0]


class LoadedSpec(BaseModel):
    """A validated spec with where it came from."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    path: str
    sha256: str
    spec: Spec


def load_spec(path: str | Path) -> LoadedSpec:
    path = Path(path)
    try:
        raw_bytes = path.read_bytes()
    except OSError as error:
        raise SpecError(f"{path}: cannot read spec file: {error.strerror or error}") from None
    data = parse_document(path, raw_bytes)
    try:
        spec = Spec.model_validate(data)
    except ValidationError as error:
        raise SpecError("\n".join(describe_errors(path, data, error))) from None
    check_against_archs(path, spec)
    return LoadedSpec(path=str(path), sha256=hashlib.sha256(raw_bytes).hexdigest(), spec=spec)


def with_archs(loaded: LoadedSpec, archs: tuple[str, ...]) -> LoadedSpec:
    """The same spec retargeted (--arch), validated again against the new archs' limits."""
    path = Path(loaded.path)
    data = loaded.spec.model_dump(mode="json")
    data["target"]["archs"] = list(archs)
    try:
        spec = Spec.model_validate(data)
    except ValidationError as error:
        raise SpecError("\n".join(line.replace(f"{path}: target.", "--arch: ") for line in describe_errors(path, data, error))) from None
    check_against_archs(path, spec)
    return loaded.model_copy(update={"spec": spec})


def parse_document(path: Path, raw: bytes) -> Any:
    suffix = path.suffix.lower()
    try:
        text = raw.decode("utf-8")
        if suffix == ".toml":
            data = tomllib.loads(text)
        elif suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text)
        else:
            raise SpecError(f"{path}: expected a .toml, .yaml or .yml spec file, got {suffix or 'no extension'!r}")
    except (tomllib.TOMLDecodeError, yaml.YAMLError, UnicodeDecodeError) as error:
        detail = str(error).replace("\n", " ")
        raise SpecError(f"{path}: not a valid {suffix.lstrip('.').upper()} document: {detail}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a table with 'kernels' at the top level, got {type(data).__name__}")
    return data


def describe_errors(path: Path, data: dict, error: ValidationError) -> list[str]:
    """One line per problem: file, kernel name, field, what was expected, what was given."""
    lines = []
    for item in error.errors():
        location = list(item["loc"])
        where = ""
        if location[:1] == ["kernels"] and len(location) > 1 and isinstance(location[1], int):
            index = location[1]
            entry = data.get("kernels", [])[index] if isinstance(data.get("kernels"), list) else None
            name = entry.get("name") if isinstance(entry, dict) else None
            where = f"kernel {name!r} (kernels[{index}])" if name else f"kernels[{index}]"
            location = location[2:]
            if location and isinstance(entry, dict) and location[0] == entry.get("kind"):
                location = location[1:]  # pydantic names the union member; the user wrote `kind`
        field = ".".join(str(part) for part in location)
        message = item["msg"].removeprefix("Value error, ")
        given = "" if item["type"] in ("value_error", "missing") else f" (got {item['input']!r})"
        lines.append(": ".join(part for part in (str(path), where, field, message + given) if part))
    return lines


def check_against_archs(path: Path, spec: Spec) -> None:
    """Threads and shared memory of each chosen config must fit every target arch."""
    problems = []
    for index, kernel in enumerate(spec.kernels):
        variants = own_targets(kernel.kind)
        for arch_name in spec.target.archs:
            kind = kind_of(kernel, arch_name if arch_name in variants else None)
            arch = ARCHS[arch_name]
            where = f"{path}: kernel {kernel.name!r} (kernels[{index}])"
            try:
                threads, shared = kind.resources()
            except ValueError as error:  # a variant's knobs that cannot work
                problems.append(f"{where}: {arch_name}: {error}")
                continue
            static = kind.static_shared()
            if threads > arch.max_threads_per_cta:
                problems.append(f"{where}: needs {threads} threads per CTA, {arch_name} allows {arch.max_threads_per_cta}")
            if shared > arch.max_shared_per_cta:
                problems.append(f"{where}: needs {shared} bytes of shared memory, {arch_name} allows {arch.max_shared_per_cta}")
            if static > STATIC_SHARED_LIMIT:
                problems.append(f"{where}: declares {static} bytes of static shared memory, the limit is {STATIC_SHARED_LIMIT}")
        for own in [None, *(t for t in variants if t in spec.target.archs)]:
            needed = max(kind_of(kernel, own).ptx_version, ARCHS[own or spec.ptx_target].ptx_version)
            if spec.target.ptx_version and spec.ptx_version(kernel, own) < needed:
                problems.append(
                    f"{path}: target.ptx_version: kernel {kernel.name!r} needs at least {format_version(needed)} "
                    f"for its instructions and archs{' (' + own + ' PTX)' if own else ''} (got "
                    f"{spec.target.ptx_version!r})"
                )
    if problems:
        raise SpecError("\n".join(dict.fromkeys(problems)))
