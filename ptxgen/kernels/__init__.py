"""The kind registry: every module in this package that defines a Kind subclass is a kind."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Annotated, Union

from pydantic import Field, TypeAdapter

from ..archs import arch_number
from .base import PDL_PTX_VERSION, PDL_TARGET, Kind, PdlConfig


def pdl_variant(kind: type[Kind]) -> type[Kind]:
    """`kind` rendered for PDL_TARGET with griddepcontrol (see PDL_TARGET)."""

    class Pdl(kind):
        target = PDL_TARGET
        pdl = True

        @property
        def ptx_version(self) -> tuple[int, int]:
            return max(super().ptx_version, PDL_PTX_VERSION)

    Pdl.__name__ = Pdl.__qualname__ = f"{kind.__name__}Pdl"
    return Pdl


def _discover() -> tuple[dict[str, type[Kind]], dict[tuple[str, str], type[Kind]]]:
    """The kinds (by name) and their arch-specific variants (by kind name and target), a PDL
    variant for every kind whose config can ask for one."""
    kinds, variants = {}, {}
    for module in pkgutil.iter_modules(__path__):
        if module.name == "base" or module.ispkg:
            continue
        loaded = importlib.import_module(f"{__name__}.{module.name}")
        for value in vars(loaded).values():
            if isinstance(value, type) and issubclass(value, Kind) and value.__module__ == loaded.__name__:
                if value.target is None:
                    kinds[value.name] = value
                else:
                    variants[value.name, value.target] = value
    for name, kind in kinds.items():
        if issubclass(kind.Config, PdlConfig):
            variants[name, PDL_TARGET] = pdl_variant(kind)
    return dict(sorted(kinds.items())), variants


KINDS, VARIANTS = _discover()

# One spec entry: the config model of its `kind`.
KernelEntry = Annotated[Union[tuple(kind.Config for kind in KINDS.values())], Field(discriminator="kind")]
_ENTRY = TypeAdapter(KernelEntry)


def kind_of(config, target: str | None = None) -> Kind:
    """The Kind instance for one validated kernel config: its variant for an arch-specific PTX
    `target` (see own_targets), or the portable kind for None."""
    return (VARIANTS[config.kind, target] if target else KINDS[config.kind])(config)


def takes_pdl(kind: str) -> bool:
    """Whether `kind`'s config can ask for programmatic dependent launch (a PdlConfig)."""
    return (kind, PDL_TARGET) in VARIANTS


def own_targets(config) -> list[str]:
    """The arch-specific targets for which `config`'s kind renders a PTX of its own (PDL_TARGET
    where the config asks for PDL)."""
    return [target for name, target in VARIANTS
            if name == config.kind and (target != PDL_TARGET or getattr(config, "pdl", False))]


def rendered_targets(config, archs) -> list[str]:
    """The own targets (own_targets) a spec for `archs` renders PTX for: an arch-specific one
    (sm_90a) where it is listed, PDL_TARGET where a listed arch runs its PTX (sm_90 and later)."""
    return [target for target in own_targets(config)
            if target in archs or (target == PDL_TARGET and any(arch_number(a) >= arch_number(target) for a in archs))]


def config_from_json(data: dict):
    """A validated kernel config from a spec entry or a manifest's `config` (raises
    pydantic.ValidationError)."""
    return _ENTRY.validate_python(data)


def kind_from_json(data: dict, target: str | None = None) -> Kind:
    return kind_of(config_from_json(data), target)
