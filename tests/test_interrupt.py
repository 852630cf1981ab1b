"""Ctrl-C during `build --jobs N`: one line, exit 130, nothing written, no assembler process left."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import ROOT

from ptxgen.errors import PtxgenError, exit_from

SPEC = ROOT / "specs" / "qwen3.toml"

# Each assembly takes an hour: a build that waits for its queued assemblies cannot end in the test's
# time. PRESS says when SIGINT comes: a Ctrl-C (to the whole process group, as a terminal sends it)
# during the first assembly; just after the second assembler process is started and before the
# pool records it (where a KeyboardInterrupt left a process the pool never stopped); while the
# first assembly's result is half sent (the pool's thread then waits for the rest); or a SIGINT to
# the build's process alone during the first assembly (its assembler processes keep running).
INTERRUPTED_BUILD = '''
import os, signal, struct, sys, time

def first(marker):
    """Whether this process is the first of the build's to get here."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True

def press():
    open(os.environ["PRESSED"], "w").close()
    if os.environ["PRESS"] == "build_only":
        os.kill(os.getppid(), signal.SIGINT)
    else:
        os.killpg(0, signal.SIGINT)

def send_half_then_press(queue, result):
    os.write(queue._writer.fileno(), struct.pack("!i", 1 << 20) + bytes(1000))  # a 1 MiB message's start
    press()
    time.sleep(3600)

def assemble(assembler, ptx, arch, options):
    if os.environ["PRESS"] == "failing" and first(os.environ["PRESSED"] + ".first"):
        from ptxgen.errors import AssemblerError

        open(os.environ["PRESSED"], "w").close()
        raise AssemblerError("ptxas: the first assembly fails")
    if os.environ["PRESS"] != "starting" and first(os.environ["PRESSED"] + ".first"):
        if os.environ["PRESS"] != "sending":
            press()
        else:
            import multiprocessing.queues
            multiprocessing.queues.SimpleQueue.put = send_half_then_press  # the result queue's
            return None
    time.sleep(3600)

if __name__ == "__main__":
    # SIGINT as an interactive shell starts a command: a background job of a script (`make test &`)
    # inherits it ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    from ptxgen import cli, pipeline

    pipeline.assemble = assemble
    if os.environ["PRESS"] == "starting":
        from multiprocessing.context import SpawnProcess

        start, started = SpawnProcess.start, []

        def start_then_press(process):
            start(process)
            started.append(process)
            if len(started) == 2:
                press()
                time.sleep(1)  # a KeyboardInterrupt raised now lands before the pool records the process

        SpawnProcess.start = start_then_press
    sys.argv = ["ptxgen", "build", sys.argv[1], "-o", sys.argv[2], "--jobs", "2", "--no-cache", "-q"]
    cli.main()
'''


def still_running(group: int, grace: float = 30.0) -> list[str]:
    """The processes of process group `group` still running after up to `grace` seconds (a zombie,
    ended and waiting for init to reap it, is not running), as 'pid (name'."""
    deadline = time.monotonic() + grace
    while True:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return []
        running = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, IndexError, ValueError):
                text = stat.read_text()
                state, _parent, its_group = text.rsplit(")", 1)[1].split()[:3]
                if int(its_group) == group and state != "Z":
                    running.append(text.rsplit(")", 1)[0])
        if not running or time.monotonic() > deadline:
            return running
        time.sleep(0.1)


def run_build(tmp_path, press: str) -> tuple[int, str, list[str]]:
    """The stubbed --jobs 2 build with `press`: its exit status, its stderr, and the processes of
    its group still running after it ended (it writes nothing: its folder is checked empty)."""
    script = tmp_path / "interrupted_build.py"
    script.write_text(INTERRUPTED_BUILD)
    folder = tmp_path / "build"
    folder.mkdir()
    env = {**os.environ, "PTXGEN_CACHE_DIR": str(tmp_path / "cache"), "PRESSED": str(tmp_path / "pressed"),
           "PRESS": press}
    build = subprocess.Popen([sys.executable, str(script), str(SPEC), str(folder / "out")], cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        # minutes: a loaded machine starts Python processes slowly; an hour of assembly cannot fit
        _, stderr = build.communicate(timeout=300)
        left = still_running(build.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(build.pid, signal.SIGKILL)
        build.communicate()
    assert (tmp_path / "pressed").exists(), "the build never reached the planted event"
    assert list(folder.iterdir()) == [], "an interrupted or failed build wrote its folder"
    return build.returncode, stderr, left


@pytest.mark.parametrize("press", ["assembling", "starting", "sending", "build_only"])
def test_ctrl_c_during_a_jobs_build_is_one_line_and_exit_130(tmp_path, press):
    """No KeyboardInterrupt traceback from any assembler process, the build ends now (not after
    its queued assemblies), writes nothing and leaves no assembler process running."""
    code, stderr, left = run_build(tmp_path, press)
    assert (code, stderr) == (130, "interrupted\n"), stderr
    assert left == [], f"still running after the build ended: {left}"


def test_an_assembler_error_ends_a_jobs_build_without_its_queued_assemblies(tmp_path):
    """The first assembly fails while the others would take an hour: the error is reported now
    (one message, exit 2), and no assembler process is left running."""
    code, stderr, left = run_build(tmp_path, "failing")
    assert code == 2 and stderr.startswith("error: kernel ") and "ptxas: the first assembly fails" in stderr, stderr
    assert "Traceback" not in stderr, stderr
    assert left == [], f"still running after the build ended: {left}"


@pytest.mark.parametrize("raised, code, line", [
    (KeyboardInterrupt(), 130, "interrupted"),
    (PtxgenError("spec.toml: no kernel 'x'"), 2, "error: spec.toml: no kernel 'x'"),
])
def test_the_bench_scripts_report_as_the_cli_does(capsys, raised, code, line):
    """errors.exit_from, the bench scripts' boundary: one line on stderr, the CLI's exit status."""
    def main():
        raise raised

    with pytest.raises(SystemExit) as exit:
        exit_from(main)
    assert exit.value.code == code
    assert capsys.readouterr().err == line + "\n"
