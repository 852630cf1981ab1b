"""Content-addressed cubin cache: key = sha256 of everything that can change the output.

An entry is a folder ROOT/ab/abcdef.../ holding `cubin`, `log` and `sha256` (the digest of the
other two), renamed into place whole. A read checks the digest: an entry that was truncated or
changed on disk is dropped (and reported), and the caller assembles again.
"""

from __future__ import annotations

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
from .errors import PtxgenError

SCHEMA = 2  # bump when the entry layout or what a key covers changes
_HEX = re.compile(r"[0-9a-f]+")


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


def _digest(cubin: bytes, log: str) -> str:
    return hashlib.sha256(hashlib.sha256(cubin).digest() + log.encode()).hexdigest()


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
        if digest != _digest(cubin, log):
            self.drop(entry, "its cubin or log does not match its digest (truncated or changed)")
            return None
        return cubin, log

    def drop(self, entry: Path, why: str) -> None:
        self.report(f"cache entry {entry} dropped and rebuilt: {why}")
        shutil.rmtree(entry, ignore_errors=True)

    def put(self, key: str, cubin: bytes, log: str) -> None:
        if self.root is None or not self.writable:
            return
        entry = self._entry(key)
        try:
            entry.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{key[:8]}-", dir=entry.parent))
        except OSError as error:
            self.writable = False
            self.report(f"cache {self.root} is not writable ({error.strerror or error}): building without it")
            return
        try:
            (staging / "cubin").write_bytes(cubin)
            (staging / "log").write_text(log)
            (staging / "sha256").write_text(_digest(cubin, log) + "\n")
            os.rename(staging, entry)
        except OSError:  # another process put the same entry first (identical by construction), or a full disk
            shutil.rmtree(staging, ignore_errors=True)

    def entries(self) -> list[Path]:
        """The folders this cache made: ROOT/ab/abcdef... (hex names) holding a `sha256` file, and
        staging leftovers beside them. Nothing else under ROOT is ever counted or removed (ROOT
        may be a folder the user shares with other files)."""
        found = []
        for shard in self.root.glob("??"):
            if not (shard.is_dir() and _HEX.fullmatch(shard.name)):
                continue
            for entry in shard.iterdir():
                name = entry.name.lstrip(".").split("-")[0]
                if entry.is_dir() and (_HEX.fullmatch(entry.name) and (entry / "sha256").is_file()
                                       or entry.name.startswith(".") and _HEX.fullmatch(name)):
                    found.append(entry)
        return found

    def info(self) -> CacheInfo:
        entries = [e for e in self.entries() if not e.name.startswith(".")]
        size = sum(f.stat().st_size for e in entries for f in e.iterdir() if f.is_file())
        return CacheInfo(self.root, len(entries), size)

    def clean(self) -> int:
        """Remove every entry this cache made (and staging leftovers, and Jinja's compiled
        templates); the count of entries removed."""
        if not self.root.is_dir():
            return 0
        entries = self.entries()
        for entry in entries:
            shutil.rmtree(entry, ignore_errors=True)
        for shard in {entry.parent for entry in entries}:
            if not any(shard.iterdir()):
                shard.rmdir()
        jinja = self.root / "jinja"
        if jinja.is_dir() and all(f.name.startswith("__jinja2_") for f in jinja.iterdir()):
            shutil.rmtree(jinja, ignore_errors=True)
        return sum(1 for entry in entries if not entry.name.startswith("."))


def check_cache_root(root: Path) -> None:
    """A cache path that exists but is not a folder is a user error worth naming."""
    if root.exists() and not root.is_dir():
        raise PtxgenError(f"PTXGEN_CACHE_DIR {root} is not a folder")
