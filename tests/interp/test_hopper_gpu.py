"""The sm_90a instruction tests of test_hopper.py, run on a Hopper GPU (`pytest -m gpu`): the same
PTX and inputs, the device's result against the same numpy expectation. Where the interpreter
passes and the GPU fails, the interpreter's model of that instruction (a descriptor field, a
swizzle, a fragment layout) is wrong."""
import functools

import numpy as np
import pytest

import test_flash_attention_sm90a
import test_hopper
import test_tensor_copy
from ptxgen import device
from ptxgen.abi import Geometry, Launch, Param
from ptxgen.assemble import assemble_nvjitlink
from ptxgen.compiled import Binary, CompiledKernel, Variant
from ptxgen.errors import DeviceUnavailable
from ptxgen.interp.parser import TENSOR_MAP, parse
from ptxgen.verify import verify_kernel

pytestmark = pytest.mark.gpu

try:
    if device.session().arch != "sm_90":
        pytest.skip("needs a Hopper (sm_90) GPU", allow_module_level=True)
except DeviceUnavailable:
    pytest.skip("no CUDA driver/GPU on this machine", allow_module_level=True)


def device_launch(ptx, entry, grid, block, args, dynamic_shared=0, assembler="driver", **ignored):
    """test_hopper's `launch`, on the GPU: the sm_90a PTX JIT-compiled by the driver, or assembled
    by nvJitLink as the pipeline does (the two lay shared memory out differently); arrays are
    copied in and back in place."""
    params = tuple(Param(f"a{i}", "u8", (arg.nbytes,)) if isinstance(arg, np.ndarray)
                   else Param(f"s{i}", "u32", role="scalar") for i, arg in enumerate(args))
    binaries = {}
    if assembler == "nvjitlink":
        built = assemble_nvjitlink(ptx, "sm_90a", {})
        binaries = {"sm_90a": Binary("sm_90a", "sm_90a", built.cubin, built.info_log, {})}
    variant = Variant("sm_90a", ptx, "8.0", Geometry(tuple(grid), tuple(block), dynamic_shared))
    kernel = CompiledKernel(entry, "test", {}, params, {}, {"sm_90a": variant}, binaries)
    device.run_on_device(kernel, Launch(tuple(grid), tuple(block), dynamic_shared), list(args))


@pytest.fixture(autouse=True)
def on_the_gpu(monkeypatch):
    monkeypatch.setattr(test_hopper, "launch", device_launch)


@pytest.mark.parametrize("kind", ["f16", "bf16"])
@pytest.mark.parametrize("width", [0, 32, 64, 128])
def test_wgmma_k_major_descriptors(kind, width):
    test_hopper.test_wgmma_k_major_descriptors(kind, width)


@pytest.mark.parametrize("width", [0, 32, 64, 128])
def test_wgmma_mn_major_descriptors(width):
    test_hopper.test_wgmma_mn_major_descriptors(width)


@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_wgmma_register_a_and_n_major_b(kind):
    test_hopper.test_wgmma_register_a_and_n_major_b(kind)


@pytest.mark.parametrize("assembler", ["driver", "nvjitlink"])
def test_swizzled_tiles_in_the_extern_array_rounded_up(monkeypatch, assembler):
    # only the rounded-up form: whether the unrounded one works depends on the assembler
    # (nvJitLink 13.0 ignored the .align 1024, the driver's JIT kept it)
    monkeypatch.setattr(test_hopper, "launch", functools.partial(device_launch, assembler=assembler))
    test_hopper.test_swizzled_tiles_in_the_extern_array_need_its_base_rounded_up("extern rounded up")


def test_wgmma_n8_with_negated_a():
    test_hopper.test_wgmma_n8_with_negated_a()


def test_wgmma_accumulates_across_groups_and_regions():
    test_hopper.test_wgmma_accumulates_across_groups_and_regions()


@pytest.mark.parametrize("copies", ["bulk", "cp.async"])
def test_pipeline_streams_tiles_through_mbarriers(copies):
    test_hopper.test_pipeline_streams_tiles_through_mbarriers(copies)


# --- cp.async.bulk.tensor through tensor maps the launcher encodes (ptxgen.device) ------------------
ARRAY_DTYPES = {np.dtype(np.float16): "f16", np.dtype(np.uint8): "u8"}


def launch_with_maps(ptx, entry, grid, block, args, tensor_maps=(), **ignored):
    """test_tensor_copy's `launch`, on the GPU: its arrays as parameters of their own dtype and
    shape (what the tensor maps are encoded from), the PTX JIT-compiled by the driver."""
    names = [name for name, kind in parse(ptx, entry).params if kind != TENSOR_MAP]
    params = tuple(Param(name, ARRAY_DTYPES[arg.dtype], arg.shape) if isinstance(arg, np.ndarray)
                   else Param(name, "u32", role="scalar") for name, arg in zip(names, args))
    variant = Variant("sm_90a", ptx, "8.0", Geometry(tuple(grid), tuple(block)), tensor_maps=tuple(tensor_maps))
    kernel = CompiledKernel(entry, "test", {}, params, {}, {"sm_90a": variant}, {})
    device.run_on_device(kernel, Launch(tuple(grid), tuple(block)), list(args))


@pytest.mark.parametrize("swizzle", [0, 128])
@pytest.mark.parametrize("start", [(0, 0, 0), (64, 5, 1), (64, 10, 2), (0, -3, 0), (-8, 2, 1)])
def test_a_tensor_copy_lands_as_the_interpreter_says(monkeypatch, start, swizzle):
    monkeypatch.setattr(test_tensor_copy, "launch", launch_with_maps)
    test_tensor_copy.test_a_box_lands_as_the_driver_describes(start, swizzle)


def test_the_tensor_copys_swizzle_is_the_wgmma_layouts(monkeypatch):
    monkeypatch.setattr(test_tensor_copy, "launch", launch_with_maps)
    test_tensor_copy.test_the_swizzle_matches_the_wgmma_layout_of_a_panel()


@pytest.mark.parametrize("case", [case for case in test_flash_attention_sm90a.CASES if case[-1].get("tma")])
def test_the_tma_prefill_on_the_device_matches_float64(case):
    *shape, seq_len, causal, dtype, out_dtype, knobs = case
    kernel = test_flash_attention_sm90a.attention_kernel(*shape[:3], causal, dtype, out_dtype, knobs, until="cubin")
    checks = verify_kernel(kernel, {"seq_len": seq_len}, seed=seq_len, backend="device")
    assert checks and all(check.passed for check in checks), [check.failure for check in checks]
