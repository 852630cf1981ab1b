"""Reading and writing `ptxgen run`'s .npz files without trusting them.

Every member is checked before numpy reads it: a .npy name, a plain (non-object) dtype, and a
declared shape whose bytes the member really holds, so a truncated archive, a stray member or a
header that claims terabytes is one clear error, not a traceback or an allocation.
"""

from __future__ import annotations

import contextlib
import io
import lzma
import math
import zipfile
import zlib
from pathlib import Path

import numpy as np

from .errors import LaunchError
from .quote import clip, echo

MAX_HEADER = 1 << 16


def load_npz(path: Path, what: str, check=None) -> dict[str, np.ndarray]:
    """Every array of an .npz archive, keyed by name (`what` names the option in messages).
    `check(declared)`, if given, sees every member before any data is read: its 0-d arrays read,
    the others as zero-stride arrays of the declared dtype and shape (no memory), so an array the
    caller would refuse is refused before the archive's gigabytes are inflated."""
    where = f"{what} {path}"
    if path.suffix.lower() != ".npz":
        raise LaunchError(f"{where}: expected an .npz archive (numpy.savez), got {path.suffix or 'no extension'!r}")
    if path.exists() and not path.is_file():
        raise LaunchError(f"{where}: not a regular file (a folder, a device or a pipe)")
    try:
        archive = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise LaunchError(f"{where}: no such file") from None
    except (OSError, zipfile.BadZipFile, ValueError) as error:
        raise LaunchError(f"{where}: not a readable .npz archive ({clip(str(error))})") from None
    with archive:
        declared = {}
        for member in archive.infolist():
            name = member.filename
            if not name.endswith(".npy") or "/" in name:
                raise LaunchError(f"{where}: member {echo(name)} is not an array (.npy)")
            if name[:-4] in declared:
                raise LaunchError(f"{where}: member {echo(name)} appears twice")
            with _member(archive, member, where) as stream:
                declared[name[:-4]] = _read_array(stream, member.file_size, data=False)
        if check is not None:
            check(declared)
        arrays = {}
        for member in archive.infolist():
            name = member.filename[:-4]
            if declared[name].ndim == 0:
                arrays[name] = declared[name]
                continue
            with _member(archive, member, where) as stream:
                arrays[name] = _read_array(stream, member.file_size, data=True)
    return arrays


@contextlib.contextmanager
def _member(archive, member, where: str):
    """An archive member's stream, its errors one LaunchError naming it."""
    name = member.filename[:-4]
    if member.flag_bits & 0x1:  # zipfile would ask for a password (a RuntimeError)
        raise LaunchError(f"{where}: {clip(name)}: encrypted (password-protected), which numpy.savez never writes")
    try:
        with archive.open(member) as stream:
            yield stream
    except LaunchError as error:
        raise LaunchError(f"{where}: {clip(name)}: {error}") from None
    # zlib.error, LZMAError: corrupt deflate or LZMA data (a corrupt bzip2 stream is an OSError);
    # NotImplementedError: a compression method or feature zipfile does not read; RuntimeError: a
    # compression module missing from this Python (bz2, lzma)
    except (OSError, zipfile.BadZipFile, ValueError, EOFError, zlib.error, lzma.LZMAError, NotImplementedError,
            RuntimeError) as error:
        raise LaunchError(f"{where}: {clip(name)}: unreadable ({clip(str(error))})") from None


def _read_array(stream, size: int, data: bool) -> np.ndarray:
    """One checked .npy member; with `data` False only its header (a 0-d array is read whole; any
    other is a zero-stride stand-in of its dtype and shape)."""
    version = np.lib.format.read_magic(stream)
    reader = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(version)
    if reader is None:
        raise LaunchError(f".npy format version {version} is not supported")
    shape, fortran, dtype = reader(stream, max_header_size=MAX_HEADER)
    if dtype.hasobject or dtype.kind not in "biuf":
        raise LaunchError(f"dtype {clip(str(dtype))} is not a plain number type")
    if any(extent < 0 for extent in shape):
        raise LaunchError(clip(f"declares a negative extent: {list(shape)}"))
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > size:
        raise LaunchError(clip(f"declares {list(shape)} {dtype} ({nbytes:,} bytes) but holds {size:,}"))
    if not data and shape:
        return np.lib.stride_tricks.as_strided(np.zeros(1, dtype), shape, (0,) * len(shape), writeable=False)
    raw = stream.read(nbytes)
    if len(raw) != nbytes:
        raise LaunchError(f"truncated: {len(raw):,} of {nbytes:,} bytes")
    array = np.frombuffer(raw, dtype=dtype).reshape(shape, order="F" if fortran else "C")
    return np.array(array, order="C")  # a writable, C-ordered copy (0-d stays 0-d)


def scalar_of(array: np.ndarray, where: str) -> int:
    """A runtime scalar given as a 0-d array: an integer, exactly."""
    if array.dtype.kind not in "iu":
        raise LaunchError(f"{where}: a runtime scalar must be an integer, got {array.dtype} {array[()]}")
    return int(array[()])


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write the .npz whole or not at all, never over anything but a regular file."""
    from .artifacts import write_file

    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    write_file(path, buffer.getvalue(), "--outputs")
