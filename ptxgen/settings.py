"""Settings read from the environment, once, in one place."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Settings:
    cache_dir: Path  # PTXGEN_CACHE_DIR, default $XDG_CACHE_HOME/ptxgen, else ~/.cache/ptxgen


def _read() -> Settings:
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ptxgen"
    return Settings(cache_dir=Path(os.environ.get("PTXGEN_CACHE_DIR") or default).expanduser())


SETTINGS = _read()
