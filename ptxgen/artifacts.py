"""Writing what ptxgen makes, whole or not at all, and never over a user's own file.

An artifact folder belongs to ptxgen once it holds a ptxgen manifest.json: a build into a folder
that exists, is not empty and has no manifest is refused. A build is staged in a sibling folder
and swapped in (atomically where the OS can exchange two paths), so a crash leaves the old build
or the new one, never a mix; files whose bytes did not change are hard-linked from the old build,
so their timestamps stay. Single files (`run --outputs`) are written to a temporary file beside
the target and renamed over it, and only ever over a regular file.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .errors import PtxgenError

STAGING = ".ptxgen-staging-"  # sibling folders: .<name>.ptxgen-staging-<pid>-<random>


@dataclass(frozen=True)
class Difference:
    stale: list[str]  # present with other bytes
    missing: list[str]
    unexpected: list[str]  # artifact-like files the build does not make

    def lines(self) -> list[str]:
        return ([f"stale: {p}" for p in self.stale] + [f"missing: {p}" for p in self.missing]
                + [f"unexpected: {p}" for p in self.unexpected])


def _is_artifact(relative: str) -> bool:
    parts = relative.split("/")
    return (len(parts) == 1 and parts[0].endswith((".ptx", ".h", ".json"))) or (
        len(parts) == 2 and parts[0].startswith("sm_") and parts[1].endswith(".cubin"))


def folder_files(folder: Path) -> list[str]:
    """Relative paths of every file in a folder (hidden ones and links included)."""
    if not folder.is_dir():
        return []
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() or p.is_symlink())


def compare(folder: Path, files: dict[str, bytes]) -> Difference:
    """What differs between a folder and the files a build makes (nothing is written): any other
    file in it is unexpected, as a build refuses a folder holding files it did not write; a
    target a build refuses outright (a link, a file) is that error."""
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        check_output_folder(folder)
    stale, missing = [], []
    for relative, data in sorted(files.items()):
        path = folder / relative
        try:
            if path.read_bytes() != data:
                stale.append(relative)
        except OSError:
            missing.append(relative)
    unexpected = [p for p in folder_files(folder) if p not in files]
    return Difference(stale, missing, unexpected)


def read_only(path: Path, access: int) -> bool:
    """Whether `path` lacks `access` (os.W_OK...) or has no write bit at all: root passes every
    access(2) check, but a file or folder its user made read-only is theirs to keep."""
    return not os.access(path, access) or not path.stat().st_mode & 0o222


def file_in_the_way(path: Path) -> Path | None:
    """A file where one of `path`'s folders should be, if any."""
    return next((p for p in path.absolute().parents if p.exists() and not p.is_dir()), None)


def check_output_folder(folder: Path) -> None:
    """Refuse a target that is not a folder ptxgen may own (before any work is done)."""
    with os_errors(f"-o {folder}"):
        _check_output_folder(folder)


def _check_output_folder(folder: Path) -> None:
    if folder.is_symlink():
        raise PtxgenError(f"-o {folder}: is a symbolic link; give the folder itself (ptxgen replaces the folder whole)")
    if folder.exists() and not folder.is_dir():
        raise PtxgenError(f"-o {folder}: exists and is not a folder")
    if folder.is_dir() and read_only(folder, os.W_OK | os.X_OK):
        raise PtxgenError(f"-o {folder}: the folder is read-only; refusing to replace it")
    blocking = file_in_the_way(folder)
    if blocking is not None:
        raise PtxgenError(f"-o {folder}: {blocking} is a file, not a folder")
    nearest = next(p for p in folder.absolute().parents if p.exists())  # the build is staged and swapped in there
    if read_only(nearest, os.W_OK | os.X_OK):
        raise PtxgenError(f"-o {folder}: the folder {nearest} is read-only")
    if folder.is_dir() and any(folder.iterdir()) and not (folder / "manifest.json").is_file():
        raise PtxgenError(f"-o {folder}: the folder is not empty and holds no ptxgen manifest.json; ptxgen writes only "
                          "into an empty folder or one it built before (choose another folder)")
    if folder.is_dir() and (folder / "manifest.json").is_file():
        try:
            manifest = json.loads((folder / "manifest.json").read_text())
        except (OSError, ValueError, UnicodeDecodeError):
            manifest = None
        if not isinstance(manifest, dict) or "ptxgen_version" not in manifest:
            raise PtxgenError(f"-o {folder}: its manifest.json was not written by ptxgen; choose another folder")
        present = [name for name in folder_files(folder) if (folder / name).is_file()]
        extra = [name for name in present if not _is_artifact(name)]
        if extra:
            raise PtxgenError(f"-o {folder}: holds files ptxgen did not write ({', '.join(extra[:3])}); "
                              "move them out or choose another folder")
        kept = [name for name in present if read_only(folder / name, os.W_OK)]
        if kept:
            raise PtxgenError(f"-o {folder}: holds read-only files ({', '.join(kept[:3])}); refusing to replace "
                              "them (make them writable or choose another folder)")


def write_folder(folder: Path, files: dict[str, bytes]) -> None:
    """Make `folder` hold exactly `files` (relative path -> bytes), swapped in whole."""
    check_output_folder(folder)
    parent = folder.absolute().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        remove_leftovers(parent, folder.name)
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}{STAGING}{os.getpid()}-", dir=parent))
    except OSError as error:
        raise PtxgenError(f"-o {folder}: cannot write there ({error.strerror or error})") from None
    try:
        for relative, data in sorted(files.items()):
            target, old = staging / relative, folder / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            if _same_bytes(old, data):
                os.link(old, target)  # unchanged: keep the old file (and its timestamp)
            else:
                target.write_bytes(data)
                os.chmod(target, 0o666 & ~_umask())
        for directory in [staging, *[p for p in staging.rglob("*") if p.is_dir()]]:
            os.chmod(directory, 0o777 & ~_umask())
        _swap_in(staging, folder.absolute())
    except OSError as error:
        raise PtxgenError(f"-o {folder}: writing the build failed ({error.strerror or error}); the folder is as "
                          "it was") from None
    finally:
        remove_tree(staging)


def _same_bytes(path: Path, data: bytes) -> bool:
    try:
        return path.is_file() and not path.is_symlink() and path.stat().st_size == len(data) \
            and path.read_bytes() == data
    except OSError:
        return False


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2 RENAME_EXCHANGE); False where unavailable."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    at_cwd = -100
    result = renameat2(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), _RENAME_EXCHANGE)
    if result == 0:
        return True
    if ctypes.get_errno() in (22, 38, 95):  # EINVAL / ENOSYS / EOPNOTSUPP: a filesystem without it
        return False
    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


def _swap_in(staging: Path, folder: Path) -> None:
    """Put staging at `folder`; the old folder (if any) ends in staging, which the caller removes.
    Concurrent builds into one folder each swap in a whole build; the last one stays."""
    for _attempt in range(8):
        if not folder.exists():
            try:
                os.rename(staging, folder)
                return
            except OSError:
                if not folder.exists():
                    raise
                continue  # another build put its folder there first: swap with it
        if _exchange(staging, folder):
            return
        # No atomic exchange here: move the old folder aside, then put the new one in place.
        aside = staging.with_name(staging.name + "-old")
        os.rename(folder, aside)
        try:
            os.rename(staging, folder)
        except OSError:
            os.rename(aside, folder)
            raise
        os.rename(aside, staging)
        return
    raise OSError(16, "other builds keep replacing the folder")


def remove_leftovers(parent: Path, name: str) -> None:
    """Staging folders of builds into `name` whose process is gone (a crash, a kill)."""
    for leftover in parent.glob(f".{name}{STAGING}*"):
        pid = leftover.name[len(f".{name}{STAGING}"):].split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            remove_tree(leftover)


def remove_tree(path: Path) -> None:
    """Delete a staging folder whole, the old build swapped into it included, even where that
    build's folders were made read-only (they are this user's: ptxgen moved them there)."""
    def writable(directory) -> None:
        try:
            os.chmod(directory, 0o700)
        except OSError:
            pass

    if path.is_symlink():  # a staging link an older ptxgen left (-o was a link): the link, never its target
        path.unlink(missing_ok=True)
        return
    if path.is_dir():
        writable(path)
        for root, folders, _ in os.walk(path):  # top-down: a folder is made writable before it is entered
            for folder in folders:
                if not os.path.islink(os.path.join(root, folder)):  # never a link's target
                    writable(os.path.join(root, folder))
    shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def os_errors(what: str):
    """An OSError of a file-system check (a name too long, a folder it may not search) as one
    message naming `what`."""
    try:
        yield
    except OSError as error:
        raise PtxgenError(f"{what}: {error.strerror or error}") from None


def check_output_file(path: Path, what: str, suffix: str | None = None, inputs=()) -> None:
    """Refuse, before any work is done, an output file write_file would refuse, one not named
    `suffix` (in any case), or one that is one of the command's `inputs` (paths; None where not
    given). `what` names the option in messages (e.g. "--outputs")."""
    with os_errors(f"{what} {path}"):
        _check_output_file(path, what, suffix, inputs)


def _check_output_file(path: Path, what: str, suffix: str | None, inputs) -> None:
    if path.is_symlink():
        raise PtxgenError(f"{what} {path}: is a symbolic link; give the file itself")
    if path.is_dir():
        raise PtxgenError(f"{what} {path}: is a folder; give a file name")
    if path.exists() and not path.is_file():
        raise PtxgenError(f"{what} {path}: is not a regular file (a device or a pipe); give a file name")
    if suffix is not None and path.suffix.lower() != suffix:  # X.NPZ is written under the name given
        raise PtxgenError(f"{what} {path}: expected a {suffix} file name")
    if path.is_file() and read_only(path, os.W_OK):
        raise PtxgenError(f"{what} {path}: the file is read-only; refusing to replace it")
    for given in inputs:
        if given is not None and path.is_file() and Path(given).exists() and os.path.samefile(path, given):
            raise PtxgenError(f"{what} {path}: is the input file {given}; refusing to replace it")
    blocking = file_in_the_way(path)
    if blocking is not None:
        raise PtxgenError(f"{what} {path}: {blocking} is a file, not a folder")
    parent = path.absolute().parent
    if not parent.is_dir():
        raise PtxgenError(f"{what} {path}: the folder {parent} does not exist")
    if read_only(parent, os.W_OK | os.X_OK):
        raise PtxgenError(f"{what} {path}: the folder {parent} is read-only")


def write_file(path: Path, data: bytes, what: str) -> None:
    """Replace a regular file (or create it) with `data`, whole or not at all, keeping an existing
    file's permissions. `what` names the option in messages (e.g. "--outputs")."""
    check_output_file(path, what)
    mode = stat.S_IMODE(path.stat().st_mode) if path.is_file() else 0o666 & ~_umask()
    try:
        if path.read_bytes() == data:
            return
    except OSError:
        pass
    try:
        descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.absolute().parent)
    except OSError as error:
        raise PtxgenError(f"{what} {path}: cannot write there ({error.strerror or error})") from None
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except OSError as error:
        Path(temporary).unlink(missing_ok=True)
        raise PtxgenError(f"{what} {path}: writing failed ({error.strerror or error})") from None
