"""Tensor maps at launch, without a GPU: what ptxgen.device hands cuTensorMapEncodeTiled and
cuLaunchKernel, and the C the header gives engines for the same launch.

The example throughout: k, an f16 [heads, seq_len, 128] array, read through a tensor map of
(64, 128, 1) boxes (innermost first), 128-byte swizzled; its map follows the kernel's five
parameters.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from cuda.bindings import driver as real
from cuda.pathfinder import find_nvidia_header_directory

from ptxgen import device
from ptxgen.abi import Geometry, Launch, Param, TensorMap, ceil_div, scalar
from ptxgen.compiled import RESOURCE_KEYS, Binary, CompiledKernel, Variant
from ptxgen.device import DeviceBuffer, DeviceKernel, pack_params
from ptxgen.errors import DeviceUnavailable, LaunchError
from ptxgen.header import defined_names, render_header

HEADS, SEQ_LEN = 8, 300
PARAMS = (Param("q", "f16", (HEADS, "seq_len", 128)), Param("k", "f16", (HEADS, "seq_len", 128)),
          Param("v", "f16", (HEADS, "seq_len", 128)), Param("o", "f16", (HEADS, "seq_len", 128), "out"),
          Param("seq_len", "u32", role="scalar"))
K_MAP = TensorMap("k_map", "k", (64, 128, 1), 128)
V_MAP = TensorMap("v_map", "v", (64, 128, 1), 0)
Q_ADDR, K_ADDR, V_ADDR, O_ADDR = (0x7F00_0000_0000 + (i << 24) for i in range(4))


def map_words(call: int) -> list[int]:
    """The 16 words of the CUtensorMap the fake encoder writes on its call number `call`."""
    return [(0xA0 + call) << 8 | word for word in range(16)]


class Encoder:
    """cuTensorMapEncodeTiled with its C signature, as device.tensor_map_encoder gives it: records
    its arguments (the arrays read back as lists), writes map_words(call) where it is told, and
    returns `status`."""

    def __init__(self, status=0):
        self.status, self.calls = status, []

    def __call__(self, at, kind, rank, address, dims, strides, box, steps, interleave, swizzle, l2, fill):
        self.calls.append((at, kind, rank, address, list(dims[:rank]), list(strides[:rank - 1]), list(box[:rank]),
                           list(steps[:rank]), interleave, swizzle, l2, fill))
        ctypes.memmove(at, (ctypes.c_uint64 * 16)(*map_words(len(self.calls) - 1)), 128)
        return self.status


def attention_kernel(maps=(K_MAP,)) -> DeviceKernel:
    return DeviceKernel("attn", None, PARAMS, 0, 1024, 0, 32, tensor_maps=maps)


def args(seq_len: int = SEQ_LEN, k=K_ADDR) -> list:
    return [DeviceBuffer(Q_ADDR, 1 << 20), k, V_ADDR, DeviceBuffer(O_ADDR, 1 << 20), seq_len]


def test_the_map_is_encoded_from_the_arrays_shape_and_passed_by_value_after_the_parameters():
    encode = Encoder()
    values, types = pack_params(attention_kernel(), args(), encode)
    assert values[:5] == (Q_ADDR, K_ADDR, V_ADDR, O_ADDR, SEQ_LEN)
    assert types == (ctypes.c_void_p,) * 4 + (ctypes.c_uint32, None), "the map comes last, by value (type None)"
    (call,) = encode.calls
    at, kind, rank, address, dims, strides, box, steps, interleave, swizzle, l2, fill = call
    assert at % 64 == 0, "the driver writes the map 64-byte aligned, as cuda.h documents"
    assert (kind, rank, address) == (real.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3, K_ADDR)
    assert dims == [128, SEQ_LEN, HEADS], "dimensions run innermost first"
    assert strides == [256, 256 * SEQ_LEN], "byte strides of dimensions 1 and 2"
    assert box == [64, 128, 1] and steps == [1, 1, 1]
    assert interleave == real.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE
    assert swizzle == real.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B
    assert l2 == real.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B
    assert fill == real.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE, "zeros past the edges"
    # What cuLaunchKernel makes of it (cuda.bindings' own packing, the same for cuLaunchKernelEx and
    # cuLaunchCooperativeKernel): kernelParams[5] points at the map's 128 bytes.
    packed = real._HelperKernelParams((values, types))
    pointers = (ctypes.c_void_p * 6).from_address(packed.ckernelParams)
    assert ctypes.c_uint64.from_address(pointers[1]).value == K_ADDR
    assert list((ctypes.c_uint64 * 16).from_address(pointers[5])) == map_words(0)


def test_each_map_follows_in_order_with_its_own_swizzle():
    encode = Encoder()
    values, types = pack_params(attention_kernel((K_MAP, V_MAP)), args(), encode)
    assert types[5:] == (None, None)
    assert [list(value.opaque) for value in values[5:]] == [map_words(0), map_words(1)]
    assert [call[3] for call in encode.calls] == [K_ADDR, V_ADDR]
    assert [call[9] for call in encode.calls] == [real.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
                                                  real.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE]


@pytest.mark.parametrize("arguments, message", [
    (args(k=K_ADDR + 8), f"attn: tensor map 'k_map' of array 'k': its address {K_ADDR + 8:#x} is not a multiple of "
                         "16 bytes"),
    (args(seq_len=0), "attn: tensor map 'k_map' of array 'k': dimensions [128, 0, 8] (innermost first) must be "
                      "1..2^32 elements"),
])
def test_a_map_the_driver_would_refuse_is_refused_first_naming_kernel_map_and_array(arguments, message):
    encode = Encoder()
    with pytest.raises(LaunchError) as error:
        pack_params(attention_kernel(), arguments, encode)
    assert str(error.value) == message
    assert encode.calls == [], "refused before the driver is called"


def test_byte_strides_must_be_multiples_of_16():
    rows = (Param("x", "u8", ("rows", 100)), Param("rows", "u32", role="scalar"))
    kernel = DeviceKernel("bytes", None, rows, 0, 1024, 0, 32, tensor_maps=(TensorMap("x_map", "x", (16, 4)),))
    with pytest.raises(LaunchError) as error:
        pack_params(kernel, [Q_ADDR, 4], Encoder())
    assert str(error.value) == ("bytes: tensor map 'x_map' of array 'x': byte strides [100] must be multiples of 16 "
                                "below 2^40")


def test_a_driver_error_is_a_launch_error_with_its_name():
    with pytest.raises(LaunchError) as error:
        pack_params(attention_kernel(), args(), Encoder(int(real.CUresult.CUDA_ERROR_INVALID_VALUE)))
    assert str(error.value) == ("attn: tensor map 'k_map' of array 'k': cuTensorMapEncodeTiled (dimensions "
                                f"[128, {SEQ_LEN}, 8], byte strides [256, {256 * SEQ_LEN}], box [64, 128, 1]) failed: "
                                "CUDA_ERROR_INVALID_VALUE")


# --- a kernel whose sm_90a cubin takes the maps ------------------------------------------------------
PTX = ".version 8.0\n.target {target}\n.address_size 64\n.visible .entry attn()\n{{\n\tret;\n}}\n"


def compiled_attention() -> CompiledKernel:
    geometry = Geometry((ceil_div(scalar("seq_len"), 128), HEADS, 1), (384, 1, 1))
    variants = {"sm_80": Variant("sm_80", PTX.format(target="sm_80"), "8.0", geometry),
                "sm_90a": Variant("sm_90a", PTX.format(target="sm_90a"), "8.0", geometry,
                                  tensor_maps=(K_MAP, V_MAP))}
    binaries = {arch: Binary(arch, arch, b"\x7fELF attn " + arch.encode(), "", dict.fromkeys(RESOURCE_KEYS, 0))
                for arch in variants}
    return CompiledKernel("attn", "flash_attention", {"name": "attn", "kind": "flash_attention"}, PARAMS,
                          {"seq_len": (1, 65536)}, variants, binaries)


def test_a_session_launches_the_maps_of_the_variant_it_loads(monkeypatch):
    try:
        device.driver()
        pytest.skip("a CUDA driver is present: the simulated one would call it")
    except DeviceUnavailable:
        pass
    from simulated_gpu import SimulatedDriver

    simulated, encode = SimulatedDriver({}), Encoder()
    monkeypatch.setattr(device, "driver", lambda instead="": simulated)
    monkeypatch.setattr(device, "tensor_map_encoder", lambda: encode)
    gpu = device.DeviceSession()  # an sm_90: it loads the sm_90a cubin
    kernel = gpu.kernel(compiled_attention())
    assert kernel.tensor_maps == (K_MAP, V_MAP)
    gpu.capture(lambda: gpu.launch(kernel, Launch((3, HEADS, 1), (384, 1, 1)), args()))
    (launch,) = [call for name, call in simulated.calls if name == "cuLaunchKernel"]
    values, types = launch[9]
    assert values[:5] == (Q_ADDR, K_ADDR, V_ADDR, O_ADDR, SEQ_LEN) and types[5:] == (None, None)
    assert [list(value.opaque) for value in values[5:]] == [map_words(0), map_words(1)]
    assert [call[3] for call in encode.calls] == [K_ADDR, V_ADDR]


# --- the C header ------------------------------------------------------------------------------------
def manifest() -> dict:
    return {"spec": {"file": "tma.toml", "sha256": "0" * 64},
            "kernels": {"attn": compiled_attention().manifest_entry()}}


def test_a_header_without_maps_neither_includes_cuda_h_nor_changes():
    plain = manifest()
    del plain["kernels"]["attn"]["variants"]["sm_90a"]
    del plain["kernels"]["attn"]["cubins"]["sm_90a"]
    text = render_header(plain)
    assert "cuda.h" not in text and "CUtensorMap" not in text
    del plain["kernels"]["attn"]["variants"]["sm_80"]["tensor_maps"]  # a manifest from before tensor maps
    assert render_header(plain) == text


def test_every_name_a_header_with_maps_defines_is_one_defined_names_knows():
    text = render_header(manifest())
    block = text.split("/* --- attn: ")[1]
    found = set(re.findall(r"^#define (\w+)", block, re.M))
    found |= set(re.findall(r"^static [^(=\[]*?\b(\w+)(?:\(|\[)", block, re.M))
    found |= set(re.findall(r"^} (\w+);", block, re.M))
    assert {"attn_sm_90a_encode_tensor_maps", "attn_sm_90a_params_with_maps", "ATTN_SM_90A_NUM_TENSOR_MAPS"} <= found
    assert found == defined_names("attn", ["sm_90a"], mapped=["sm_90a"])


# The encoder stands in for libcuda's: it prints its arguments and fails call number fail_at.
C_PROGRAM = r"""
#include <stdio.h>
#include "tma.h"
static int calls, fail_at = -1;
CUresult CUDAAPI cuTensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* address,
                                        const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                                        const cuuint32_t* steps, CUtensorMapInterleave interleave,
                                        CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2,
                                        CUtensorMapFloatOOBfill fill) {
    printf("encode %d type %d address %llx", calls, (int)type, (unsigned long long)(uintptr_t)address);
    for (cuuint32_t i = 0; i < rank; i++) printf(" dim %llu", (unsigned long long)dims[i]);
    for (cuuint32_t i = 0; i + 1 < rank; i++) printf(" stride %llu", (unsigned long long)strides[i]);
    for (cuuint32_t i = 0; i < rank; i++) printf(" box %u step %u", box[i], steps[i]);
    printf(" interleave %d swizzle %d l2 %d fill %d\n", (int)interleave, (int)swizzle, (int)l2, (int)fill);
    map->opaque[0] = (cuuint64_t)calls;
    return calls++ == fail_at ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}
int main(void) {
    attn_args a = {0x7f0000000000, 0x7f0001000000, 0x7f0002000000, 0x7f0003000000, 300};
    CUtensorMap maps[ATTN_SM_90A_NUM_TENSOR_MAPS];
    void* params[ATTN_NUM_PARAMS + ATTN_SM_90A_NUM_TENSOR_MAPS];
    printf("status %d\n", (int)attn_sm_90a_encode_tensor_maps(&a, 300, maps));
    attn_sm_90a_params_with_maps(&a, maps, params);
    printf("params %d %d %d %llu\n", params[1] == &a.k, params[5] == &maps[0], params[6] == &maps[1],
           (unsigned long long)((CUtensorMap*)params[6])->opaque[0]);
    calls = 0, fail_at = 0;
    CUresult status = attn_sm_90a_encode_tensor_maps(&a, 300, maps);
    printf("status %d after %d\n", (int)status, calls);
    return 0;
}
"""
# The few declarations of cuda.h the header uses, where no CUDA toolkit or wheel provides it.
CUDA_H_STUB = """
#include <stdint.h>
#define CUDAAPI
typedef uint32_t cuuint32_t;
typedef uint64_t cuuint64_t;
typedef enum { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1 } CUresult;
typedef struct { cuuint64_t opaque[16]; } CUtensorMap;
typedef enum { CU_TENSOR_MAP_DATA_TYPE_UINT8 = 0, CU_TENSOR_MAP_DATA_TYPE_UINT32 = 2,
               CU_TENSOR_MAP_DATA_TYPE_FLOAT16 = 6, CU_TENSOR_MAP_DATA_TYPE_FLOAT32 = 7,
               CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 = 9 } CUtensorMapDataType;
typedef enum { CU_TENSOR_MAP_INTERLEAVE_NONE = 0 } CUtensorMapInterleave;
typedef enum { CU_TENSOR_MAP_SWIZZLE_NONE = 0, CU_TENSOR_MAP_SWIZZLE_128B = 3 } CUtensorMapSwizzle;
typedef enum { CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 3 } CUtensorMapL2promotion;
typedef enum { CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0 } CUtensorMapFloatOOBfill;
CUresult CUDAAPI cuTensorMapEncodeTiled(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                        const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                        CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
"""


def cuda_include(tmp_path) -> str:
    """A folder with cuda.h: the CUDA wheel's or toolkit's, else the stub."""
    found = find_nvidia_header_directory("cudart")
    if found and (Path(found) / "cuda.h").exists():
        return found
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "cuda.h").write_text(CUDA_H_STUB)
    return str(stub)


def test_the_header_encodes_the_maps_as_the_launcher_does_and_passes_them_after_the_parameters(tmp_path):
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        pytest.skip("no C compiler on this machine")
    (tmp_path / "tma.h").write_text(render_header(manifest()))
    (tmp_path / "main.c").write_text(C_PROGRAM)
    built = subprocess.run([compiler, "-std=c99", "-Wall", "-Wextra", "-Werror", "-I", str(tmp_path), "-I",
                            cuda_include(tmp_path), str(tmp_path / "main.c"), "-o", str(tmp_path / "main")],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    lines = subprocess.run([str(tmp_path / "main")], capture_output=True, text=True, check=True).stdout.splitlines()

    kind = int(real.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16)
    l2 = int(real.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B)
    shape = (f"dim 128 dim {SEQ_LEN} dim {HEADS} stride 256 stride {256 * SEQ_LEN} "
             "box 64 step 1 box 128 step 1 box 1 step 1")
    swizzles = (real.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B, real.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE)
    expected = [f"encode {call} type {kind} address {address:x} {shape} interleave 0 swizzle {int(swizzle)} "
                f"l2 {l2} fill 0" for call, (address, swizzle) in enumerate(zip((K_ADDR, V_ADDR), swizzles))]
    assert lines[:4] == [*expected, "status 0", "params 1 1 1 1"], "the same arguments as pack_params gives the driver"
    assert lines[4:] == [expected[0], "status 1 after 1"], "the first failure returns, encoding no further map"


@pytest.mark.parametrize("make, message", [
    (lambda: TensorMap("k_map", "k", (64, 300, 1), 128), r"box \[64, 300, 1\] needs 1..5 sizes of 1..256"),
    (lambda: TensorMap("k_map", "k", (64, 128, 1), 64), "swizzle 64 is not 0 or 128"),
    (lambda: TensorMap("k_map", "k", (128, 128, 1), 128).check(PARAMS[1]), r"box \[128, 128, 1\] does not fit k"),
    (lambda: TensorMap("k_map", "k", (64, 128), 128).check(PARAMS[1]), r"box \[64, 128\] does not fit k"),
    (lambda: TensorMap("k_map", "k", (4, 2, 1)).check(PARAMS[1]), r"box \[4, 2, 1\] does not fit k"),
])
def test_a_map_its_array_cannot_have_is_refused(make, message):
    # the swizzle's span holds the box's rows; the rows are whole 16-byte chunks; one box size a dimension
    with pytest.raises(ValueError, match=message):
        make()
