"""Render a kernel's PTX from its kind's Jinja template (StrictUndefined: no silent blanks)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import struct
import tempfile
from functools import cache
from importlib import resources
from pathlib import Path

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


class TemplateCache(jinja2.BytecodeCache):
    """Jinja's compiled templates, a file each under `folder`: the sha256 of the code, then the
    code. A file truncated or changed on disk is compiled again, not run; a folder that cannot be
    read or written (read-only, full, removed by `ptxgen cache clean` meanwhile) only costs the
    compile time, never an error."""

    def __init__(self, folder: Path):
        self.folder = folder

    def _path(self, bucket) -> Path:
        return self.folder / f"__jinja2_{bucket.key}.cache"

    def load_bytecode(self, bucket) -> None:
        try:
            data = self._path(bucket).read_bytes()
        except OSError:
            return
        if hashlib.sha256(data[32:]).digest() != data[:32]:
            return
        try:
            bucket.bytecode_from_string(data[32:])
        except Exception:  # unreadable code despite its digest (another Python's marshal format): compile
            bucket.reset()

    def dump_bytecode(self, bucket) -> None:
        code = bucket.bytecode_to_string()
        staging = None
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.folder, prefix=f".__jinja2_{bucket.key}-", suffix=".tmp",
                                             delete=False) as file:
                staging = Path(file.name)
                file.write(hashlib.sha256(code).digest() + code)
            os.replace(staging, self._path(bucket))
        except OSError:
            if staging is not None:
                staging.unlink(missing_ok=True)


@cache
def environment(compiled_templates: bool = True) -> jinja2.Environment:
    """The templates' environment; with `compiled_templates`, Jinja's compiled code cached under the
    cache folder (TemplateCache): compiling the templates (with the family macros they import,
    ~1800 lines) costs more than a whole warm build otherwise."""
    templates = resources.files("ptxgen.templates")
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates)),
        bytecode_cache=TemplateCache(SETTINGS.cache_dir / "jinja") if compiled_templates else None,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.globals.update(f32=f32_literal, regs=register_names)
    return env


def render(kernel, ptx_version: tuple[int, int], ptx_target: str, own_target: str | None = None,
           compiled_templates: bool = True) -> str:
    """PTX text of one validated kernel config (`own_target`: the arch-specific variant the kind
    renders for that target, or None for the portable PTX; `compiled_templates`: environment's)."""
    kind = kind_of(kernel, own_target)
    config = kernel.model_dump(mode="json")
    try:
        text = environment(compiled_templates).get_template(kind.template).render(
            tool_version=__version__,
            kind=kind.name,
            config_json=json.dumps(config, sort_keys=True),
            ptx_version=format_version(ptx_version),
            ptx_target=ptx_target,
            entry=kernel.name,
            params=kind.params(),
            tensor_maps=kind.tensor_maps(),
            pdl=kind.pdl,
            pdl_wait_in_body=kind.pdl_wait_in_body,
            cta_threads=math.prod(kind.geometry().block),
            **kind.template_vars(),
        )
    except jinja2.TemplateError as error:
        raise RuntimeError(f"template {kind.template} failed for kernel {kernel.name!r}: {error}") from error
    except SpecError as error:
        raise SpecError(f"kernel {kernel.name!r}: {error}; choose values that keep it in range") from None
    check_entry_name(kernel.name, kind.name, text)
    return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"


# PTX's predefined identifier without a % (ISA 5.4: WARP_SZ); a kernel so named cannot be parsed.
RESERVED = frozenset({"WARP_SZ"})


def check_entry_name(name: str, kind: str, text: str) -> None:
    """The entry's name must name nothing else in its PTX (one of its parameters, declared on the
    lines after `.entry`; a label, a shared variable of the kind's template): nvJitLink crashed the
    process (a segfault) or refused the redefinition. The one check of a kernel's name against
    its PTX: compile_loaded names the spec file in its message."""
    code = "\n".join(line.split("//", 1)[0] for line in text.splitlines() if not line.startswith(".visible .entry"))
    if name in RESERVED or re.search(rf"(?<![\w%$.]){re.escape(name)}(?!\w)", code):
        raise SpecError(f"kernel {name!r}: the {kind} kind's PTX uses {name!r} for a name of its own (a parameter, "
                        "a label, a variable or a PTX keyword); choose another kernel name")
