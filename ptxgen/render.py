"""Render a kernel's PTX from its kind's Jinja template (StrictUndefined: no silent blanks)."""

from __future__ import annotations

import json
import math
import os
import struct
from functools import cache
from importlib import resources

import jinja2

from . import __version__
from .archs import format_version
from .errors import SpecError
from .kernels import kind_of
from .kernels.base import f32_rounded
from .settings import SETTINGS


def f32_literal(value: float) -> str:
    """An exact PTX f32 immediate (0fXXXXXXXX) for a Python float rounded to f32: a finite one
    (a constant derived from config fields, e.g. scale * log2(e), can still overflow)."""
    rounded = f32_rounded(value)
    if not math.isfinite(rounded):
        raise SpecError(f"a constant of its PTX, {value!r}, is not a finite f32 number")
    return "0f%08X" % struct.unpack("<I", struct.pack("<f", rounded))[0]


def register_names(prefix: str, start: int, count: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(start, start + count)]


@cache
def environment() -> jinja2.Environment:
    templates = resources.files("ptxgen.templates")
    # Compiling the templates (with the family macros they import, ~1800 lines) costs more than a
    # whole warm build otherwise; Jinja's bytecode cache keys on the template source and writes atomically.
    # A cache folder that cannot be written only costs that time: render without it.
    bytecode = SETTINGS.cache_dir / "jinja"
    try:
        bytecode.mkdir(parents=True, exist_ok=True)
        bytecode_cache = jinja2.FileSystemBytecodeCache(str(bytecode)) if os.access(bytecode, os.W_OK) else None
    except OSError:
        bytecode_cache = None
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates)),
        bytecode_cache=bytecode_cache,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.globals.update(f32=f32_literal, regs=register_names)
    return env


def render(kernel, ptx_version: tuple[int, int], ptx_target: str, own_target: str | None = None) -> str:
    """PTX text of one validated kernel config (`own_target`: the arch-specific variant the kind
    renders for that target, or None for the portable PTX)."""
    kind = kind_of(kernel, own_target)
    config = kernel.model_dump(mode="json")
    try:
        text = environment().get_template(kind.template).render(
            tool_version=__version__,
            kind=kind.name,
            config_json=json.dumps(config, sort_keys=True),
            ptx_version=format_version(ptx_version),
            ptx_target=ptx_target,
            entry=kernel.name,
            params=kind.params(),
            pdl=kind.pdl,
            pdl_wait_in_body=kind.pdl_wait_in_body,
            cta_threads=math.prod(kind.geometry().block),
            **kind.template_vars(),
        )
    except jinja2.TemplateError as error:
        raise RuntimeError(f"template {kind.template} failed for kernel {kernel.name!r}: {error}") from error
    except SpecError as error:
        raise SpecError(f"kernel {kernel.name!r}: {error}; choose values that keep it in range") from None
    return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"
