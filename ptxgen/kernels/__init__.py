"""The kind registry: every module in this package that defines a Kind subclass is a kind
(subpackages, e.g. `families`, hold shared code and are never searched)."""

from __future__ import annotations

import importlib
import pkgutil

from .base import Kind


def _discover() -> dict[str, type[Kind]]:
    kinds = {}
    for module in pkgutil.iter_modules(__path__):
        if module.ispkg or module.name == "base":
            continue
        loaded = importlib.import_module(f"{__name__}.{module.name}")
        for value in vars(loaded).values():
            if isinstance(value, type) and issubclass(value, Kind) and value.__module__ == loaded.__name__:
                kinds[value.name] = value
    return dict(sorted(kinds.items()))


KINDS: dict[str, type[Kind]] = _discover()


def kind_of(config) -> Kind:
    """The Kind instance for one validated kernel config."""
    return KINDS[config.kind](config)
