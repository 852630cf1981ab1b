"""Build: every spec assembles for every arch with zero spills, deterministically, cached."""

from __future__ import annotations

import json
import os

import pytest

from ptxgen.errors import DeviceUnavailable
from ptxgen.artifacts import write_folder
from ptxgen.pipeline import BuildOptions, artifact_files, compile_spec
from ptxgen.spec import load_spec, with_archs

from helpers import SPECS, run_cli


def run_build(spec, out, options):
    """What `ptxgen build` does: compile through the cache, write the folder; the manifest."""
    compiled = compile_spec(spec.spec, options)
    files = artifact_files(spec, compiled.kernels)
    write_folder(out, files)
    return json.loads(files["manifest.json"]), compiled.assembled, compiled.cached


def folder_bytes(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_every_kernel_assembles_for_every_arch_without_spills(path, tmp_path, cache_dir):
    spec = load_spec(path)
    manifest, _, _ = run_build(spec, tmp_path / "out", BuildOptions(jobs=2))
    for name, meta in manifest["kernels"].items():
        assert sorted(meta["cubins"]) == sorted(spec.spec.target.archs), name
        for arch, cubin in meta["cubins"].items():
            assert cubin["spill_stores"] == 0 and cubin["spill_loads"] == 0, f"{name} {arch} spills:\n{cubin['info_log']}"
            assert cubin["local_bytes"] == 0 and cubin["stack_bytes"] == 0, f"{name} {arch}:\n{cubin['info_log']}"
            assert 0 < cubin["registers"] <= 255, f"{name} {arch}"
            assert (tmp_path / "out" / cubin["file"]).read_bytes()[:4] == b"\x7fELF", f"{name} {arch} is not a cubin"


def test_builds_are_byte_identical_and_cached(tmp_path, cache_dir):
    spec = with_archs(load_spec(SPECS[0]), ("sm_80", "sm_90"))
    options = BuildOptions()
    _, assembled, cached = run_build(spec, tmp_path / "a", options)
    assert assembled == 2 * len(spec.spec.kernels) and cached == 0
    _, assembled, _ = run_build(spec, tmp_path / "b", options)
    assert assembled == 0, "an unchanged kernel must never be reassembled"
    _, assembled, _ = run_build(spec, tmp_path / "c", BuildOptions(use_cache=False, jobs=2))
    assert assembled == 2 * len(spec.spec.kernels)
    a, b, c = (folder_bytes(tmp_path / d) for d in "abc")
    assert a == b == c, "builds of the same spec must be byte-identical"
    manifest = json.loads(a["manifest.json"])
    assert manifest["spec"]["sha256"] == spec.sha256
    assert "Compile time" not in a["manifest.json"].decode(), "the info log must not carry timings"


def test_cache_entries_are_whole_and_keyed_by_ptx(tmp_path, cache_dir):
    spec = with_archs(load_spec(SPECS[0]), ("sm_80",))
    run_build(spec, tmp_path / "a", BuildOptions())
    entries = [p for p in cache_dir.glob("*/*") if p.is_dir()]
    assert len(entries) == len(spec.spec.kernels)
    assert all(sorted(f.name for f in e.iterdir()) == ["cubin", "log", "sha256"] for e in entries)
    assert not list(cache_dir.glob("*/.*")), "staging folders must not remain"


def test_stale_artifacts_of_an_earlier_build_are_removed(tmp_path, cache_dir):
    spec = with_archs(load_spec(SPECS[0]), ("sm_80",))
    out = tmp_path / "out"
    run_build(spec, out, BuildOptions())
    (out / "old_kernel.ptx").write_text("stale")
    (out / "sm_80" / "old_kernel.cubin").write_bytes(b"stale")
    run_build(spec, out, BuildOptions())
    assert not (out / "old_kernel.ptx").exists() and not (out / "sm_80" / "old_kernel.cubin").exists()


def test_driver_assembler_without_driver_is_a_clear_error(tmp_path, cache_dir):
    try:
        from ptxgen.device import driver

        driver()
        pytest.skip("a CUDA driver is present")
    except DeviceUnavailable:
        pass
    result = run_cli("build", str(SPECS[0]), "-o", str(tmp_path / "out"), "--assembler", "driver")
    assert result.returncode == 2 and "no CUDA driver/GPU" in result.stderr and "Traceback" not in result.stderr
    assert "--assembler auto (the default) or nvjitlink needs none" in result.stderr  # auto is the default, not nvjitlink
    assert not (tmp_path / "out").exists()


def test_cli_build_json_and_quiet(tmp_path, cache_dir):
    result = run_cli("build", str(SPECS[0]), "-o", str(tmp_path / "out"), "--json", "--arch", "sm_90")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["manifest"]["archs"] == ["sm_90"] and summary["assembled"] + summary["cached"] > 0
    quiet = run_cli("build", str(SPECS[0]), "-o", str(tmp_path / "out"), "-q", "--arch", "sm_90")
    assert quiet.returncode == 0 and quiet.stdout == "" and quiet.stderr == ""
    bad = run_cli("build", str(SPECS[0]), "--arch", "sm_75")
    assert bad.returncode == 2 and "--arch" in bad.stderr and "sm_75" in bad.stderr


def test_cli_list_show_and_usage_errors(tmp_path):
    listed = run_cli("list")
    assert listed.returncode == 0 and "rmsnorm" in listed.stdout
    from ptxgen.kernels import KINDS

    # one line a kind, each a whole clause of its module's summary (not its docstring's first line,
    # which stopped mid-parenthesis)
    lines = {line.split()[0]: line for line in listed.stdout.splitlines()[1:]}
    assert sorted(lines) == sorted(KINDS), listed.stdout
    for line in lines.values():
        summary = line.split(None, 1)[1]
        assert summary.count("(") == summary.count(")") and summary.count("`") % 2 == 0, line
    assert lines["q4k_gemv_group"].split(None, 1)[1] == "several Q4_K GEMVs that share their input, in one launch"
    shown = run_cli("show", "rmsnorm", "--spec", str(SPECS[0]))
    assert shown.returncode == 0 and "bytes" in shown.stdout and "roofline" in shown.stdout, shown.stderr
    assert "f32[rows, 4096]" in shown.stdout
    ptx = run_cli("show", "rmsnorm", "--spec", str(SPECS[0]), "--ptx")
    assert ptx.returncode == 0 and ".visible .entry" in ptx.stdout
    missing = run_cli("show", "nothing_like_this", "--spec", str(SPECS[0]))
    assert missing.returncode == 2 and "nothing_like_this" in missing.stderr
    usage = run_cli("build")
    assert usage.returncode == 2 and "Traceback" not in usage.stderr


# --- every arch list a spec may hold, and every CTA a kind may choose, gives cubins that launch --------
def spec_file(tmp_path, archs, body):
    path = tmp_path / "s.toml"
    path.write_text(f"[target]\narchs = {json.dumps(archs)}\n\n[[kernels]]\n{body}")
    return path


def test_a_large_cta_keeps_its_registers_within_the_sm(tmp_path, cache_dir):
    """rmsnorm of a 24576-wide row runs 1024 threads: .maxntid makes ptxas keep each thread
    within 64 registers (it took 70 without, and the cubin could never launch), and the result
    still passes its check."""
    spec = spec_file(tmp_path, ["sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"],
                     'name = "wide"\nkind = "rmsnorm"\nhidden = 24576\n')
    built = run_cli("build", str(spec), "-o", str(tmp_path / "out"), "--json")
    assert built.returncode == 0, built.stderr
    cubins = json.loads((tmp_path / "out" / "manifest.json").read_text())["kernels"]["wide"]["cubins"]
    assert {arch: c["registers"] <= 64 for arch, c in cubins.items()} == dict.fromkeys(cubins, True), cubins
    verified = run_cli("verify", str(spec))
    assert verified.returncode == 0 and "FAIL" not in verified.stdout, verified.stdout + verified.stderr


@pytest.mark.parametrize("jobs", [1, 2])
def test_ptx_the_assembler_refuses_names_the_kernel(tmp_path, cache_dir, monkeypatch, jobs):
    """The assembler's log gives line numbers of one kernel's PTX: the message names that kernel
    (it named only the arch), for build and verify alike, in a build of several kernels."""
    from ptxgen import pipeline
    from ptxgen.errors import AssemblerError

    real = pipeline.render
    monkeypatch.setattr(pipeline, "render", lambda config, *args, **kwargs: real(config, *args, **kwargs).replace(
        "\tret;", "\tno_such.instruction;\n\tret;", 1) if config.name == "broken" else real(config, *args, **kwargs))
    spec = load_spec(spec_file(tmp_path, ["sm_80"], 'name = "fine"\nkind = "rmsnorm"\nhidden = 64\n\n[[kernels]]\n'
                                                   'name = "broken"\nkind = "rmsnorm"\nhidden = 64\n'))
    with pytest.raises(AssemblerError) as caught:
        compile_spec(spec.spec, BuildOptions(use_cache=False, jobs=jobs))
    assert str(caught.value).startswith("kernel 'broken': nvJitLink failed to assemble PTX for sm_80\n"), caught.value
    assert "no_such" in str(caught.value)


def test_a_cubin_that_could_never_launch_is_refused(tmp_path, cache_dir, monkeypatch):
    """The build's own check, should a kind's directives allow too many registers."""
    from ptxgen import pipeline
    from ptxgen.errors import AssemblerError

    real = pipeline.parse_resources
    monkeypatch.setattr(pipeline, "parse_resources", lambda log, cubin: {**real(log, cubin), "registers": 70})
    spec = load_spec(spec_file(tmp_path, ["sm_90"], 'name = "wide"\nkind = "rmsnorm"\nhidden = 24576\n'))
    with pytest.raises(AssemblerError, match=r"kernel 'wide': sm_90: a CTA of 1024 threads at 70 registers each "
                                             r"does not fit an SM's 65536 registers: it could never launch"):
        compile_spec(spec.spec, BuildOptions(use_cache=False))


def test_an_arch_specific_oldest_arch_leaves_the_portable_ptx_for_its_base_arch(tmp_path, cache_dir):
    """With sm_90a the oldest arch, the portable PTX is for sm_90 (PTX for sm_90a serves no later
    arch): sm_100 gets a cubin, and sm_90a the kind's own variant, graded by its own error bound."""
    spec = spec_file(tmp_path, ["sm_90a", "sm_100"], 'name = "norm"\nkind = "rmsnorm"\nhidden = 64\n')
    assert run_cli("build", str(spec), "-o", str(tmp_path / "norm")).returncode == 0
    manifest = json.loads((tmp_path / "norm" / "manifest.json").read_text())["kernels"]["norm"]
    assert list(manifest["variants"]) == ["sm_90"] and sorted(manifest["cubins"]) == ["sm_100", "sm_90a"]
    attention = spec_file(tmp_path, ["sm_90a"], 'name = "a"\nkind = "flash_attention"\nnum_heads = 1\n'
                                                'num_kv_heads = 1\nhead_dim = 64\n')
    verified = run_cli("verify", str(attention))
    assert verified.returncode == 0 and " pass" in verified.stdout, verified.stdout + verified.stderr
    assert run_cli("build", str(attention), "-o", str(tmp_path / "a")).returncode == 0
    cubins = json.loads((tmp_path / "a" / "manifest.json").read_text())["kernels"]["a"]["cubins"]
    assert cubins["sm_90a"]["ptx"] == "a.sm_90a.ptx"


def test_show_gives_each_arch_its_own_ctas_occupancy_and_models_the_sm90a_variant(tmp_path, cache_dir):
    spec = spec_file(tmp_path, ["sm_90", "sm_90a"], 'name = "a"\nkind = "flash_attention"\nnum_heads = 1\n'
                                                    'num_kv_heads = 1\nhead_dim = 64\n')
    shown = run_cli("show", "a", "--spec", str(spec), "--json", "--set", "seq_len=128")
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    warps = {arch: detail["warps_per_sm"] // detail["ctas_per_sm"] for arch, detail in report["occupancy_detail"].items()}
    assert warps == {"sm_90": 4, "sm_90a": 9}, warps     # 128 threads; 288 (a producer warp, 2 consumer warpgroups)
    assert report["model"]["thread_instructions"] > 0    # the H100 runs the sm_90a cubin: its PTX interpreted


@pytest.mark.parametrize("name, kind, fields", [
    ("q4k_smem", "q4k_gemv", "n = 64\nk = 256"),        # the GEMVs' shared staging buffer
    ("scratch", "incremental_attention", "num_heads = 4\nnum_kv_heads = 1\nhead_dim = 64\nmax_seq_len = 64"),
    ("DONE", "argmax", "n = 100"),                      # a label
    ("WARP_SZ", "rmsnorm", "hidden = 64"),              # PTX's predefined constant
    ("gamma", "rmsnorm", "hidden = 64"),                # one of its parameters
])
def test_a_kernel_named_like_a_name_in_its_ptx_is_refused(tmp_path, name, kind, fields):
    """nvJitLink crashed the process (a segfault, exit 139) on the first two and on a parameter's
    name, and refused the others with its log: one message naming the spec file and the kernel,
    exit 2, nothing built; verify gives the same message."""
    from helpers import CliResult, run_cli_in_process

    spec = tmp_path / "named.toml"
    spec.write_text(f'[target]\narchs = ["sm_80"]\n\n[[kernels]]\nname = "{name}"\nkind = "{kind}"\n{fields}\n')
    message = (f"error: {spec}: kernel {name!r}: the {kind} kind's PTX uses {name!r} for a name of its own (a "
               "parameter, a label, a variable or a PTX keyword); choose another kernel name\n")
    result = run_cli("build", str(spec), "-o", str(tmp_path / "out"), "-q")
    assert result.returncode == 2 and not (tmp_path / "out").exists(), result
    assert result.stderr == message
    assert run_cli_in_process("verify", str(spec)) == CliResult(2, "", message)


# ptxas warns about this PTX ("line 5; warning : .minnctapersm is ignored ..."), naming its input file.
WARNED_PTX = ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k() .minnctapersm 2\n{\n\tret;\n}\n"


def test_ptxas_messages_name_no_scratch_folder(tmp_path, monkeypatch):
    """ptxas's messages name its input file, and the info log goes into manifest.json: a log that
    named ptxgen's random scratch folder (under TMPDIR) differed from build to build."""
    from ptxgen.assemble import assemble_ptxas, ptxas_binary

    if ptxas_binary() is None:
        pytest.skip("ptxas (the nvidia-cuda-nvcc wheel) is not installed")
    logs = []
    for folder in ("one", "two"):
        (tmp_path / folder).mkdir()
        monkeypatch.setenv("TMPDIR", str(tmp_path / folder))
        monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
        logs.append(assemble_ptxas(WARNED_PTX, "sm_90", {"verbose": True}).info_log)
    assert "warning : .minnctapersm" in logs[0], logs[0]
    assert logs[0] == logs[1], logs
    assert str(tmp_path) not in logs[0] and "ptxgen-ptxas-" not in logs[0], logs[0]


def test_nvjitlink_trace_messages_reach_no_artifact(tmp_path, cache_dir, monkeypatch):
    """NVJITLINK_TRACE_MESSAGES=1 put "no driver cache" before every cubin's info log in manifest.json,
    and the cache kept that log for builds without it: the manifest depended on the environment."""
    spec = with_archs(load_spec(SPECS[0]), ("sm_80",))
    plain = folder_bytes_of(spec, tmp_path / "plain", BuildOptions(use_cache=False))
    monkeypatch.setenv("NVJITLINK_TRACE_MESSAGES", "1")
    traced = folder_bytes_of(spec, tmp_path / "traced", BuildOptions())
    assert traced == plain, "the manifest must not depend on NVJITLINK_TRACE_MESSAGES"
    assert os.environ["NVJITLINK_TRACE_MESSAGES"] == "1", "the caller's environment is left as it was"
    monkeypatch.delenv("NVJITLINK_TRACE_MESSAGES")
    assert folder_bytes_of(spec, tmp_path / "warm", BuildOptions()) == plain, "nor what the cache kept"


def folder_bytes_of(spec, out, options):
    run_build(spec, out, options)
    return folder_bytes(out)


def test_the_cache_key_and_manifest_name_nvjitlinks_patch_release(tmp_path, monkeypatch):
    """nvJitLink's own version is major.minor, and patch releases of one minor assemble other cubins
    (13.4.52 and 13.4.92: every cubin of qwen3.toml): keyed by "13.4", a cache filled before an
    upgrade served the old cubins, which a cold build no longer made. The wheel's version, or for a
    library from elsewhere its bytes, tells them apart."""
    import importlib.metadata
    import types

    import cuda.pathfinder

    from ptxgen import assemble

    loaded = cuda.pathfinder.load_nvidia_dynamic_lib("nvJitLink").abs_path
    wheel = importlib.metadata.distribution("nvidia-nvjitlink")
    if not any(f.name.startswith("libnvJitLink") and os.path.samefile(f.locate(), loaded) for f in wheel.files):
        pytest.skip(f"nvJitLink is loaded from {loaded}, not from the nvidia-nvjitlink wheel")
    assert assemble.assembler_version("nvjitlink") == wheel.version, "the patch release, not only major.minor"
    library = tmp_path / "libnvJitLink.so.13"
    monkeypatch.setattr(cuda.pathfinder, "load_nvidia_dynamic_lib",
                        lambda name: types.SimpleNamespace(abs_path=str(library)))
    versions = []
    for contents in (b"one build", b"another build"):
        library.write_bytes(contents)
        assemble.nvjitlink_release.cache_clear()
        versions.append(assemble.assembler_version("nvjitlink"))
    assemble.nvjitlink_release.cache_clear()
    major_minor = assemble.nvjitlink_version()
    assert all(v.startswith(f"{major_minor}+sha256.") for v in versions) and versions[0] != versions[1], versions


def test_the_cache_key_and_manifest_name_the_drivers_release(tmp_path, monkeypatch):
    """--assembler driver was keyed by cuDriverGetVersion's "13.0", the same for every 580 driver,
    though the JIT's cubins may change with a patch release: keyed by the loaded libcuda's release
    (its file name behind libcuda.so.1), else by its bytes (WSL's libcuda.so.1.1), else 13.0.
    A fake driver and library files: no GPU needed."""
    import types

    import cuda.pathfinder

    from ptxgen import assemble, device
    from ptxgen.cache import cache_key

    monkeypatch.setattr(device, "driver_version", lambda: "13.0")
    loaded = tmp_path / "libcuda.so.1"
    monkeypatch.setattr(cuda.pathfinder, "load_nvidia_dynamic_lib",
                        lambda name: types.SimpleNamespace(abs_path=str(loaded) if name == "cuda" else None))
    versions = []
    for release in ("580.95.05", "580.105.08"):
        loaded.unlink(missing_ok=True)
        loaded.symlink_to(f"libcuda.so.{release}")
        versions.append(assemble.assembler_version("driver"))
    assert versions == ["580.95.05", "580.105.08"], versions
    keys = {cache_key(".entry k() { ret; }", "sm_90", "driver", version, {}) for version in versions}
    assert len(keys) == 2, "a patch release is another cache entry"
    loaded.unlink()
    loaded = tmp_path / "libcuda.so.1.1"
    for contents in (b"one build", b"another build"):
        loaded.write_bytes(contents)
        versions.append(assemble.assembler_version("driver"))
    assert all(v.startswith("13.0+sha256.") for v in versions[2:]) and versions[2] != versions[3], versions
    monkeypatch.setattr(cuda.pathfinder, "load_nvidia_dynamic_lib", lambda name: types.SimpleNamespace(abs_path=None))
    assert assemble.assembler_version("driver") == "13.0", "where pathfinder cannot tell the library: as before"

    def not_found(name):
        raise cuda.pathfinder.DynamicLibNotFoundError(f"{name} not found by the system search")

    monkeypatch.setattr(cuda.pathfinder, "load_nvidia_dynamic_lib", not_found)
    assert assemble.assembler_version("driver") == "13.0", "where the system search misses the loaded driver"
