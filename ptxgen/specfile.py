"""A spec file's text into plain data (dicts, lists, scalars), without trusting the file.

Only a regular .toml/.yaml/.yml file of at most MAX_BYTES is read (never a device, a pipe or a
folder, which could be read forever). YAML is read with YAML 1.2's core schema for scalars (so
`1e-6` is a number and `yes` a string, as in TOML), duplicate keys are refused (TOML refuses
them too), aliases may not expand the document past MAX_VALUES values (a "billion laughs" file
of a few hundred bytes would otherwise expand to 10^9), and nesting past MAX_DEPTH is refused in
either format, rather than exhausting Python's stack. No message echoes more than a few hundred
characters of the input.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from pathlib import Path
from typing import Any

import yaml

from .errors import SpecError
from .quote import clip, echo

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, as a package (a dependency on 3.10 only)
    import tomli as tomllib

SUFFIXES = (".toml", ".yaml", ".yml")
MAX_BYTES = 1 << 20  # the largest shipped spec is a few KB
MAX_VALUES = 100_000  # after YAML aliases are expanded; a spec of 100 kernels holds ~2,000
MAX_DEPTH = 32  # a spec nests 4 levels (kernels, an entry, a tuning table, a list)


def read_document(path: Path) -> tuple[bytes, Any]:
    """The file's bytes and its parsed data. Raises SpecError naming the file."""
    raw = read_bytes(path)
    suffix = path.suffix.lower()
    try:
        text = raw.decode("utf-8")
        data = tomllib.loads(text) if suffix == ".toml" else load_yaml(text)
        check_depth(data)
    except (tomllib.TOMLDecodeError, yaml.YAMLError, UnicodeDecodeError, ValueError) as error:
        # ValueError: an integer of over 4300 digits, a YAML `!!float abc`
        detail = clip(str(error).replace('in "<unicode string>", ', ""))
        raise SpecError(f"{path}: not a valid {suffix.lstrip('.').upper()} document: {detail}") from None
    except (RecursionError, TooDeep):
        raise SpecError(f"{path}: nested more than {MAX_DEPTH} levels deep; a spec needs at most 4") from None
    except TooLarge as error:
        raise SpecError(f"{path}: {error}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a table with 'kernels' at the top level, got {type(data).__name__}")
    return raw, data


def read_bytes(path: Path) -> bytes:
    """At most MAX_BYTES of a regular file whose name has a spec suffix."""
    if path.suffix.lower() not in SUFFIXES:
        raise SpecError(f"{path}: expected a .toml, .yaml or .yml spec file, got {path.suffix or 'no extension'!r}")
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below).
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as error:
        raise SpecError(f"{path}: cannot read spec file: {error.strerror or error}") from None
    info = os.fstat(descriptor)
    if not stat.S_ISREG(info.st_mode):
        os.close(descriptor)
        what = "is a folder, not a spec file" if stat.S_ISDIR(info.st_mode) else \
            "is not a regular file (a device, a pipe or a socket)"
        raise SpecError(f"{path}: {what}")
    with os.fdopen(descriptor, "rb") as handle:
        try:
            raw = handle.read(MAX_BYTES + 1)
        except OSError as error:
            raise SpecError(f"{path}: cannot read spec file: {error.strerror or error}") from None
    if len(raw) > MAX_BYTES or info.st_size > MAX_BYTES:
        raise SpecError(f"{path}: {max(len(raw), info.st_size):,} bytes or more; a spec file is at most "
                        f"{MAX_BYTES:,} bytes")
    return raw


class TooDeep(Exception):
    """Nesting past MAX_DEPTH."""


class TooLarge(Exception):
    """A YAML graph that expands past MAX_VALUES values, or contains itself."""


def check_depth(data: Any) -> None:
    """Raise TooDeep past MAX_DEPTH levels (iteratively: the data may be too deep for recursion)."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise TooDeep
        if isinstance(value, (dict, list)):
            stack.extend((child, depth + 1) for child in (value.values() if isinstance(value, dict) else value))


# --- YAML ------------------------------------------------------------------------------------------
class SpecLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core-schema scalars and no duplicate keys."""

    yaml_implicit_resolvers: dict = {}  # replaced below by YAML 1.2's core schema (+ merge keys)

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _value in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: the base class names it
                break
            if duplicate:
                raise yaml.constructor.ConstructorError("while constructing a mapping", node.start_mark,
                                                        f"found duplicate key {echo(key)}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)

    def construct_yaml_int(self, node):
        # YAML 1.2: 0o17 octal, 0x1F hex, anything else decimal (1.1 read 017 as octal, 1:30 as 90)
        text = self.construct_scalar(node)
        if text[:2] in ("0o", "0x"):
            return int(text[2:], 8 if text[1] == "o" else 16)
        return int(text)


for _tag, _pattern, _first in (
    ("null", r"~|null|Null|NULL|", "~nN"),
    ("bool", r"true|True|TRUE|false|False|FALSE", "tTfF"),
    ("int", r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+", "-+0123456789"),
    ("float", r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)",
     "-+.0123456789"),
    ("merge", r"<<", "<"),
):
    SpecLoader.add_implicit_resolver(f"tag:yaml.org,2002:{_tag}", re.compile(f"^(?:{_pattern})$"),
                                     [*_first, ""] if _tag == "null" else list(_first))
SpecLoader.add_constructor("tag:yaml.org,2002:int", SpecLoader.construct_yaml_int)
# YAML 1.2's core schema has no timestamps (and PyYAML's fails with a traceback on `!!timestamp x`).
SpecLoader.add_constructor("tag:yaml.org,2002:timestamp", SpecLoader.construct_undefined)


def load_yaml(text: str) -> Any:
    loader = SpecLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        check_expansion(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def check_expansion(root: yaml.Node) -> None:
    """Refuse a node graph that expands (through aliases) past MAX_VALUES values or MAX_DEPTH
    levels, or that contains itself. Each node is visited once: the cost is the file's size, not
    the expansion's."""
    measured: dict[int, tuple[int, int] | None] = {}  # id -> (values, height); None while visiting

    def measure(node: yaml.Node, depth: int) -> tuple[int, int]:
        key = id(node)
        if key in measured:
            known = measured[key]
            if known is None:
                raise TooLarge("an alias refers to a node that contains it (a recursive structure)")
            if depth + known[1] > MAX_DEPTH:
                raise TooDeep
            return known
        if depth > MAX_DEPTH:
            raise TooDeep
        measured[key] = None
        children = node.value if isinstance(node, yaml.SequenceNode) else (
            [part for pair in node.value for part in pair] if isinstance(node, yaml.MappingNode) else [])
        values, height = 1, 0
        for child in children:
            child_values, child_height = measure(child, depth + 1)
            values, height = values + child_values, max(height, child_height + 1)
            if values > MAX_VALUES:
                raise TooLarge(f"expands to more than {MAX_VALUES:,} values (through aliases); a spec holds far fewer")
        measured[key] = values, height
        return values, height

    measure(root, 1)
