"""The kind registry: every module in this package that defines a Kind subclass is a kind."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Annotated, Union

from pydantic import Field, TypeAdapter

from .base import Kind


def _discover() -> dict[str, type[Kind]]:
    kinds = {}
    for module in pkgutil.iter_modules(__path__):
        if module.name == "base" or module.ispkg:
            continue
        loaded = importlib.import_module(f"{__name__}.{module.name}")
        for value in vars(loaded).values():
            if isinstance(value, type) and issubclass(value, Kind) and value.__module__ == loaded.__name__:
                kinds[value.name] = value
    return dict(sorted(kinds.items()))


KINDS: dict[str, type[Kind]] = _discover()

# One spec entry: the config model of its `kind`.
KernelEntry = Annotated[Union[tuple(kind.Config for kind in KINDS.values())], Field(discriminator="kind")]
_ENTRY = TypeAdapter(KernelEntry)


def kind_of(config, target: str | None = None) -> Kind:
    """The Kind instance for one validated kernel config (for `target`, an arch-specific PTX
    target the kind renders on its own, or None for the portable PTX)."""
    return KINDS[config.kind](config, target)


def config_from_json(data: dict):
    """A validated kernel config from a spec entry or a manifest's `config` (raises
    pydantic.ValidationError)."""
    return _ENTRY.validate_python(data)


def kind_from_json(data: dict, target: str | None = None) -> Kind:
    return kind_of(config_from_json(data), target)
