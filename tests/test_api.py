"""The Python API (ptxgen.load) on the CPU: numpy arrays run the compiled PTX in the interpreter,
in place; an artifact folder loads without pydantic or Jinja; bad arrays are refused by name.
(The GPU side — torch tensors, streams, CUDA-graph capture — is in tests/test_gpu.py.)"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import ptxgen
from ptxgen.errors import DeviceUnavailable, LaunchError, PtxgenError
from ptxgen.verify import relative_l2

from helpers import ROOT, run_cli

SPEC = ROOT / "specs" / "qwen3.toml"


@pytest.fixture(scope="module")
def kernels():
    return ptxgen.load(SPEC)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("api") / "qwen3"
    result = run_cli("build", str(SPEC), "-o", str(out), "--arch", "sm_90", "-q")
    assert result.returncode == 0, result.stderr
    return out


def norm_arrays(rows, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, 4096)) + 0.5).astype(np.float32)
    gamma = (1 + 0.25 * rng.standard_normal(4096)).astype(np.float32)
    return x, gamma, np.full((rows, 4096), np.nan, np.float32)


def test_numpy_call_runs_the_ptx_in_place_against_the_reference(kernels):
    x, gamma, y = norm_arrays(3)
    kernels.qwen3_8b_rmsnorm(x, gamma, y, rows=3)
    kind = kernels.qwen3_8b_rmsnorm.compiled.definition
    expected = kind.reference({"x": x, "gamma": gamma}, {"rows": 3})["y"]
    assert np.isfinite(y).all(), "every output element written in place"
    assert relative_l2(y.astype(np.float64), expected) <= kind.tolerance(kind.param("y"))


def test_arrays_by_keyword_and_a_kernel_with_workspaces(kernels):
    attention = kernels["qwen3_8b_decode_attention"]
    kind = attention.compiled.definition
    inputs = kind.sample_inputs(np.random.default_rng(1), {"seq_len": 37})
    out = np.full((32, 128), np.nan, np.float32)
    attention(q=inputs["q"], k_cache=inputs["k_cache"], v_cache=inputs["v_cache"], out=out, seq_len=37)
    expected = kind.reference(inputs, {"seq_len": 37})["out"]
    assert relative_l2(out.astype(np.float64), expected) <= kind.tolerance(kind.param("out"))
    assert "qwen3_8b_decode_attention" in list(kernels) and len(kernels) == len(list(kernels))


@pytest.mark.parametrize("change, message", [
    (lambda a: {**a, "x": a["x"].astype(np.float64)}, r"x: expected dtype f32 .* got float64"),
    (lambda a: {**a, "x": a["x"][:, :4095]}, r"x: expected shape \[2, 4096\]"),
    (lambda a: {**a, "y": np.full((4096, 2), np.nan, np.float32).T}, r"y: expected a contiguous"),
    (lambda a: {**a, "gamma": [1.0] * 4096}, r"gamma: expected an array .* got list"),
    (lambda a: {k: v for k, v in a.items() if k != "gamma"}, r"array 'gamma' is missing"),
    (lambda a: {**a, "z": a["x"]}, r"unknown argument 'z'"),
    (lambda a: {**a, "rows": 3}, r"x: expected shape \[3, 4096\]"),
    (lambda a: {**a, "rows": -1}, r"rows.*expected an integer in 0\.\.2147483647"),
    (lambda a: {**a, "rows": 2.0}, r"rows.*expected an integer"),
    (lambda a: {**a, "rows": np.array(2.5)}, r"rows.*expected an integer"),  # not truncated to 2
    (lambda a: {**a, "rows": np.array(True)}, r"rows.*expected an integer"),
    (lambda a: {**a, "rows": np.array([2])}, r"rows.*expected an integer"),
    (lambda a: {**a, "gamma": a["gamma"].view(np.uint16)[::2].copy()}, r"gamma: expected dtype f32 .* got uint16"),
    (lambda a: {**a, "y": a["x"]}, r"y shares memory with x: the kernel writes y while it reads the other arrays"),
    (lambda a: {**a, "y": a["y"].reshape(-1)[4096:].reshape(1, 4096), "x": a["x"][:1], "gamma": a["y"][1],
                "rows": 1}, r"y shares memory with gamma"),
    (lambda a: {**a, "x": np.empty(2 * 4096 + 1, np.float32)[1:].reshape(2, 4096)},
     r"x: starts at an address that is not a multiple of 16 bytes"),
    (lambda a: {**a, "stream": "nonsense"}, r"stream: numpy \(host\) arrays run in the interpreter, on no CUDA stream"),
    (lambda a: {**a, "self": 1}, r"unknown argument 'self'"),
    # a masked array once escaped from the interpreter's memory map as a numpy ValueError
    (lambda a: {**a, "y": np.ma.masked_array(a["y"], mask=np.zeros_like(a["y"], bool))},
     r"y: a numpy masked array: the kernel reads and writes every element"),
])
def test_bad_arguments_are_refused_by_name(kernels, change, message):
    x, gamma, y = norm_arrays(2)
    args = change({"x": x, "gamma": gamma, "y": y, "rows": 2})
    kept = x.copy()
    with pytest.raises(LaunchError, match=message):
        kernels.qwen3_8b_rmsnorm(**args)
    assert np.isnan(y).all() and np.array_equal(x, kept), "nothing may be written by a refused call"


@pytest.mark.parametrize("value", [65, 2**32 - 1])
def test_a_device_side_length_past_the_cache_is_refused_on_host_arrays(tmp_path, value):
    """`ptxgen run` and the API's numpy path make the same check (Param.values); on a GPU the
    kernel clamps, since reading the value on the host would synchronise."""
    spec = tmp_path / "graph.toml"
    spec.write_text('[[kernels]]\nname = "attn"\nkind = "incremental_attention"\nnum_heads = 4\nnum_kv_heads = 1\n'
                    'head_dim = 64\nmax_seq_len = 64\nindirect_seq_len = true\n')
    attention = ptxgen.load(spec).attn
    inputs = attention.compiled.definition.sample_inputs(np.random.default_rng(0), {"seq_len": 64})
    out = np.full((4, 64), np.nan, np.float32)
    length = np.array([value], np.uint32)
    with pytest.raises(LaunchError, match=rf"attn: seq_len_ptr\[0\]: expected 0\.\.64, got {value}"):
        attention(inputs["q"], inputs["k_cache"], inputs["v_cache"], out, length)
    assert np.isnan(out).all()
    length[0] = 64
    with pytest.raises(LaunchError, match="'seq_len' is not an argument of this kernel: it reads that value on the "
                                          "device, from seq_len_ptr"):
        attention(inputs["q"], inputs["k_cache"], inputs["v_cache"], out, length, seq_len=3)
    attention(inputs["q"], inputs["k_cache"], inputs["v_cache"], out, length)
    assert np.isfinite(out).all()


def test_load_arguments_and_unknown_kernels_are_ptxgen_errors(kernels, tmp_path):
    assert ptxgen.PtxgenError is PtxgenError and issubclass(ptxgen.LaunchError, ptxgen.PtxgenError)
    with pytest.raises(PtxgenError, match="expected a spec file or artifact folder path, got NoneType"):
        ptxgen.load(None)
    with pytest.raises(PtxgenError, match=r"archs: expected a sequence of arch names such as \('sm_90',\), got 'sm_90'"):
        ptxgen.load(SPEC, archs="sm_90")
    with pytest.raises(PtxgenError, match="^ptxgen.load: the path is empty"):
        ptxgen.load("")
    with pytest.raises(PtxgenError, match="no_build: no such file or folder"):
        ptxgen.load(tmp_path / "no_build")
    spec = tmp_path / "one.toml"
    spec.write_text('[target]\narchs = ["sm_80"]\n[[kernels]]\nname = "norm"\nkind = "rmsnorm"\nhidden = 64\n')
    loaded = ptxgen.load(spec, archs=(arch for arch in ["sm_90"]))  # any iterable, read once
    assert list(loaded.norm.compiled.binaries) == ["sm_90"]
    with pytest.raises(PtxgenError, match="^ptxgen.load: archs: expected one of .* got 'sm_91'"):
        ptxgen.load(spec, archs=["sm_91"])
    for lookup in (lambda: kernels.nothing, lambda: kernels["nothing"]):
        with pytest.raises(PtxgenError, match="no kernel named 'nothing'"):
            lookup()
    assert not hasattr(kernels, "nothing") and "nothing" not in list(kernels)


def test_read_only_outputs_and_missing_kernels_are_refused(kernels):
    x, gamma, y = norm_arrays(1)
    y.setflags(write=False)
    with pytest.raises(LaunchError, match="y: the kernel writes it, but the numpy array is read-only"):
        kernels.qwen3_8b_rmsnorm(x, gamma, y, rows=1)
    with pytest.raises(AttributeError, match="no kernel named 'nothing'"):
        kernels.nothing  # noqa: B018


def test_device_arrays_without_a_gpu_give_the_clear_message(kernels):
    try:
        from ptxgen.device import driver

        driver()
        pytest.skip("a GPU is present: tests/test_gpu.py calls with device arrays")
    except DeviceUnavailable:
        pass

    class FakeCudaArray:
        __cuda_array_interface__ = {"shape": (1, 4096), "typestr": "<f4", "data": (1 << 40, False), "version": 3}

    class FakeDLPack:
        def __init__(self, device):
            self.device = device

        def __dlpack__(self, **_):
            return 5

        def __dlpack_device__(self):
            return self.device

    with pytest.raises(DeviceUnavailable, match="no CUDA driver/GPU"):
        kernels.qwen3_8b_rmsnorm(FakeCudaArray(), FakeCudaArray(), FakeCudaArray(), rows=1)
    with pytest.raises(DeviceUnavailable, match="no CUDA driver/GPU"):  # before reading what it gives
        kernels.qwen3_8b_rmsnorm(FakeDLPack((2, 0)), FakeDLPack((2, 0)), FakeDLPack((2, 0)), rows=1)
    x, gamma, y = norm_arrays(1)
    for device in ((1, 0), "cuda:0"):
        with pytest.raises(LaunchError, match="qwen3_8b_rmsnorm: x: not a usable DLPack array"):
            kernels.qwen3_8b_rmsnorm(FakeDLPack(device), gamma, y, rows=1)


def test_an_artifact_folder_loads_without_pydantic_or_jinja_and_computes_the_same(folder, kernels):
    script = f"""
import sys, numpy as np, ptxgen
kernels = ptxgen.load({str(folder)!r})
rng = np.random.default_rng(0)
x = (rng.standard_normal((3, 4096)) + 0.5).astype(np.float32)
gamma = (1 + 0.25 * rng.standard_normal(4096)).astype(np.float32)
y = np.full((3, 4096), np.nan, np.float32)
kernels.qwen3_8b_rmsnorm(x, gamma, y, rows=3)
np.save(sys.argv[1], y)
print(sorted(m for m in ("pydantic", "jinja2", "typer", "rich", "yaml") if m in sys.modules))
"""
    out = folder.parent / "y.npy"
    result = subprocess.run([sys.executable, "-c", script, str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", f"loading a folder imported {result.stdout.strip()}"
    x, gamma, y = norm_arrays(3)
    kernels.qwen3_8b_rmsnorm(x, gamma, y, rows=3)
    np.testing.assert_array_equal(np.load(out), y, err_msg="the folder's kernel and the spec's differ")


def test_a_changed_artifact_is_refused_when_loading(folder, tmp_path):
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in folder.rglob("*"):
        if path.is_file():
            target = copy / path.relative_to(folder)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
    cubin = copy / "sm_90" / "qwen3_8b_rmsnorm.cubin"
    cubin.write_bytes(cubin.read_bytes()[:-16])
    with pytest.raises(PtxgenError, match=r"qwen3_8b_rmsnorm.cubin: does not match its sha256"):
        ptxgen.load(copy)
    cubin.write_bytes((folder / "sm_90" / "qwen3_8b_rmsnorm.cubin").read_bytes())
    manifest = json.loads((copy / "manifest.json").read_text())
    entry = manifest["kernels"]["qwen3_8b_rmsnorm"]
    def geometry(e):
        return next(iter(e["variants"].values()))["geometry"]

    for change in (lambda e: e["scalar_limits"].update(rows=[0]), lambda e: e.update(scalar_limits=[1, 2]),
                   lambda e: e["params"][0].update(dtype="f128"), lambda e: e["params"][0].update(shape=["nothing"]),
                   lambda e: e["scalar_limits"].update(rows=[0, float("inf")]),
                   lambda e: e["scalar_limits"].update(rows=[0.5, 10.7]),  # not truncated to 0..10
                   lambda e: e["params"][0].update(values=[0, float("inf")]),
                   lambda e: e.update(variants={}, cubins={}), lambda e: e.update(params=[]),
                   lambda e: geometry(e).update(block=["a", 1, 1]),
                   lambda e: geometry(e).update(grid=[["ceil_div", "nothing", 8], 1, 1]),
                   lambda e: geometry(e).update(grid=[["ceil_div", "rows", 0], 1, 1]),
                   lambda e: next(iter(e["variants"].values())).update(ptx="../../etc/hostname")):
        changed = json.loads(json.dumps(manifest))
        change(changed["kernels"]["qwen3_8b_rmsnorm"])
        (copy / "manifest.json").write_text(json.dumps(changed))
        with pytest.raises(PtxgenError, match="qwen3_8b_rmsnorm': not a ptxgen manifest entry"):
            ptxgen.load(copy)
    assert entry["params"][0]["dtype"] == "f32"
    (copy / "manifest.json").write_text(json.dumps({"kernels": []}))
    with pytest.raises(PtxgenError, match="not a ptxgen manifest"):
        ptxgen.load(copy)
    (copy / "manifest.json").write_text("[" * 100_000)
    with pytest.raises(PtxgenError, match="manifest.json: not valid JSON"):
        ptxgen.load(copy)
    with pytest.raises(PtxgenError, match="cannot read"):
        ptxgen.load(tmp_path)


def test_the_readme_example_runs():
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "api_example.py"), str(SPEC)], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    error = float(result.stdout.split("max |y - float64| = ")[1])
    assert error < 1e-4, result.stdout
