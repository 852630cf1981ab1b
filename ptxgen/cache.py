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
from .artifacts import file_in_the_way, os_errors
from .errors import PtxgenError

SCHEMA = 5  # bump when the entry layout or what a key covers changes (4: ptxas logs name no scratch folder;
            # 5: no NVJITLINK_TRACE_MESSAGES lines in nvJitLink's logs)
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
    or missing permissions) is used read-only, and a folder of it that cannot be read (another
    user's) is built without, with a report, never an error: it only saves time."""

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
            # os.path.lexists: False, not a PermissionError, where the shard may not be entered
            # (another user's: nothing to drop there; put reports it, as it cannot write there either)
            if os.path.lexists(entry):
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
            for attempt in range(3):  # `cache clean` may remove the shard (then empty) in between: again
                entry.parent.mkdir(parents=True, exist_ok=True)
                try:
                    staging = Path(tempfile.mkdtemp(prefix=f".{key[:8]}-", dir=entry.parent))
                    break
                except FileNotFoundError:
                    if attempt == 2 or entry.parent.exists():
                        raise
        except OSError as error:
            self.writable = False
            # file_in_the_way would meet the same folder it may not enter
            blocking = None if isinstance(error, PermissionError) else file_in_the_way(entry)
            why = f"{blocking} is a file, not a folder" if blocking else f"{entry.parent}: {error.strerror or error}"
            self.report(f"cache {self.root} is not writable ({why}): building without it")
            return
        try:
            (staging / "cubin").write_bytes(cubin)
            (staging / "log").write_text(log)
            (staging / "sha256").write_text(_digest(key, cubin, log) + "\n")
            os.rename(staging, entry)
        except OSError:  # another process put the same entry first (identical by construction), or a full disk
            shutil.rmtree(staging, ignore_errors=True)

    def entries(self) -> tuple[list[Path], list[Path]]:
        """The folders this cache made: ROOT/ab/abcdef... (a key's 64 hex digits, under its first
        two) holding a `sha256` file, and put's staging leftovers beside them (named as put names
        them). Nothing else under ROOT is ever counted or removed (ROOT may be a folder the user
        shares with other files). Second, the folders on the way it may not look into (another
        user's): what they hold is unknown."""
        found, unreadable = [], []
        for shard in _listing(self.root, unreadable):
            if not (re.fullmatch(r"[0-9a-f]{2}", shard.name) and shard.is_dir()):
                continue
            for entry in _listing(shard, unreadable):
                if entry.is_dir() and (_KEY.fullmatch(entry.name) and entry.name.startswith(shard.name)
                                       and entry / "sha256" in _listing(entry, unreadable)
                                       and (entry / "sha256").is_file()
                                       or _STAGING.fullmatch(entry.name) and entry.name[1:3] == shard.name):
                    found.append(entry)
        return found, unreadable

    def info(self) -> CacheInfo:
        """What the cache holds; an error naming a folder it may not look into, with what it counted."""
        found, unreadable = self.entries()
        entries = [e for e in found if not e.name.startswith(".")]
        size = sum(f.stat().st_size for e in entries for f in e.iterdir() if f.is_file())
        if unreadable:
            raise PtxgenError(f"cache {self.root}: {_unreadable(unreadable)}; the rest holds {len(entries)} entries, "
                              f"{size / 1e6:.1f} MB")
        return CacheInfo(self.root, len(entries), size)

    def clean(self) -> int:
        """Remove every entry this cache made (and staging leftovers, and the compiled templates);
        the count of entries removed. An entry that cannot be removed (a read-only cache) is one
        error naming it, after the others are gone; so is a folder it may not look into."""
        if not self.root.is_dir():
            return 0
        entries, unreadable = self.entries()
        for entry in entries:
            shutil.rmtree(entry, ignore_errors=True)
        for shard in {entry.parent for entry in entries}:
            if shard.is_dir() and not any(shard.iterdir()):
                with contextlib.suppress(OSError):
                    shard.rmdir()
        jinja = self.root / "jinja"  # os.path.isdir: False where ROOT may not be entered (reported)
        if os.path.isdir(jinja) and all(TEMPLATE_FILE.fullmatch(f.name) for f in _listing(jinja, unreadable)):
            shutil.rmtree(jinja, ignore_errors=True)
        # A staging folder still there is a running build's put that wrote a file after rmtree listed
        # the folder (it renames it into place or removes it): not one that could not be removed.
        left = [entry for entry in entries if entry.exists() and not _STAGING.fullmatch(entry.name)]
        removed = sum(1 for entry in entries if not entry.name.startswith(".") and entry not in left)
        problems = [f"{len(left)} could not be removed (a read-only folder?), e.g. {left[0]}"] if left else []
        problems += [_unreadable(unreadable)] if unreadable else []
        if problems:
            raise PtxgenError(f"cache {self.root}: removed {removed} entries; {'; '.join(problems)}")
        return removed


def _listing(folder: Path, unreadable: list[Path]) -> list[Path]:
    """A folder's contents; none, and the folder added to `unreadable`, where it may not be listed or
    entered (so that what is listed may be looked at)."""
    try:
        os.stat(os.path.join(folder, "."))  # "FOLDER/." resolves only with search permission on FOLDER
        return list(folder.iterdir())
    except PermissionError:
        unreadable.append(folder)
        return []


def _unreadable(folders: list[Path]) -> str:
    """The folders `entries` may not look into, for a message."""
    more = f" (and {len(folders) - 1} more)" if len(folders) > 1 else ""
    return f"cannot look into {folders[0]}{more}: permission denied (another user's folder?)"


def check_cache_root(root: Path) -> None:
    """A cache path that is not a folder, lies under a file or cannot be reached is a user error
    worth naming."""
    with os_errors(f"PTXGEN_CACHE_DIR {root}"):  # a folder on its path that is another user's
        if root.exists() and not root.is_dir():
            raise PtxgenError(f"PTXGEN_CACHE_DIR {root} is not a folder")
        blocking = file_in_the_way(root)
    if blocking is not None:
        raise PtxgenError(f"PTXGEN_CACHE_DIR {root}: {blocking} is a file, not a folder")
