"""Reading and writing `ptxgen run`'s .npz files without trusting them.

Every member is checked before numpy reads it: a .npy name, a plain (non-object) dtype, and a
declared shape whose bytes the member really holds, so a truncated archive, a stray member or a
header that claims terabytes is one clear error, not a traceback or an allocation.
"""

from __future__ import annotations

import io
import math
import zipfile
from pathlib import Path

import numpy as np

from .errors import LaunchError
from .quote import clip, echo

MAX_HEADER = 1 << 16


def load_npz(path: Path, what: str) -> dict[str, np.ndarray]:
    """Every array of an .npz archive, keyed by name (`what` names the option in messages)."""
    where = f"{what} {path}"
    if path.suffix.lower() != ".npz":
        raise LaunchError(f"{where}: expected an .npz archive (numpy.savez), got {path.suffix or 'no extension'!r}")
    try:
        archive = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise LaunchError(f"{where}: no such file") from None
    except (OSError, zipfile.BadZipFile, ValueError) as error:
        raise LaunchError(f"{where}: not a readable .npz archive ({clip(str(error))})") from None
    arrays = {}
    with archive:
        for member in archive.infolist():
            name = member.filename
            if not name.endswith(".npy") or "/" in name:
                raise LaunchError(f"{where}: member {echo(name)} is not an array (.npy)")
            try:
                with archive.open(member) as stream:
                    arrays[name[:-4]] = _read_array(stream, member.file_size)
            except LaunchError as error:
                raise LaunchError(f"{where}: {clip(name[:-4])}: {error}") from None
            except (OSError, zipfile.BadZipFile, ValueError, EOFError) as error:
                raise LaunchError(f"{where}: {clip(name[:-4])}: unreadable ({clip(str(error))})") from None
    return arrays


def _read_array(stream, size: int) -> np.ndarray:
    version = np.lib.format.read_magic(stream)
    reader = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(version)
    if reader is None:
        raise LaunchError(f".npy format version {version} is not supported")
    shape, fortran, dtype = reader(stream, max_header_size=MAX_HEADER)
    if dtype.hasobject or dtype.kind not in "biuf":
        raise LaunchError(f"dtype {clip(str(dtype))} is not a plain number type")
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > size:
        raise LaunchError(clip(f"declares {list(shape)} {dtype} ({nbytes:,} bytes) but holds {size:,}"))
    data = stream.read(nbytes)
    if len(data) != nbytes:
        raise LaunchError(f"truncated: {len(data):,} of {nbytes:,} bytes")
    array = np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")
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
