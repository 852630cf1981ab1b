"""Content-addressed cubin cache: key = sha256 of everything that can change the output."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from . import __version__

SCHEMA = 1  # bump when the entry layout or what a key covers changes


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


class Cache:
    """Entries live in ROOT/ab/abcdef.../{cubin,log}; each is renamed into place whole."""

    def __init__(self, root: Path | None):
        self.root = root

    def _entry(self, key: str) -> Path:
        return self.root / key[:2] / key

    def get(self, key: str) -> tuple[bytes, str] | None:
        if self.root is None:
            return None
        entry = self._entry(key)
        try:
            return (entry / "cubin").read_bytes(), (entry / "log").read_text()
        except OSError:
            return None

    def put(self, key: str, cubin: bytes, log: str) -> None:
        if self.root is None:
            return
        entry = self._entry(key)
        entry.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{key[:8]}-", dir=entry.parent))
        (staging / "cubin").write_bytes(cubin)
        (staging / "log").write_text(log)
        try:
            os.rename(staging, entry)
        except OSError:  # another process put the same entry first: identical by construction
            shutil.rmtree(staging, ignore_errors=True)


def write_if_changed(path: Path, data: bytes) -> bool:
    """Atomically replace `path` with `data` unless it already holds exactly that."""
    try:
        if path.read_bytes() == data:
            return False
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
    os.replace(temporary, path)
    return True
