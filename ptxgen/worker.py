"""Device work in a child process, so that a faulting kernel cannot take the caller down with it.

A kernel fault (an illegal address, say) is sticky: the process's CUDA context is gone for good
and CUDA works again only in a new process (measured on an H100: cuDevicePrimaryCtxRetain fails
with the same error). So `ptxgen verify --backend device` and `ptxgen bench` hand each kernel's
device work to a DeviceWorker: a child (`python -m ptxgen.worker`) that owns the DeviceSession,
calls the top-level functions it is sent and sends back their results, or the PtxgenError they
raised. After a sticky fault it answers with the error and exits; the next call starts a fresh
child (imports and a new context: about a second), so a run over many kernels names the one that
faulted and goes on with the next.

The child is a plain subprocess rather than a multiprocessing one so that a command can be put in
front of it (`verify --sanitize` runs it under compute-sanitizer). Requests and replies are pickles
over a Unix socket in a private temporary folder. `ptxgen run` (one launch in a process that ends
right after) and the Python API (an engine owns its process) launch in their own process.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from multiprocessing.connection import Client, Connection
from typing import Callable, Sequence

from .errors import LaunchError, PtxgenError

START_TIMEOUT = 300.0  # seconds for a child to connect (a sanitizer can be slow to start one)
STOP_TIMEOUT = 30.0  # seconds for a child to exit after its socket closed
# Called first in every child: None in use; the tests put a simulated GPU behind ptxgen.device with it
# (a picklable top-level function, as the child imports it by name).
CHILD_SETUP: Callable[[], None] | None = None


class DeviceWorker:
    """A replaceable child process that runs device work: `call(function, *args)` runs
    function(*args) there and returns its result (a fresh child after one was lost)."""

    def __init__(self, prefix: Sequence[str] = ()):
        self.prefix = list(prefix)  # a command to run the child under, e.g. compute-sanitizer and its options
        self.process: subprocess.Popen | None = None
        self.connection: Connection | None = None
        self.folder: str | None = None

    def __enter__(self) -> DeviceWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def call(self, function: Callable, *args, **kwargs):
        if self.connection is None:
            self.start()
        try:
            self.connection.send((function, args, kwargs))
            outcome, value, lost = self.connection.recv()
        except (EOFError, OSError):
            status = self.stop()
            raise LaunchError(f"the device worker {describe_exit(status)} while running {function.__name__}; a fresh "
                              "one takes the next call") from None
        if lost:  # the child exits: its CUDA context is gone
            self.stop()
        if outcome == "error":
            raise value
        if outcome == "bug":
            raise RuntimeError(f"{function.__name__} failed in the device worker:\n{value}")
        return value

    def start(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="ptxgen-worker-")  # mode 0700: only this user can connect
        address = os.path.join(self.folder, "socket")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            server.bind(address)
            server.listen(1)
            server.settimeout(0.2)
            # The child imports what the parent can (ptxgen, and the tests' modules for CHILD_SETUP).
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
            command = [*self.prefix, sys.executable, "-m", "ptxgen.worker", address]
            try:
                self.process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=2)
            except OSError as error:
                self.stop()
                raise PtxgenError(f"cannot start the device worker ({command[0]}: {error.strerror or error})") from None
            deadline = time.monotonic() + START_TIMEOUT
            while True:
                try:
                    client, _ = server.accept()
                    break
                except socket.timeout:
                    if self.process.poll() is not None or time.monotonic() > deadline:
                        status = self.stop()
                        raise LaunchError(f"the device worker ({' '.join(command[:-1])}) {describe_exit(status)} "
                                          "before it started") from None
        finally:
            server.close()
        self.connection = Connection(client.detach())
        self.connection.send(CHILD_SETUP)

    def stop(self) -> int | None:
        """End the child (it exits when its socket closes); its exit status, None if none ran."""
        if self.connection is not None:
            self.connection.close()
            self.connection = None
        status = None
        if self.process is not None:
            try:
                status = self.process.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                status = self.process.wait()
            self.process = None
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None
        return status


def describe_exit(status: int | None) -> str:
    if status is None:
        return "did not answer"
    if status < 0:
        try:
            return f"was killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"was killed by signal {-status}"
    return f"exited with status {status}"


# --- the child ---------------------------------------------------------------------------------------
def serve(connection: Connection) -> None:
    """Answer requests until the parent closes the socket or the CUDA context is lost."""
    from . import device

    while True:
        try:
            function, args, kwargs = connection.recv()
        except EOFError:
            return
        try:
            reply = ("ok", function(*args, **kwargs))
        except PtxgenError as error:
            reply = ("error", error)
        except Exception:  # a bug: the parent shows its traceback
            reply = ("bug", traceback.format_exc())
        lost = device.lost_context is not None
        try:
            connection.send((*reply, lost))
        except Exception:  # e.g. a result that does not pickle
            connection.send(("bug", traceback.format_exc(), lost))
        if lost:
            return


def main(address: str) -> None:
    connection = Client(address, family="AF_UNIX")
    setup = connection.recv()
    if setup is not None:
        setup()
    serve(connection)


if __name__ == "__main__":
    main(sys.argv[1])
