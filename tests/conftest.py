"""Fixtures shared by the test suite."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/helpers.py for the tests in subfolders too


def pytest_collection_modifyitems(items):
    """Tests marked slow first, so that pytest-xdist's workers do not end on one of them alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    """A private, empty assembly cache for this test (in-process and for subprocesses)."""
    directory = tmp_path / "cache"
    monkeypatch.setenv("PTXGEN_CACHE_DIR", str(directory))
    import ptxgen.pipeline
    import ptxgen.settings

    monkeypatch.setattr(ptxgen.pipeline, "SETTINGS", ptxgen.settings.Settings(cache_dir=directory))
    return directory
