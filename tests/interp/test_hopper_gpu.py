"""The sm_90a instruction tests of test_hopper.py, run on a Hopper GPU (`pytest -m gpu`): the same
PTX and inputs, the device's result against the same numpy expectation. Where the interpreter
passes and the GPU fails, the interpreter's model of that instruction (a descriptor field, a
swizzle, a fragment layout) is wrong."""
import functools

import numpy as np
import pytest

import test_hopper
from ptxgen import device
from ptxgen.abi import Geometry, Launch, Param
from ptxgen.assemble import assemble_nvjitlink
from ptxgen.compiled import Binary, CompiledKernel, Variant
from ptxgen.errors import DeviceUnavailable

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
