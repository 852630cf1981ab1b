"""Build: every spec assembles for every arch with zero spills, deterministically, cached."""

from __future__ import annotations

import json

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
    shown = run_cli("show", "rmsnorm", "--spec", str(SPECS[0]))
    assert shown.returncode == 0 and "bytes" in shown.stdout and "roofline" in shown.stdout, shown.stderr
    assert "f32[rows, 4096]" in shown.stdout
    ptx = run_cli("show", "rmsnorm", "--spec", str(SPECS[0]), "--ptx")
    assert ptx.returncode == 0 and ".visible .entry" in ptx.stdout
    missing = run_cli("show", "nothing_like_this", "--spec", str(SPECS[0]))
    assert missing.returncode == 2 and "nothing_like_this" in missing.stderr
    usage = run_cli("build")
    assert usage.returncode == 2 and "Traceback" not in usage.stderr
