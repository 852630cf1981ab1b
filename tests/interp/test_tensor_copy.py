"""cp.async.bulk.tensor (TMA) against numpy: a box of a 3-D array copied into shared memory
through a tensor-map parameter, zero-filled past the array's edges, with and without the 128-byte
swizzle; and the misuses the interpreter must name.

The expected shared image is written here from the CUDA driver's description of a tiled tensor
map (box stored row-major, innermost dimension first; SWIZZLE_128B permutes the 16-byte chunks
of each 128-byte row by the row's index mod 8), independently of the interpreter's code."""
import numpy as np
import pytest

from ptxgen.abi import TensorMap
from ptxgen.errors import LaunchError, SanitizerError
from ptxgen.interp import launch
from interp_helpers import HEADER

SM90A = HEADER.replace("8.0\n.target sm_80", "8.0\n.target sm_90a")
BOX = (64, 16, 1)  # elements: 64 f16 (128 bytes) x 16 rows x 1 head
BYTES = 2 * 64 * 16

KERNEL = SM90A + """.shared .align 8 .b64 bar;
.shared .align 1024 .b8 tile[BYTES];
.visible .entry k(
  .param .u64 src,
  .param .u64 out,
  .param .u32 c0,
  .param .u32 c1,
  .param .u32 c2,
  .param .align 64 .b8 src_map[128]
)
{
  .reg .u32 %t, %b, %d, %x, %y, %z, %w;
  .reg .u64 %map, %out, %off;
  .reg .pred %p, %ok;
  mov.u32 %t, %tid.x;
  mov.u32 %b, bar;
  mov.u32 %d, tile;
  ld.param.u64 %out, [out];
  ld.param.u32 %x, [c0];
  ld.param.u32 %y, [c1];
  ld.param.u32 %z, [c2];
  mov.b64 %map, src_map;
  cvta.param.u64 %map, %map;
  setp.ne.u32 %p, %t, 0;
  @%p bra WAIT;
  mbarrier.init.shared::cta.b64 [%b], 1;
  fence.mbarrier_init.release.cluster;
  mbarrier.arrive.expect_tx.shared::cta.b64 _, [%b], BYTES;
  cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%d], [%map, {%x, %y, %z}], [%b];
WAIT:
  bar.sync 0;
  mbarrier.try_wait.parity.shared::cta.b64 %ok, [%b], 0;
  @!%ok bra WAIT;
  // each of the 128 threads copies its 16 bytes of the shared image out as they lie
  mad.lo.u32 %d, %t, 16, %d;
  ld.shared.v4.b32 {%x, %y, %z, %w}, [%d];
  mul.wide.u32 %off, %t, 16;
  add.u64 %out, %out, %off;
  cvta.to.global.u64 %out, %out;
  st.global.v4.b32 [%out], {%x, %y, %z, %w};
  ret;
}
""".replace("BYTES", str(BYTES))


def expected_image(src, start, swizzle):
    """The shared bytes of the box at `start` (innermost first) of src [heads, rows, dim]."""
    x0, y0, z0 = start
    box = np.zeros((BOX[2], BOX[1], BOX[0]), np.float16)
    for z in range(BOX[2]):
        for y in range(BOX[1]):
            for x in range(BOX[0]):
                gz, gy, gx = z0 + z, y0 + y, x0 + x
                if 0 <= gz < src.shape[0] and 0 <= gy < src.shape[1] and 0 <= gx < src.shape[2]:
                    box[z, y, x] = src[gz, gy, gx]
    image = box.reshape(-1).view(np.uint8)
    if not swizzle:
        return image
    out = np.empty_like(image)
    for chunk in range(image.size // 16):
        row, within = divmod(chunk, 8)
        out[16 * (8 * row + (within ^ row % 8)): 16 * (8 * row + (within ^ row % 8)) + 16] = \
            image[16 * chunk: 16 * chunk + 16]
    return out


def run(src, start, swizzle, ptx=KERNEL, maps=None):
    out = np.full(BYTES, 0xFF, np.uint8)
    maps = maps if maps is not None else (TensorMap("src_map", "src", BOX, swizzle),)
    launch(ptx, "k", (1, 1, 1), (128, 1, 1), [src, out, *(c & 0xFFFFFFFF for c in start)], tensor_maps=maps)
    return out


@pytest.mark.parametrize("swizzle", [0, 128])
@pytest.mark.parametrize("start", [(0, 0, 0), (64, 5, 1), (64, 10, 2), (0, -3, 0), (-8, 2, 1)])
def test_a_box_lands_as_the_driver_describes(start, swizzle):
    rng = np.random.default_rng(1)
    src = rng.uniform(0.5, 2, (3, 21, 128)).astype(np.float16)  # 21 rows: boxes cross the edge
    np.testing.assert_array_equal(run(src, start, swizzle), expected_image(src, start, swizzle))


def test_the_swizzle_matches_the_wgmma_layout_of_a_panel():
    # chunk c of row r of a 1024-byte aligned 128-byte-row panel sits at chunk c ^ (r % 8)
    src = np.arange(16 * 64, dtype=np.float16).reshape(1, 16, 64)
    image = run(src, (0, 0, 0), 128).view(np.float16).reshape(16, 8, 8)
    for r in range(16):
        for c in range(8):
            np.testing.assert_array_equal(image[r, c ^ r % 8], src[0, r, 8 * c: 8 * c + 8])


def test_reading_the_box_before_the_mbarrier_phase_completes_is_caught():
    ptx = KERNEL.replace("  @!%ok bra WAIT;\n", "", 1)
    src = np.ones((1, 16, 64), np.float16)
    with pytest.raises(SanitizerError, match="mbarrier|async|unwritten|before"):
        run(src, (0, 0, 0), 128, ptx)


def test_a_misaligned_destination_is_named():
    ptx = KERNEL.replace("[%d], [%map", "[%e], [%map").replace(
        "  mov.u32 %d, tile;\n", "  mov.u32 %d, tile;\n  .reg .u32 %e;\n  add.u32 %e, %d, 64;\n")
    with pytest.raises(SanitizerError, match="128-byte aligned"):
        run(np.ones((1, 16, 64), np.float16), (0, 0, 0), 128, ptx)


def test_an_address_that_is_no_tensor_map_is_named():
    ptx = KERNEL.replace("  cvta.param.u64 %map, %map;\n", "  cvta.param.u64 %map, %map;\n  add.u64 %map, %map, 8;\n")
    with pytest.raises(SanitizerError, match="not the address of a tensor-map parameter"):
        run(np.ones((1, 16, 64), np.float16), (0, 0, 0), 128, ptx)


def test_launch_wants_each_map_over_an_array_of_its_rank():
    src = np.ones((1, 16, 64), np.float16)
    with pytest.raises(LaunchError, match="takes tensor maps"):
        run(src, (0, 0, 0), 128, maps=())
    with pytest.raises(LaunchError, match="array out of rank 3|rank 3"):
        run(src, (0, 0, 0), 128, maps=(TensorMap("src_map", "out", BOX, 128),))
