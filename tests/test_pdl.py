"""Programmatic dependent launch (PDL_TARGET in ptxgen/kernels/base.py): a kernel whose config
sets `pdl` gets an sm_90 PTX of its own that lets the next kernel of the stream start at once
and waits for the previous one (griddepcontrol) before it touches anything but its stable
arrays. In the interpreter, whose sanitizer checks what PDL allows, that PTX gives the portable
PTX's bits for every kind that can ask for it; planted ordering bugs are findings; builds,
manifests, headers and the performance model carry it (the launcher: test_device_nogpu.py)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from ptxgen import perf
from ptxgen.compiled import load_folder
from ptxgen.errors import SanitizerError, SpecError
from ptxgen.kernels import KINDS
from ptxgen.kernels.base import PdlConfig
from ptxgen.pipeline import compile_kernel
from ptxgen.runner import run
from ptxgen.spec import load_spec

from helpers import ROOT, make_config, run_cli, with_ptx

ARCHS = ("sm_80", "sm_90")
WAIT = re.compile(r"^\tgriddepcontrol\.wait;$", re.M)
LAUNCH_DEPENDENTS = re.compile(r"^\tgriddepcontrol\.launch_dependents;$", re.M)
# A small config of every kind that can ask for PDL (odd sizes, partial steps, both GEMV schedules).
CASES = [
    ("q4k_gemv", dict(n=300, k=2304)),
    ("q4k_gemv", dict(n=700, k=512, schedule="queue", sm_count=3)),
    ("q6k_gemv", dict(n=100, k=512)),
    ("q8_0_gemv", dict(n=100, k=256)),
    ("q4k_gemv_group", dict(k=512, matrices={"a": 64, "b": 96})),
    ("fused_rmsnorm_q4k_gemv", dict(n=64, k=512)),
    ("fused_rmsnorm_q4k_gemv_group", dict(k=512, matrices={"q": 64, "k": 32})),
    ("fused_rmsnorm_q6k_gemv_group", dict(k=512, matrices={"q": 64, "k": 32})),
    ("fused_rmsnorm_q8_0_gemv_group", dict(k=512, matrices={"q": 64, "k": 32})),
    ("rmsnorm", dict(hidden=520)),
    ("per_head_rmsnorm", dict(num_heads=4, head_dim=128)),
    ("rope", dict(num_heads=4, head_dim=128)),
    ("kv_append", dict(num_kv_heads=2, head_dim=128, max_seq_len=64)),
    ("incremental_attention", dict(num_heads=4, num_kv_heads=2, head_dim=64, max_seq_len=256)),
    ("residual_add", dict(n=1001)),
    ("swiglu", dict(n=1001)),
    ("argmax", dict(n=5003)),
]


def pdl_kernel(kind: str, **fields):
    return compile_kernel(make_config(kind, name="kern", pdl=True, **fields), ARCHS, until="ptx")


def test_the_cases_cover_every_kind_that_can_ask_for_pdl():
    able = {name for name, kind in KINDS.items() if issubclass(kind.Config, PdlConfig)}
    assert able == {kind for kind, _ in CASES}
    assert "persistent_decoder" not in able and "flash_attention" not in able


@pytest.mark.parametrize("kind, fields", CASES, ids=lambda case: case if isinstance(case, str) else "")
def test_the_pdl_ptx_gives_the_portable_ptxs_bits(kind, fields):
    """The sm_90 variant launches its dependents and waits once, the portable PTX never; with the
    sanitizer checking the PDL rules, both give the same bits in every written array."""
    compiled = pdl_kernel(kind, **fields)
    portable, own = compiled.variants["sm_80"], compiled.variants["sm_90"]
    assert own.pdl and not portable.pdl
    assert len(WAIT.findall(own.ptx)) == len(LAUNCH_DEPENDENTS.findall(own.ptx)) == 1
    assert "griddepcontrol" not in portable.ptx
    assert LAUNCH_DEPENDENTS.search(own.ptx).start() < WAIT.search(own.ptx).start()
    definition = compiled.definition
    scalars = definition.verify_scalars()[0]
    inputs = definition.sample_inputs(np.random.default_rng(7), scalars)
    ours, theirs = (run(compiled, inputs, scalars, arch=arch) for arch in ARCHS)
    for param in compiled.params:
        if param.written:
            assert np.array_equal(ours[param.name].view(np.uint8), theirs[param.name].view(np.uint8)), param.name


def test_a_gemv_loads_its_first_weights_before_it_waits():
    """Weights are the same in every launch of a step: their first row-steps go out before the wait,
    so they arrive while the previous kernel ends; x and the work counter come after it."""
    for fields in (dict(n=300, k=2304), dict(n=700, k=512, schedule="queue", sm_count=3)):
        ptx = pdl_kernel("q4k_gemv", **fields).variants["sm_90"].ptx
        wait = WAIT.search(ptx).start()
        assert ptx.index("ld.global.nc.v4.u32") < wait
        assert ptx.index("griddepcontrol.launch_dependents") < ptx.index("ld.global.nc.v4.u32")
        assert wait < ptx.index("[%x") and (wait < ptx.index("[%queue]") if "queue" in fields.values() else True)


def planted(compiled, edit) -> str:
    ptx = compiled.variants["sm_90"].ptx
    edited = edit(ptx)
    assert edited != ptx, "the edit found nothing to change"
    return edited


def run_sm90(compiled, ptx: str):
    definition = compiled.definition
    scalars = definition.verify_scalars()[0]
    inputs = definition.sample_inputs(np.random.default_rng(1), scalars)
    return run(with_ptx(compiled, ptx, target="sm_90"), inputs, scalars, arch="sm_90")


def move_wait_after(marker: str):
    """The wait moved to just after the first line holding `marker`."""
    def edit(ptx: str) -> str:
        ptx = WAIT.sub("", ptx, count=1)
        at = ptx.index("\n", ptx.index(marker)) + 1
        return ptx[:at] + "\tgriddepcontrol.wait;\n" + ptx[at:]
    return edit


@pytest.mark.parametrize("kind, fields, marker, array", [
    ("q4k_gemv", dict(n=300, k=2304), "[%x", "x"),  # x staged before the wait
    ("q4k_gemv", dict(n=700, k=512, schedule="queue", sm_count=3), "[%queue]", "queue"),  # the work counter
    ("rmsnorm", dict(hidden=520), "st.global", "x"),  # every access before the wait
    ("incremental_attention", dict(num_heads=4, num_kv_heads=2, head_dim=64, max_seq_len=256), "cp.async.wait", "q"),
], ids=("gemv-x", "gemv-queue", "rmsnorm", "attention"))
def test_touching_a_dependent_array_before_the_wait_is_a_finding(kind, fields, marker, array):
    compiled = pdl_kernel(kind, **fields)
    with pytest.raises(SanitizerError, match=rf"accesses {array} before griddepcontrol\.wait"):
        run_sm90(compiled, planted(compiled, move_wait_after(marker)))


def test_a_thread_that_ends_without_waiting_is_a_finding():
    """A GEMV whose warp 1 branches past the wait to its end (as a group without rows might): a grid
    could complete before its own predecessor, and its dependent would not wait for that one."""
    compiled = pdl_kernel("q4k_gemv", n=300, k=2304)

    def edit(ptx: str) -> str:
        skip = "\t{\n\t.reg .pred %skip;\n\tsetp.eq.u32 %skip, %warp, 1;\n\t@%skip bra.uni SKIPPED;\n\t}\n"
        ptx = WAIT.sub(skip + "\tgriddepcontrol.wait;", ptx, count=1)
        end = ptx.rindex("\tret;")
        return ptx[:end] + "SKIPPED:\n" + ptx[end:]
    with pytest.raises(SanitizerError, match="thread ends without griddepcontrol.wait"):
        run_sm90(compiled, planted(compiled, edit))


def test_the_specs_pdl_kernels_assemble_for_sm90_without_spills():
    """specs/qwen3.toml's decode kernels at Qwen3-8B shapes (the lm_head's 151936 rows too): their
    sm_90 cubins are made from the PDL PTX, whose first weight loads go out before the wait."""
    kernels = [k for k in load_spec(ROOT / "specs" / "qwen3.toml").spec.kernels if getattr(k, "pdl", False)]
    assert len(kernels) >= 20
    for kernel in kernels:
        compiled = compile_kernel(kernel, ("sm_90",))
        binary = compiled.binaries["sm_90"]
        assert compiled.variants[binary.target].pdl, kernel.name
        res = binary.resources
        assert res["spill_stores"] == res["spill_loads"] == res["local_bytes"] == 0, f"{kernel.name}: {dict(res)}"


def test_kinds_that_cannot_take_pdl_refuse_the_field(tmp_path):
    spec = tmp_path / "decoder.toml"
    spec.write_text('[[kernels]]\nname = "dec"\nkind = "persistent_decoder"\nhidden = 512\nnum_heads = 4\n'
                    'num_kv_heads = 2\nhead_dim = 128\nintermediate = 1024\nnum_layers = 1\nmax_seq_len = 64\n'
                    'pdl = true\n')
    with pytest.raises(SpecError, match="pdl"):
        load_spec(spec)


def test_without_an_arch_of_sm90_or_later_there_is_only_the_portable_ptx():
    compiled = compile_kernel(make_config("rmsnorm", name="kern", hidden=512, pdl=True), ("sm_80", "sm_89"))
    assert list(compiled.variants) == ["sm_80"] and not compiled.variants["sm_80"].pdl


@pytest.mark.parametrize("archs", [("sm_90a",), ("sm_100",), ("sm_120",), ("sm_80", "sm_100", "sm_120")])
def test_pdl_is_made_for_any_arch_of_sm90_or_later_not_only_sm_90(archs):
    """A spec for Blackwell (or for sm_90a) alone asked for PDL too: its cubins come from the sm_90
    PDL PTX, which every arch from sm_90 on runs, and not from a portable PTX without it."""
    compiled = compile_kernel(make_config("rmsnorm", name="kern", hidden=512, pdl=True), archs, until="ptx")
    assert compiled.variants["sm_90"].pdl
    for arch in archs:
        assert compiled.variant(arch).pdl == (arch != "sm_80"), arch


def test_later_archs_run_the_pdl_ptx():
    """sm_100 and sm_120 accept sm_90 PTX: their cubins come from the PDL variant, and a GPU of a
    later arch without a cubin of its own JITs that PTX."""
    compiled = compile_kernel(make_config("rmsnorm", name="kern", hidden=512, pdl=True), ("sm_80", "sm_90", "sm_100"))
    assert {arch: binary.target for arch, binary in compiled.binaries.items()} == {
        "sm_80": "sm_80", "sm_90": "sm_90", "sm_100": "sm_90"}
    assert compiled.variant("sm_100").pdl and compiled.variant("sm_120").pdl and not compiled.variant("sm_86").pdl


def test_the_artifact_folder_says_which_ptx_is_for_pdl(tmp_path):
    spec = tmp_path / "pdl.toml"
    spec.write_text('[target]\narchs = ["sm_80", "sm_90"]\n\n[[kernels]]\nname = "norm"\nkind = "rmsnorm"\n'
                    'hidden = 512\npdl = true\n\n[[kernels]]\nname = "plain"\nkind = "rmsnorm"\nhidden = 512\n')
    out = tmp_path / "out"
    result = run_cli("build", str(spec), "-o", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    norm = manifest["kernels"]["norm"]
    assert {t: v["pdl"] for t, v in norm["variants"].items()} == {"sm_80": False, "sm_90": True}
    assert norm["cubins"]["sm_90"]["ptx"] == "norm.sm_90.ptx" and norm["cubins"]["sm_80"]["ptx"] == "norm.ptx"
    assert list(manifest["kernels"]["plain"]["variants"]) == ["sm_80"]
    header = (out / "pdl.h").read_text()
    cubins = "static const char* const norm_cubins[][2] = {{\"sm_80\", \"sm_80/norm.cubin\"}, {\"sm_90\", \"sm_90/norm.cubin\"}};"
    assert cubins in header and "static const int norm_cubin_pdl[] = {0, 1};" in header
    assert "static const int plain_cubin_pdl[] = {0, 0};" in header
    loaded = {kernel.name: kernel for kernel in load_folder(out)}
    assert loaded["norm"].variant("sm_90").pdl and not loaded["norm"].variant("sm_80").pdl


def test_the_model_costs_a_pdl_launch_as_a_plain_one():
    """Measured on the H100 (perf.PDL_NOTE): PDL back to back took as long as without."""
    gpu = perf.gpu_named("h100-sxm")
    reports = [perf.evaluate_kernel(compile_kernel(make_config("residual_add", name="kern", n=4096, pdl=pdl), ARCHS),
                                    gpu) for pdl in (False, True)]
    assert [report["launch_us"] for report in reports] == [gpu.launch_us] * 2
    assert reports[0]["estimate_us"] == reports[1]["estimate_us"]
