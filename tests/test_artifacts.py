"""The artifact folder: owned by ptxgen, written whole, checked by `build --check`, described by
a C header that a C program can use; the cache refuses entries that no longer match their digest."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess

import jinja2
import pytest
import typer

from ptxgen import __version__, pipeline
from ptxgen.artifacts import STAGING, check_output_file, write_file
from ptxgen.cli import app
from ptxgen.errors import PtxgenError
from ptxgen.spec import load_spec

from helpers import ROOT, run_cli, run_cli_in_process, spec_kernel, unprivileged

SPEC = ROOT / "specs" / "qwen3.toml"


def build(out, *extra):
    return run_cli("build", str(SPEC), "-o", str(out), "--arch", "sm_80", "-q", *extra)


def snapshot(folder):
    return {p.relative_to(folder).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def built(tmp_path, cache_dir):
    out = tmp_path / "out"
    result = build(out)
    assert result.returncode == 0, result.stderr
    return out


def test_check_passes_on_a_fresh_build_and_names_stale_missing_and_extra_files(built):
    result = build(built, "--check")
    assert result.returncode == 0 and result.stdout == "", result.stdout + result.stderr
    summary = json.loads(build(built, "--check", "--json").stdout)
    assert summary == {"output": str(built), "up_to_date": True, "stale": [], "missing": [], "unexpected": []}
    (built / "qwen3_8b_rmsnorm.ptx").write_text("// edited by hand\n")
    (built / "sm_80" / "qwen3_8b_swiglu.cubin").unlink()
    (built / "sm_80" / "leftover.cubin").write_bytes(b"\x7fELF")
    before = snapshot(built)
    result = build(built, "--check")
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert f"{built}: stale: qwen3_8b_rmsnorm.ptx" in lines
    assert f"{built}: missing: sm_80/qwen3_8b_swiglu.cubin" in lines
    assert f"{built}: unexpected: sm_80/leftover.cubin" in lines
    assert len(lines) == 3, lines
    result = build(built, "--check", "--json")
    assert result.returncode == 1 and json.loads(result.stdout) == {
        "output": str(built), "up_to_date": False, "stale": ["qwen3_8b_rmsnorm.ptx"],
        "missing": ["sm_80/qwen3_8b_swiglu.cubin"], "unexpected": ["sm_80/leftover.cubin"]}
    assert snapshot(built) == before, "--check must write nothing"
    nowhere = built.parent / "never_built"
    result = build(nowhere, "--check")
    assert result.returncode == 1 and "missing: manifest.json" in result.stdout and not nowhere.exists()
    (built / "notes.txt").write_text("mine")  # what a build would refuse to replace: not up to date either
    assert f"{built}: unexpected: notes.txt" in build(built, "--check").stdout.splitlines()
    link, plain = built.parent / "link", built.parent / "plain"
    link.symlink_to(built)
    plain.write_text("x")
    for target, message in ((link, "is a symbolic link"), (plain, "exists and is not a folder")):
        result = build(target, "--check")
        assert result.returncode == 2 and message in result.stderr, result  # as build says it


def test_rebuilding_keeps_unchanged_files_and_removes_stale_ones(built):
    before = snapshot(built)
    (built / "sm_80" / "gone_kernel.cubin").write_bytes(b"\x7fELF")
    assert build(built).returncode == 0
    after = snapshot(built)
    assert after == before, "an unchanged rebuild keeps every file (bytes and timestamps) and drops the stale one"
    assert not list(built.parent.glob(f".out{STAGING}*")), "no staging folder is left behind"


@pytest.mark.parametrize("setup, message", [
    (lambda d: (d.mkdir(), (d / "notes.txt").write_text("mine")), "not empty and holds no ptxgen manifest"),
    (lambda d: d.write_text("a file"), "exists and is not a folder"),
    (lambda d: (d.mkdir(), (d / "manifest.json").write_text('{"mine": 1}')), "not written by ptxgen"),
])
def test_a_folder_ptxgen_does_not_own_is_refused_and_left_untouched(tmp_path, cache_dir, setup, message):
    out = tmp_path / "target"
    setup(out)
    before = snapshot(out) if out.is_dir() else out.read_bytes()
    result = build(out)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert (snapshot(out) if out.is_dir() else out.read_bytes()) == before


def test_read_only_artifacts_and_folders_are_refused_and_left_untouched(built, tmp_path):
    """A file of a build its user made read-only is theirs to keep, and so is a read-only folder
    the build would be made in (root too: read_only looks at the write bits)."""
    kept = next(built.glob("*.ptx"))
    kept.chmod(0o444)
    before = snapshot(built)
    result = build(built)
    assert result.returncode == 2 and f"holds read-only files ({kept.name}); refusing to replace them" in result.stderr
    assert snapshot(built) == before and stat.S_IMODE(kept.stat().st_mode) == 0o444
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    result = build(locked / "sub")
    assert result.returncode == 2 and f"the folder {locked} is read-only" in result.stderr, result.stderr
    assert not list(locked.iterdir())


def test_a_file_where_an_arch_folder_belongs_stops_the_build_before_writing(built):
    shutil.rmtree(built / "sm_80")
    (built / "sm_80").write_text("not a folder")
    before = snapshot(built)
    result = build(built)
    assert result.returncode == 2 and "sm_80" in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert snapshot(built) == before


def test_user_files_inside_an_owned_folder_stop_the_build(built):
    (built / "my_notes.txt").write_text("mine")
    result = build(built)
    assert result.returncode == 2 and "my_notes.txt" in result.stderr
    assert (built / "my_notes.txt").read_text() == "mine"


def test_output_that_cannot_be_written_and_the_current_folder(tmp_path, cache_dir):
    result = run_cli("build", str(SPEC), "-o", "")
    assert result.returncode == 2 and "-o" in result.stderr and "Traceback" not in result.stderr
    blocked = tmp_path / "file"
    blocked.write_text("x")
    result = build(blocked / "sub")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"-o {blocked / 'sub'}: {blocked} is a file, not a folder" in result.stderr, result.stderr
    assert blocked.read_text() == "x"


def test_a_symbolic_link_as_the_folder_is_refused_and_left_as_it_is(tmp_path, cache_dir):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    result = build(tmp_path / "link")
    assert result.returncode == 2 and "is a symbolic link; give the folder itself" in result.stderr, result.stderr
    assert (tmp_path / "link").is_symlink() and not any((tmp_path / "real").iterdir())
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "cache") == ["link", "real"]  # no staging link


def test_a_cache_inside_the_artifact_folder_is_refused_before_any_work(tmp_path):
    for cache in (tmp_path / "out" / "cache", tmp_path / "out"):
        result = run_cli("build", str(SPEC), "-o", str(tmp_path / "out"), "--arch", "sm_80", "-q",
                         env={"PTXGEN_CACHE_DIR": str(cache)})
        assert result.returncode == 2 and "the cache folder (PTXGEN_CACHE_DIR" in result.stderr, result.stderr
        assert not (tmp_path / "out").exists()


def test_a_spec_file_name_that_is_not_utf8_is_refused(tmp_path, cache_dir):
    odd = os.fsdecode(bytes(tmp_path) + b"/\xff.toml")
    shutil.copy(SPEC, odd)
    result = run_cli("build", odd, "-o", str(tmp_path / "out"), "--arch", "sm_80", "-q")
    assert result.returncode == 2 and "the file name is not valid UTF-8" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "out").exists()


def test_specs_whose_names_differ_in_punctuation_get_distinct_include_guards():
    from ptxgen.header import _guard

    assert len({_guard(name) for name in ("a-b", "a_b", "A_B", "a.b", "\u00fc", "\u00e9")}) == 6


def test_a_killed_assembler_process_is_one_message(monkeypatch, cache_dir):
    """--jobs: a worker the OOM killer ends breaks the pool; one message, nothing written."""
    from concurrent.futures import Future
    from concurrent.futures.process import BrokenProcessPool

    class KilledPool:
        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def submit(self, *args):
            future = Future()
            future.set_exception(BrokenProcessPool("A process in the process pool was terminated abruptly"))
            return future

    monkeypatch.setattr(pipeline, "ProcessPoolExecutor", KilledPool)
    spec = load_spec(SPEC).spec
    with pytest.raises(PtxgenError, match=r"an assembler process \(--jobs\) ended abruptly"):
        pipeline.compile_spec(spec.model_copy(update={"kernels": spec.kernels[:2]}),
                              pipeline.BuildOptions(use_cache=False, jobs=2))


def test_a_crashed_builds_staging_folder_is_cleaned_up(built):
    leftover = built.parent / f".out{STAGING}999999999-abc"
    leftover.mkdir()
    (leftover / "half.ptx").write_text("half")
    assert build(built).returncode == 0
    assert not leftover.exists()


def test_a_corrupt_cache_entry_is_dropped_rebuilt_and_reported(tmp_path, cache_dir):
    out = tmp_path / "out"
    assert build(out).returncode == 0
    entries = [p for p in cache_dir.glob("??/*") if (p / "cubin").is_file()]
    assert entries
    for entry in entries:
        (entry / "cubin").write_bytes((entry / "cubin").read_bytes()[:100])
    shutil.rmtree(out)
    result = run_cli("build", str(SPEC), "-o", str(out), "--arch", "sm_80", "--json")
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("dropped and rebuilt") == len(entries)
    summary = json.loads(result.stdout)
    assert summary["assembled"] == len(entries) and summary["cached"] == 0
    import hashlib

    for meta in summary["manifest"]["kernels"].values():
        cubin = (out / meta["cubins"]["sm_80"]["file"]).read_bytes()
        assert cubin[:4] == b"\x7fELF" and hashlib.sha256(cubin).hexdigest() == meta["cubins"]["sm_80"]["sha256"]


def test_cache_clean_removes_only_what_the_cache_made(tmp_path, cache_dir):
    assert build(tmp_path / "out").returncode == 0
    mine = [cache_dir / "go" / "src.txt", cache_dir / "ab" / "notes", cache_dir / "zz" / "f" / "x"]
    for path in mine:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("user data")
    clean = run_cli("cache", "clean")
    assert clean.returncode == 0, clean.stderr
    assert all(path.read_text() == "user data" for path in mine), "cache clean removed a user's file"
    assert "0 entries" in run_cli("cache", "info").stdout


def test_cache_clean_keeps_dot_folders_that_only_look_like_staging(tmp_path, cache_dir):
    """Staging leftovers are named as put names them (.<8 hex>-<8 characters>); a user's hidden
    folder inside a shard-like folder is not one."""
    assert build(tmp_path / "out").returncode == 0
    mine = [cache_dir / "be" / ".ef" / "file.txt", cache_dir / "ca" / ".fe-notes" / "todo.txt"]
    for path in mine:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("user data")
    assert run_cli("cache", "clean").returncode == 0
    assert all(path.read_text() == "user data" for path in mine), "cache clean removed a user's folder"


def test_an_entry_copied_under_another_key_is_dropped(tmp_path, cache_dir):
    """The digest covers the key: one kernel's entry under another's key is not taken for it."""
    out = tmp_path / "out"
    assert build(out).returncode == 0
    entries = sorted(p for p in cache_dir.glob("??/*") if (p / "cubin").is_file())
    for name in ("cubin", "log", "sha256"):
        shutil.copy(entries[1] / name, entries[0] / name)
    result = run_cli("build", str(SPEC), "-o", str(tmp_path / "again"), "--arch", "sm_80", "--json")
    assert result.returncode == 0 and result.stderr.count("dropped and rebuilt") == 1, result.stderr
    assert (tmp_path / "again" / "manifest.json").read_bytes() == (out / "manifest.json").read_bytes()


def test_compiled_templates_changed_on_disk_are_compiled_again(tmp_path, cache_dir):
    """Jinja's compiled templates are cached with a digest: code changed on disk (here a mul turned
    into an add, which still compiles) is not run; --no-cache does not read them at all."""
    assert build(tmp_path / "out").returncode == 0
    compiled = list((cache_dir / "jinja").glob("__jinja2_*.cache"))
    assert any(b"mul.f32" in path.read_bytes() for path in compiled)
    for path in compiled:
        path.write_bytes(path.read_bytes().replace(b"mul.f32", b"add.f32"))
    for extra in ([], ["--no-cache"]):
        shutil.rmtree(cache_dir / "jinja" if extra else tmp_path / "nothing", ignore_errors=True)
        again = tmp_path / f"again{len(extra)}"
        assert build(again, *extra).returncode == 0
        assert snapshot_bytes(again) == snapshot_bytes(tmp_path / "out")


def snapshot_bytes(folder):
    return {name: data for name, (data, _) in snapshot(folder).items()}


def test_a_template_cache_that_cannot_be_written_costs_only_time(tmp_path):
    """A full disk, a removed folder or a file in the way: rendering goes on without the cache."""
    from ptxgen.render import TemplateCache

    blocker = tmp_path / "file"
    blocker.write_text("x")
    environment = jinja2.Environment(loader=jinja2.DictLoader({"t": "{{ 1 + 2 }}"}),
                                     bytecode_cache=TemplateCache(blocker / "jinja"))
    assert environment.get_template("t").render() == "3"
    assert blocker.read_text() == "x"


def test_cache_info_and_clean(tmp_path, cache_dir):
    """One entry a kernel of the spec."""
    assert build(tmp_path / "out").returncode == 0
    kernels = len(load_spec(SPEC).spec.kernels)
    info = run_cli("cache", "info")
    assert info.returncode == 0 and f"{kernels} entries" in info.stdout, info.stdout
    clean = run_cli("cache", "clean")
    assert clean.returncode == 0 and f"removed {kernels} entries" in clean.stdout
    assert "0 entries" in run_cli("cache", "info").stdout


@pytest.mark.parametrize("setup", ["cannot be created", "read-only"])
def test_every_command_works_with_a_cache_it_cannot_write(tmp_path, setup):
    """The cache only saves time: a cache folder that cannot be written (or made) is read from,
    with one note, never an error; --no-cache works the same (as root, with the capabilities that
    bypass permissions dropped: unprivileged)."""
    prefix = unprivileged()
    if prefix is None:
        pytest.skip("running as root without setpriv: file permissions do not bind")
    if setup == "cannot be created":
        blocker = tmp_path / "a_file"
        blocker.write_text("x")
        cache = blocker / "cache"
    else:
        cache = tmp_path / "cache"
        assert run_cli("build", str(SPEC), "-o", str(tmp_path / "warm"), "--arch", "sm_80", "-q",
                       env={"PTXGEN_CACHE_DIR": str(cache)}).returncode == 0
        for folder in [cache, *cache.rglob("*")]:
            if folder.is_dir():
                folder.chmod(0o555)
    env = {"PTXGEN_CACHE_DIR": str(cache)}
    import numpy as np

    np.savez(tmp_path / "in.npz", x=np.ones((1, 4096), np.float32), gamma=np.ones(4096, np.float32))
    commands = [
        ["build", str(SPEC), "-o", str(tmp_path / "out"), "--arch", "sm_80", "-q"],
        ["build", str(SPEC), "-o", str(tmp_path / "out2"), "--arch", "sm_80", "-q", "--no-cache"],
        ["show", "qwen3_8b_rmsnorm", "--spec", str(SPEC), "--ptx"],
        ["run", "qwen3_8b_rmsnorm", "--spec", str(SPEC), "--inputs", str(tmp_path / "in.npz"),
         "--outputs", str(tmp_path / "out.npz"), "--set", "rows=1", "--backend", "emulator"],
        ["verify", str(SPEC), "--kernel", "qwen3_8b_q_norm"],
        ["cache", "info"],
        ["cache", "clean"],
    ]
    try:
        for command in commands:
            result = run_cli(*command, env=env, prefix=prefix)
            if command == ["cache", "clean"] and setup == "read-only":  # what it was asked to do, it cannot
                assert result.returncode == 2 and "could not be removed (a read-only folder?)" in result.stderr
                continue
            if command[0] == "cache" and setup == "cannot be created":  # the cache's own commands name why
                assert result.returncode == 2 and f"{blocker} is a file, not a folder" in result.stderr
                continue
            assert result.returncode == 0, (command, result.stderr)
            assert "Traceback" not in result.stderr and result.stderr.count("not writable") <= 1, result.stderr
    finally:
        for folder in [cache, *cache.rglob("*")] if cache.is_dir() else []:
            if folder.is_dir():
                folder.chmod(0o755)


def test_the_progress_bar_advances_once_per_cubin_as_it_is_assembled(monkeypatch, cache_dir):
    events = []
    real_assemble = pipeline.assemble
    monkeypatch.setattr(pipeline, "assemble", lambda *args: (events.append("assemble"), real_assemble(*args))[1])
    spec = load_spec(SPEC).spec
    spec = spec.model_copy(update={"kernels": spec.kernels[:3]})
    options = pipeline.BuildOptions(use_cache=False, progress=lambda label: events.append("progress"))
    pipeline.compile_spec(spec, options)
    count = len(spec.kernels) * len(spec.target.archs)
    assert events == ["assemble", "progress"] * count, events


def test_artifacts_get_the_umasks_permissions(tmp_path, cache_dir):
    mask = os.umask(0o027)
    try:
        result = run_cli_in_process("build", str(SPEC), "-o", str(tmp_path / "out"), "--arch", "sm_80", "-q")
    finally:
        os.umask(mask)
    assert result.returncode == 0, result
    for path in [tmp_path / "out", *(tmp_path / "out").rglob("*")]:
        expected = 0o750 if path.is_dir() else 0o640
        assert stat.S_IMODE(path.stat().st_mode) == expected, (path, oct(path.stat().st_mode))


def test_a_replaced_file_keeps_its_permissions_and_a_read_only_one_is_kept(tmp_path):
    """write_file (--outputs, --json, --save-logits, specs) replaces a file whole; the user's
    permissions stay, and a file without write bits is refused, by root too."""
    path = tmp_path / "out.json"
    path.write_text("old")
    path.chmod(0o604)
    write_file(path, b"new", "--json")
    assert path.read_bytes() == b"new" and stat.S_IMODE(path.stat().st_mode) == 0o604
    path.chmod(0o444)
    with pytest.raises(PtxgenError, match="the file is read-only; refusing to replace it"):
        write_file(path, b"newer", "--json")
    assert path.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


# --- the command line's own output ----------------------------------------------------------------------
def all_commands(command=None, prefix=()):
    command = command or typer.main.get_command(app)
    for name, sub in getattr(command, "commands", {}).items():
        yield (*prefix, name), sub
        yield from all_commands(sub, (*prefix, name))


def test_every_commands_help_keeps_its_text_and_bracketed_defaults():
    commands, checked = list(all_commands()), 0
    assert {("build",), ("validate",), ("run",), ("verify",), ("cache", "info")} <= {names for names, _ in commands}
    for names, command in commands:
        result = run_cli_in_process(*names, "--help")
        assert result.returncode == 0 and result.stderr == "", (names, result)
        text = " ".join(result.stdout.split())
        for param in command.params:
            if getattr(param, "help", None):
                assert " ".join(param.help.split()) in text, (names, param.help)
            if param.show_default and param.default not in (None, False, ()) and not getattr(param, "is_flag", False):
                checked += 1
                assert f"[default: {getattr(param.default, 'value', param.default)}" in text, (names, param.name)
        assert "\u256d" not in result.stdout, "a rich box in help text"
    assert checked >= 8, f"only {checked} defaults were checked"
    build_help = " ".join(run_cli_in_process("build", "--help").stdout.split())
    assert "(default build/<spec name>)" in build_help and "[default: 1; x>=1]" in build_help


def test_version_plurals_and_raw_ptx():
    assert run_cli_in_process("--version").stdout == f"ptxgen {__version__}\n"
    one = ROOT / "specs" / "qwen3.toml"
    result = run_cli_in_process("show", "qwen3_8b_decode_attention", "--spec", str(one), "--ptx")
    assert result.returncode == 0
    assert result.stdout == spec_kernel(one, "qwen3_8b_decode_attention").portable.ptx, "show --ptx is the PTX, byte for byte"
    assert max(len(line) for line in result.stdout.splitlines()) > 80, "a line longer than a terminal stays one line"


def test_validate_says_one_kernel(tmp_path):
    spec = tmp_path / "one.toml"
    spec.write_text('[[kernels]]\nname = "a"\nkind = "rmsnorm"\nhidden = 64\n')
    assert run_cli_in_process("validate", str(spec)).stdout == f"{spec}: ok, 1 kernel for sm_80, sm_86, sm_89, sm_90\n"


def test_tables_are_plain_unwrapped_text_in_a_pipe():
    result = run_cli_in_process("list")
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["kind", "what", "it", "computes"] and "\u2503" not in result.stdout
    from ptxgen.kernels import KINDS

    assert [line.split()[0] for line in lines[1:]] == list(KINDS), "one line per kind, names whole"


# --- the C header --------------------------------------------------------------------------------
C_PROGRAM = r"""
#include <stdio.h>
#include "qwen3.h"
int main(void) {
    unsigned lengths[] = {0, 1, 31, 32, 33, 1000, 4096, 8191, 40960, 70000};
    for (int i = 0; i < 10; i++) {
        ptxgen_dim3 g = qwen3_8b_decode_attention_grid(lengths[i]);
        printf("attention %u %u %u %u %d\n", lengths[i], g.x, g.y, g.z,
               qwen3_8b_decode_attention_scalars_ok(lengths[i]));
    }
    unsigned rows[] = {0, 1, 7, 100000};
    for (int i = 0; i < 4; i++) {
        ptxgen_dim3 g = qwen3_8b_q_norm_grid(rows[i]);
        printf("q_norm %u %u %u %u\n", rows[i], g.x, g.y, g.z);
    }
    ptxgen_dim3 b = qwen3_8b_prefill_attention_block();
    printf("prefill %u %u %u %u %u\n", qwen3_8b_prefill_attention_grid(4097).x, qwen3_8b_prefill_attention_grid(4097).y,
           b.x, qwen3_8b_prefill_attention_dynamic_shared(4097), QWEN3_8B_PREFILL_ATTENTION_NUM_PARAMS);
    printf("workspace %llu\n", (unsigned long long)qwen3_8b_decode_attention_workspace_bytes_partials(1));
    qwen3_8b_rmsnorm_args a = {0x1000, 0x2000, 0x3000, 5};
    void* params[QWEN3_8B_RMSNORM_NUM_PARAMS];
    qwen3_8b_rmsnorm_params(&a, params);
    printf("params %d %llu %u\n", (int)((char*)params[3] - (char*)&a), (unsigned long long)*(uint64_t*)params[1],
           *(uint32_t*)params[3]);
    printf("cubin %s %s %s\n", QWEN3_8B_RMSNORM_ENTRY, qwen3_8b_rmsnorm_cubins[0][0], qwen3_8b_rmsnorm_cubins[0][1]);
    return 0;
}
"""


def test_the_c_header_compiles_and_gives_the_same_launches_as_python(built, tmp_path):
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        pytest.skip("no C compiler on this machine")
    source = tmp_path / "main.c"
    source.write_text(C_PROGRAM)
    binary = tmp_path / "main"
    compiled = subprocess.run([compiler, "-std=c99", "-Wall", "-Wextra", "-Werror", "-I", str(built), str(source),
                               "-o", str(binary)], capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stderr
    lines = subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout.splitlines()
    attention = spec_kernel(SPEC, "qwen3_8b_decode_attention")
    low, high = attention.scalar_limits["seq_len"]
    expected = []
    for length in (0, 1, 31, 32, 33, 1000, 4096, 8191, 40960, 70000):
        grid = attention.portable.geometry.at({"seq_len": length}).grid
        expected.append(f"attention {length} {grid[0]} {grid[1]} {grid[2]} {int(low <= length <= high)}")
    q_norm = spec_kernel(SPEC, "qwen3_8b_q_norm")
    for rows in (0, 1, 7, 100000):
        grid = q_norm.portable.geometry.at({"tokens": rows}).grid
        expected.append(f"q_norm {rows} {grid[0]} {grid[1]} {grid[2]}")
    prefill = spec_kernel(SPEC, "qwen3_8b_prefill_attention").launch({"seq_len": 4097})
    expected.append(f"prefill {prefill.grid[0]} {prefill.grid[1]} {prefill.block[0]} {prefill.dynamic_shared} 5")
    partials = attention.param("partials")
    expected.append(f"workspace {partials.nbytes({})}")
    expected.append("params 24 8192 5")
    config = load_spec(SPEC).spec
    assert config.kernel("qwen3_8b_rmsnorm")
    expected.append("cubin qwen3_8b_rmsnorm sm_80 sm_80/qwen3_8b_rmsnorm.cubin")
    assert lines == expected


def test_every_name_the_header_defines_is_one_the_spec_checks_for_collisions(built):
    """spec validation refuses kernel names whose header blocks would define the same identifier
    (header.defined_names); that holds only if it knows every name a block defines."""
    import re

    from ptxgen.header import defined_names

    manifest = json.loads((built / "manifest.json").read_text())
    blocks = re.split(r"^/\* --- (\w+): ", (built / "qwen3.h").read_text(), flags=re.M)[1:]
    assert len(blocks) == 2 * len(manifest["kernels"])
    for name, block in zip(blocks[::2], blocks[1::2]):
        entry = manifest["kernels"][name]
        targets = [t for t in entry["variants"] if t != entry["ptx_target"]]
        found = set(re.findall(r"^#define (\w+)", block, re.M))
        found |= set(re.findall(r"^static [^(=\[]*?\b(\w+)(?:\(|\[)", block, re.M))
        found |= set(re.findall(r"^} (\w+);", block, re.M))
        workspaces = {f"{name}_workspace_bytes_{p['name']}" for p in entry["params"] if p["role"] == "workspace"}
        assert found - workspaces == defined_names(name, targets), name


def test_the_artifacts_do_not_depend_on_which_cubins_the_cache_held(tmp_path, cache_dir):
    """A cache holding some archs' cubins but not others' (an --arch build before, an entry
    dropped as corrupt, a concurrent build's entries) gives the same bytes, header included."""
    spec = load_spec(SPEC)
    spec = spec.model_copy(update={"spec": spec.spec.model_copy(update={"kernels": spec.spec.kernels[:1]})})
    cold = pipeline.artifact_files(spec, pipeline.compile_spec(spec.spec).kernels)
    shutil.rmtree(cache_dir)
    archs = spec.spec.target.archs
    held = archs[:1] + archs[2:]  # the second arch a miss, assembled after the others were found
    first = spec.spec.model_copy(update={"target": spec.spec.target.model_copy(update={"archs": held})})
    pipeline.compile_spec(first)
    compiled = pipeline.compile_spec(spec.spec)
    assert compiled.cached == len(held) and compiled.assembled == 1
    warm = pipeline.artifact_files(spec, compiled.kernels)
    assert warm.keys() == cold.keys()
    assert [name for name in cold if warm[name] != cold[name]] == []


@pytest.mark.parametrize("name, suffix", [("OUT.NPZ", ".npz"), ("figures.JSON", ".json"), ("chart.Png", ".png"),
                                          ("logits.NPY", ".npy"), ("spec.TOML", ".toml")])
def test_an_output_file_suffix_is_matched_in_any_case(tmp_path, name, suffix):
    """Every output is written under the name given, so a suffix in capitals names the same format;
    another suffix is still refused."""
    check_output_file(tmp_path / name, "--out", suffix)
    with pytest.raises(PtxgenError, match=re.escape(f"--out {tmp_path / 'OUT.txt'}: expected a {suffix} file name")):
        check_output_file(tmp_path / "OUT.txt", "--out", suffix)
