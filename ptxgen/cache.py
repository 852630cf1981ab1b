"""Content-addressed cubin cache: key = sha256 of everything that can change the output.

An entry is a folder ROOT/ab/abcdef.../ holding `cubin`, `log` and `sha256` (the digest of the
other two), renamed into place whole. A read checks the digest: an entry that was truncated or
changed on disk is dropped (and reported), and the caller assembles again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import __version__
from .artifacts import file_in_the_way
from .errors import PtxgenError

SCHEMA = 3  # bump when the entry layout or what a key covers changes
_KEY = re.compile(r"[0-9a-f]{64}")
_STAGING = re.compile(r"\.[0-9a-f]{8}-[a-z0-9_]{8}")  # put's tempfile.mkdtemp(prefix=".{key[:8]}-")
# A compiled template under ROOT/jinja (render.TemplateCache), or one being written.
TEMPLATE_FILE = re.compile(r"__jinja2_[0-9a-f]{40}\.cache|\.__jinja2_[0-9a-f]{40}-[a-z0-9_]{8}\.tmp")


def cache_key(ptx: str, arch: str, assembler: str, assembler_version: str, options: dict) -> str:
    material = {
        "schema": SCHEMA,
        "ptxgen": __version__,
        "ptx_sha256": hashlib.sha256(ptx.encode()).hexdigest(),
        "arch": arch,
        "assembler": assembler,
        "assembler_version": assembler_version,
        "options": options,
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def _digest(key: str, cubin: bytes, log: str) -> str:
    """The entry's digest, tied to its key: an entry copied under another key does not match."""
    return hashlib.sha256(key.encode() + hashlib.sha256(cubin).digest() + log.encode()).hexdigest()


@dataclass(frozen=True)
class CacheInfo:
    root: Path
    entries: int
    bytes: int


class Cache:
    """The cubin cache under `root` (None: no cache). A cache that cannot be written (read-only
    or missing permissions) is used read-only, with one report, never an error: it only saves time."""

    def __init__(self, root: Path | None, report: Callable[[str], None] = lambda message: None):
        self.root = root
        self.report = report
        self.writable = True

    def _entry(self, key: str) -> Path:
        return self.root / key[:2] / key

    def get(self, key: str) -> tuple[bytes, str] | None:
        if self.root is None:
            return None
        entry = self._entry(key)
        try:
            cubin, log = (entry / "cubin").read_bytes(), (entry / "log").read_text()
            digest = (entry / "sha256").read_text().strip()
        except (OSError, UnicodeDecodeError):
            if entry.exists():
                self.drop(entry, "unreadable or incomplete")
            return None
        if digest != _digest(key, cubin, log):
            self.drop(entry, "its cubin or log does not match its digest (truncated or changed)")
            return None
        return cubin, log

    def drop(self, entry: Path, why: str) -> None:
        shutil.rmtree(entry, ignore_errors=True)
        done = "dropped and rebuilt" if not entry.exists() else "rebuilt (it could not be removed)"
        self.report(f"cache entry {entry} {done}: {why}")

    def put(self, key: str, cubin: bytes, log: str) -> None:
        if self.root is None or not self.writable:
            return
        entry = self._entry(key)
        try:
            entry.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{key[:8]}-", dir=entry.parent))
        except OSError as error:
            self.writable = False
            blocking = file_in_the_way(entry)
            why = f"{blocking} is a file, not a folder" if blocking else error.strerror or error
            self.report(f"cache {self.root} is not writable ({why}): building without it")
            return
        try:
            (staging / "cubin").write_bytes(cubin)
            (staging / "log").write_text(log)
            (staging / "sha256").write_text(_digest(key, cubin, log) + "\n")
            os.rename(staging, entry)
        except OSError:  # another process put the same entry first (identical by construction), or a full disk
            shutil.rmtree(staging, ignore_errors=True)

    def entries(self) -> list[Path]:
        """The folders this cache made: ROOT/ab/abcdef... (a key's 64 hex digits, under its first
        two) holding a `sha256` file, and put's staging leftovers beside them (named as put names
        them). Nothing else under ROOT is ever counted or removed (ROOT may be a folder the user
        shares with other files)."""
        found = []
        for shard in self.root.glob("??"):
            if not (shard.is_dir() and re.fullmatch(r"[0-9a-f]{2}", shard.name)):
                continue
            for entry in shard.iterdir():
                if entry.is_dir() and (_KEY.fullmatch(entry.name) and entry.name.startswith(shard.name)
                                       and (entry / "sha256").is_file()
                                       or _STAGING.fullmatch(entry.name) and entry.name[1:3] == shard.name):
                    found.append(entry)
        return found

    def info(self) -> CacheInfo:
        entries = [e for e in self.entries() if not e.name.startswith(".")]
        size = sum(f.stat().st_size for e in entries for f in e.iterdir() if f.is_file())
        return CacheInfo(self.root, len(entries), size)

    def clean(self) -> int:
        """Remove every entry this cache made (and staging leftovers, and the compiled templates);
        the count of entries removed. An entry that cannot be removed (a read-only cache) is one
        error naming it, after the others are gone."""
        if not self.root.is_dir():
            return 0
        entries = self.entries()
        for entry in entries:
            shutil.rmtree(entry, ignore_errors=True)
        for shard in {entry.parent for entry in entries}:
            if shard.is_dir() and not any(shard.iterdir()):
                with contextlib.suppress(OSError):
                    shard.rmdir()
        jinja = self.root / "jinja"
        if jinja.is_dir() and all(TEMPLATE_FILE.fullmatch(f.name) for f in jinja.iterdir()):
            shutil.rmtree(jinja, ignore_errors=True)
        left = [entry for entry in entries if entry.exists()]
        removed = sum(1 for entry in entries if not entry.name.startswith(".") and entry not in left)
        if left:
            raise PtxgenError(f"cache {self.root}: removed {removed} entries; {len(left)} could not be removed "
                              f"(a read-only folder?), e.g. {left[0]}")
        return removed


def check_cache_root(root: Path) -> None:
    """A cache path that is not a folder, or lies under a file, is a user error worth naming."""
    if root.exists() and not root.is_dir():
        raise PtxgenError(f"PTXGEN_CACHE_DIR {root} is not a folder")
    blocking = file_in_the_way(root)
    if blocking is not None:
        raise PtxgenError(f"PTXGEN_CACHE_DIR {root}: {blocking} is a file, not a folder")
