"""A cache folder, or a folder in it, that the user may not enter (another user's, mode 700): a
build goes on without what it cannot read, with a note; `cache info` and `cache clean` do what
they can and exit 2 naming the folder; never a traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from helpers import run_cli, unprivileged

SPEC = '[target]\narchs = ["sm_80"]\n' + "".join(
    f'[[kernels]]\nname = "norm{hidden}"\nkind = "rmsnorm"\nhidden = {hidden}\n' for hidden in (64, 128, 256))


@pytest.fixture
def ptxgen(tmp_path):
    """`ptxgen ARGS` in a subprocess where file permissions bind, with PTXGEN_CACHE_DIR `cache`."""
    prefix = unprivileged()
    if prefix is None:
        pytest.skip("running as root without setpriv: file permissions do not bind")
    (tmp_path / "spec.toml").write_text(SPEC)

    def run(*args: str, cache) -> subprocess.CompletedProcess:
        return run_cli(*args, cwd=tmp_path, env={"PTXGEN_CACHE_DIR": str(cache)}, prefix=prefix)
    return run


@pytest.fixture
def lock():
    """chmod 0 a folder (its mode given back after the test, so that pytest can remove it)."""
    locked = []

    def lock(folder):
        folder.chmod(0)
        locked.append(folder)
    yield lock
    for folder in locked:
        folder.chmod(0o755)


def one_error_line(result) -> str:
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize("where", ["a shard", "an entry", "the cache folder"])
def test_a_cache_folder_the_user_may_not_enter(tmp_path, ptxgen, lock, where):
    cache = tmp_path / "cache"
    assert ptxgen("build", "spec.toml", "-o", "warm", "-q", cache=cache).returncode == 0
    entries = sorted(cache.glob("??/*"))
    assert len(entries) == 3
    locked = {"a shard": entries[0].parent, "an entry": entries[0], "the cache folder": cache}[where]
    lock(locked)

    built = ptxgen("build", "spec.toml", "-o", "out", cache=cache)
    assert built.returncode == 0 and "Traceback" not in built.stderr, built.stderr
    assert built.stderr.startswith("note: cache ") and str(locked) in built.stderr, built.stderr
    assert (tmp_path / "out" / "manifest.json").read_bytes() == (tmp_path / "warm" / "manifest.json").read_bytes()

    info = one_error_line(ptxgen("cache", "info", cache=cache))
    assert f"cannot look into {locked}: permission denied" in info, info
    if where != "the cache folder":
        assert f"the rest holds {len([e for e in entries if locked not in (e, e.parent)])} entries" in info, info

    clean = one_error_line(ptxgen("cache", "clean", cache=cache))
    assert f"cannot look into {locked}: permission denied" in clean, clean
    if where != "the cache folder":  # all that it could remove is gone
        locked.chmod(0o755)
        assert sorted(cache.glob("??/*")) == [e for e in entries if locked in (e, e.parent)]


def test_a_cache_folder_the_user_may_not_reach(tmp_path, ptxgen, lock):
    """PTXGEN_CACHE_DIR under another user's folder (say /root/.cache/ptxgen)."""
    cache = tmp_path / "theirs" / "cache"
    cache.mkdir(parents=True)
    lock(cache.parent)
    built = ptxgen("build", "spec.toml", "-o", "out", "-q", cache=cache)
    assert built.returncode == 0 and "not writable" in built.stderr and "Traceback" not in built.stderr, built.stderr
    assert (tmp_path / "out" / "manifest.json").is_file()
    for command in ("info", "clean"):
        line = one_error_line(ptxgen("cache", command, cache=cache))
        assert line == f"error: PTXGEN_CACHE_DIR {cache}: Permission denied", line


def test_cache_clean_while_a_build_puts_an_entry_is_no_error(tmp_path, monkeypatch):
    """A build's put writing into its staging folder while `cache clean` removes it (the folder is
    not empty when rmtree comes to remove it) is a concurrent build, not a folder that could not
    be removed: clean succeeds, and the entry the build then renames into place is whole."""
    import shutil
    import tempfile

    from ptxgen import cache as cache_module
    from ptxgen.cache import Cache, cache_key

    root = tmp_path / "cache"
    cache = Cache(root)
    key = cache_key("ptx", "sm_80", "nvjitlink", "1", {})
    cache.put(key, b"old", "log")
    staging = Path(tempfile.mkdtemp(prefix=f".{key[:8]}-", dir=root / key[:2]))  # the running build's put
    real_rmtree = shutil.rmtree

    def rmtree_meanwhile_written(path, ignore_errors=False):
        real_rmtree(path, ignore_errors=ignore_errors)
        if Path(path) == staging:  # the build wrote its cubin after the listing: rmdir met a file
            staging.mkdir()
            (staging / "cubin").write_bytes(b"new")

    monkeypatch.setattr(cache_module.shutil, "rmtree", rmtree_meanwhile_written)
    assert cache.clean() == 1
    assert not (root / key[:2] / key).exists() and (staging / "cubin").read_bytes() == b"new"


def test_a_shard_removed_by_cache_clean_before_put_writes_in_it_is_made_again(tmp_path, monkeypatch):
    """`cache clean` removes a shard it emptied; a build's put that had just made that shard makes
    it again, rather than taking the cache for unwritable and building the rest without it."""
    import tempfile

    from ptxgen import cache as cache_module
    from ptxgen.cache import Cache, cache_key

    root, notes = tmp_path / "cache", []
    cache = Cache(root, report=notes.append)
    key = cache_key("ptx", "sm_80", "nvjitlink", "1", {})
    real_mkdtemp, removed = tempfile.mkdtemp, []

    def mkdtemp_after_clean(prefix, dir):
        if not removed:
            Path(dir).rmdir()  # clean's shard.rmdir(), between put's mkdir and its mkdtemp
            removed.append(dir)
        return real_mkdtemp(prefix=prefix, dir=dir)

    monkeypatch.setattr(cache_module.tempfile, "mkdtemp", mkdtemp_after_clean)
    cache.put(key, b"cubin", "log")
    assert removed and notes == [] and cache.writable
    assert cache.get(key) == (b"cubin", "log")
