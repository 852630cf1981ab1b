"""The one error family of ptxgen: the CLI turns any PtxgenError into a message and exit 2."""

import sys
from typing import Callable, NoReturn


class PtxgenError(Exception):
    """A user-facing error: its message is complete and needs no traceback."""


class SpecError(PtxgenError):
    """A spec file is malformed or violates a kind's rules."""


class AssemblerError(PtxgenError):
    """PTX failed to assemble; carries the assembler's log and a command to reproduce."""

    def __init__(self, message: str, log: str = "", repro: str = ""):
        super().__init__("\n".join(part for part in (message, log.strip(), repro) if part))
        self.message = message
        self.log = log
        self.repro = repro


class LaunchError(PtxgenError):
    """Bad runtime input: a scalar out of range, an array of the wrong dtype/shape."""


class DeviceUnavailable(PtxgenError):
    """No CUDA driver or GPU where one is needed."""


class InterpError(PtxgenError):
    """The interpreter met PTX it does not support, or could not proceed."""


class SanitizerError(InterpError):
    """The sanitizer found a memory, race, barrier, shuffle or register bug in a kernel."""


def exit_from(main: Callable[..., int], *args) -> NoReturn:
    """The bench scripts' error boundary, as the CLI's: exit with main's status, a PtxgenError as
    one line on stderr and exit 2, an interrupt as the line "interrupted" and exit 130."""
    try:
        sys.exit(main(*args))
    except PtxgenError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
