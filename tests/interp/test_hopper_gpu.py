"""The sm_90a instruction tests of test_hopper.py, run on a Hopper GPU (`pytest -m gpu`): the same
PTX and inputs, the device's result against the same numpy expectation. Where the interpreter
passes and the GPU fails, the interpreter's model of that instruction (a descriptor field, a
swizzle, a fragment layout) is wrong."""
import numpy as np
import pytest

import test_hopper
from ptxgen import device
from ptxgen.abi import Geometry, Launch, Param
from ptxgen.compiled import CompiledKernel, Variant
from ptxgen.errors import DeviceUnavailable

pytestmark = pytest.mark.gpu

try:
    if device.session().arch != "sm_90":
        pytest.skip("needs a Hopper (sm_90) GPU", allow_module_level=True)
except DeviceUnavailable:
    pytest.skip("no CUDA driver/GPU on this machine", allow_module_level=True)


def device_launch(ptx, entry, grid, block, args, **ignored):
    """test_hopper's `launch`, on the GPU: the driver JIT-compiles the sm_90a PTX; arrays are
    copied in and back in place."""
    params = tuple(Param(f"a{i}", "u8", (arg.nbytes,)) if isinstance(arg, np.ndarray)
                   else Param(f"s{i}", "u32", role="scalar") for i, arg in enumerate(args))
    kernel = CompiledKernel(entry, "test", {}, params, {},
                            {"sm_90a": Variant("sm_90a", ptx, "8.0", Geometry(tuple(grid), tuple(block)))}, {})
    device.run_on_device(kernel, Launch(tuple(grid), tuple(block)), list(args))


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


def test_wgmma_n8_with_negated_a():
    test_hopper.test_wgmma_n8_with_negated_a()


def test_wgmma_accumulates_across_groups_and_regions():
    test_hopper.test_wgmma_accumulates_across_groups_and_regions()


@pytest.mark.parametrize("copies", ["bulk", "cp.async"])
def test_pipeline_streams_tiles_through_mbarriers(copies):
    test_hopper.test_pipeline_streams_tiles_through_mbarriers(copies)
