"""The quant-type registry: block layouts, dequantisers bit-exact against gguf-py, quantisers by
reconstruction error and pinned bytes (Q4_K's own tests are in test_q4k.py)."""

import hashlib

import gguf
import numpy as np
import pytest
from helpers import assert_bits_equal, gaussian, rel_rms

from ptxgen import kquants, quants
from ptxgen.errors import PtxgenError
from ptxgen.quants import QUANT_TYPES, quant_type

ALL = sorted(QUANT_TYPES)
Q6_K, Q8_0 = QUANT_TYPES["q6_k"], QUANT_TYPES["q8_0"]


def random_blocks(rng, quant, n, nb):
    """Any bytes, with every f16 scale (and plain float weight) a small finite random value."""
    w = rng.integers(0, 256, size=(n, nb, quant.block_bytes), dtype=np.uint8)
    f16_offsets = {"q4_k": (0, 2), "q6_k": (208,), "q8_0": (0,)}.get(quant.name, ())
    for offset in f16_offsets:
        w[..., offset:offset + 2] = (rng.standard_normal((n, nb, 1)) * 1e-2).astype(np.float16).view(np.uint8)
    if quant.block_weights == 1:  # f32, f16, bf16: finite values of the type
        w = quant.quantize(rng.standard_normal((n, nb)).astype(np.float32)).reshape(n, nb, quant.block_bytes)
    return w.reshape(n, nb * quant.block_bytes)


@pytest.mark.parametrize("name", ALL)
def test_sizes_match_gguf(name):
    q = QUANT_TYPES[name]
    assert gguf.GGML_QUANT_SIZES[q.ggml_type] == (q.block_weights, q.block_bytes)
    assert q.row_bytes(4096) == 4096 // q.block_weights * q.block_bytes


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("n, nb", [(1, 1), (5, 3), (8, 16)])
def test_dequantize_bit_exact_against_gguf(name, n, nb):
    q = QUANT_TYPES[name]
    w = random_blocks(np.random.default_rng(n * 31 + nb), q, n, nb)
    y = q.dequantize(w)
    assert np.isfinite(y).all()
    assert_bits_equal(y, gguf.quants.dequantize(w, q.ggml_type))
    f64 = q.dequantize_f64(w)
    assert f64.dtype == np.float64
    np.testing.assert_array_equal(f64, y.astype(np.float64))


@pytest.mark.parametrize("name", ALL)
def test_dequantize_bit_exact_on_quantized_rows(name):
    q = QUANT_TYPES[name]
    w = q.quantize(gaussian(np.random.default_rng(1), 7, 1024))
    assert w.shape == (7, q.row_bytes(1024)) and w.dtype == np.uint8
    assert_bits_equal(q.dequantize(w, 1024), gguf.quants.dequantize(w, q.ggml_type))


def test_dequantize_f64_keeps_leading_dimensions():
    w = np.stack([Q6_K.quantize(gaussian(np.random.default_rng(i), 3, 512)) for i in range(2)])
    assert Q6_K.dequantize_f64(w).shape == (2, 3, 512)
    assert Q6_K.dequantize_f64(w[0, 0]).shape == (512,)
    with pytest.raises(PtxgenError, match="whole 210-byte blocks"):
        Q6_K.dequantize_f64(w[..., :100])


def test_q6_k_layout():
    """Weight 128h + 32s + l: low 4 bits in ql[64h + 32(s%2) + l] (low nibble for s < 2, high for
    s >= 2), top 2 bits at bits 2s of qh[32h + l]; scale j = weight // 16; f16 d in the last 2 bytes."""
    for h, s, l in [(0, 0, 0), (0, 1, 7), (0, 2, 31), (1, 3, 5), (1, 2, 16)]:
        block = np.zeros((1, kquants.Q6_K_BYTES), np.uint8)
        code = 0b101101  # 45: low nibble 0b1101, top bits 0b10
        block[0, 64 * h + 32 * (s % 2) + l] = (code & 15) << (4 * (s // 2))
        block[0, 128 + 32 * h + l] = (code >> 4) << (2 * s)
        weight = 128 * h + 32 * s + l
        block[0, 192 + weight // 16] = np.int8(-3).view(np.uint8)
        block[0, 208:210] = np.float16(0.5).reshape(1).view(np.uint8)
        expect = np.zeros(256, np.float32)
        expect[weight] = 0.5 * -3 * (code - 32)
        # every other weight has code 0 -> q = -32, scaled by its sub-block's scale (0 unless shared)
        shared = np.arange(256) // 16 == weight // 16
        expect[shared & (np.arange(256) != weight)] = 0.5 * -3 * -32
        np.testing.assert_array_equal(Q6_K.dequantize(block)[0], expect)


def test_q8_0_layout():
    block = np.zeros((1, 34), np.uint8)
    block[0, 0:2] = np.float16(0.25).reshape(1).view(np.uint8)
    block[0, 2:] = np.arange(-16, 16, dtype=np.int8).view(np.uint8)
    np.testing.assert_array_equal(Q8_0.dequantize(block)[0], 0.25 * np.arange(-16, 16, dtype=np.float32))


# Measured relative RMS error of dequantize(quantize(x)) on N(0, std^2) weights, 64 x 4096
# (4096 x 4096 gives the same): Q6_K 0.0177 at std 0.02 and 1, 0.0205 at std 1e-3, where the
# f16 super-scale d ~ 1e-6 falls among f16 subnormals (steps of 6e-8); Q8_0 0.0053 at all three
# (a uniform 8-bit grid over 32 Gaussians predicts ~0.0047); Q4_K: test_q4k.py (0.0713).
REL_RMS_BOUND = {("q6_k", 1e-3): 0.021, ("q6_k", 0.02): 0.0185, ("q6_k", 1.0): 0.0185,
                 ("q8_0", 1e-3): 0.0056, ("q8_0", 0.02): 0.0056, ("q8_0", 1.0): 0.0056,
                 ("f16", 0.02): 2.5e-4, ("bf16", 0.02): 1.8e-3}


@pytest.mark.parametrize("name, std", sorted(REL_RMS_BOUND))
def test_quantize_reconstruction_error(name, std):
    q = QUANT_TYPES[name]
    x = gaussian(np.random.default_rng(5), 64, 4096, std)
    err = rel_rms(q.dequantize(q.quantize(x)), x)
    assert err < REL_RMS_BOUND[(name, std)], err


def test_q6_k_scales_span_the_int8_range():
    d, scales, codes = kquants.unpack_q6_k(Q6_K.quantize(gaussian(np.random.default_rng(6), 16, 1024)).reshape(-1, 210))
    assert (d != 0).all() and codes.max() <= 63  # d takes the sign that makes the big scale -128
    # The sub-block scale of largest magnitude, sign kept, is code -128 in every block.
    assert (scales == -128).any(axis=-1).all()


def test_q6_k_golden_bytes():
    """Pins the quantiser. These bytes equal, block for block, ggml's own quantize_row_q6_K_ref
    (ggml d99724f2, built with gcc -O2, no FMA contraction) on the same input; so did 3,100
    other blocks (Gaussian at std 1e-3..300, Student-t, uniform, zero runs). A change here means
    the algorithm or its float32 rounding order moved."""
    x = gaussian(np.random.default_rng(11), 8, 1024)
    x[1, 100:140] = 0
    x[2, :256] = 0
    digest = hashlib.sha256(Q6_K.quantize(x).tobytes()).hexdigest()
    assert digest == "52a1f58c067431c34c5975ce42f5a3edf0314c44966679b6f7544caa40c8cfb8"


def test_q8_0_is_ggml_reference():
    """gguf-py's Q8_0 quantiser, which ptxgen uses, against ggml's rule written out here:
    d = max|x| / 127 (f16), q = roundf(x / d) with halves away from zero."""
    x = gaussian(np.random.default_rng(7), 4, 256)
    x[0, :6] = [127, 0.5, 1.5, 2.5, -0.5, -2.5]  # d = 1: ties, which roundf takes away from zero
    x[1, :32] = 0
    w = Q8_0.quantize(x).reshape(-1, 34)
    blocks = x.reshape(-1, 32)
    d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
    scaled = blocks * np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), np.float32(0))
    expect_q = (np.sign(scaled) * np.floor(np.abs(scaled).astype(np.float64) + 0.5)).astype(np.int8)
    np.testing.assert_array_equal(expect_q[0, :6], [127, 1, 2, 3, -1, -3])
    np.testing.assert_array_equal(w[:, 2:].view(np.int8), expect_q)
    np.testing.assert_array_equal(w[:, :2].copy().view(np.float16)[:, 0], d[:, 0].astype(np.float16))


@pytest.mark.parametrize("name", ["q6_k", "q8_0"])
def test_quantize_zeros_and_zero_subblocks(name):
    q = QUANT_TYPES[name]
    assert not q.quantize(np.zeros((3, 512), np.float32)).any(), "an all-zero block is all-zero bytes"
    x = gaussian(np.random.default_rng(8), 2, 512)
    x[:, 32:96] = 0
    assert not q.dequantize(q.quantize(x))[:, 32:96].any()


@pytest.mark.parametrize("c", [0.37, -0.37, 5e-3])
def test_q6_k_constant_row(c):
    x = np.full((2, 512), c, np.float32)
    y = Q6_K.dequantize(Q6_K.quantize(x))
    # All codes -32 and sub-block scales -128: y = 4096 d with d = f16(c / 4096), so only the
    # f16 rounding of d (2^-11 relative; d ~ 1.2e-6 for c = 5e-3 is subnormal: step 2^-24) is left.
    np.testing.assert_allclose(y, x, rtol=2.0**-11, atol=4096 * 2.0**-25)


@pytest.mark.parametrize("name", ["q6_k", "q8_0"])
def test_quantize_rejects_bad_input(name):
    q = QUANT_TYPES[name]
    with pytest.raises(PtxgenError, match=f"multiple of {q.block_weights}"):
        q.quantize(np.zeros((2, q.block_weights + 1), np.float32))
    with pytest.raises(PtxgenError, match="float"):
        q.quantize(np.zeros((1, 256), np.int32))
    with pytest.raises(PtxgenError, match="finite"):
        q.quantize(np.full((1, 256), np.inf, np.float32))
    with pytest.raises(PtxgenError, match=f"multiple of {q.block_bytes} bytes"):
        q.dequantize(np.zeros((2, q.block_bytes + 1), np.uint8))
    with pytest.raises(PtxgenError, match="k=512"):
        q.dequantize(np.zeros((2, q.block_bytes), np.uint8), 512)


def test_quant_type_lookup():
    assert quant_type("Q6_K") is quant_type("q6_k") is Q6_K
    assert quant_type(gguf.GGMLQuantizationType.Q8_0) is Q8_0
    assert quant_type(int(gguf.GGMLQuantizationType.BF16)).name == "bf16"
    with pytest.raises(PtxgenError, match=r"unsupported tensor type Q5_K \(supported: Q4_K, Q6_K, Q8_0, F32, F16, BF16\)"):
        quant_type(gguf.GGMLQuantizationType.Q5_K)
    with pytest.raises(PtxgenError, match="unsupported tensor type 'q3'"):
        quant_type("q3")
    with pytest.raises(PtxgenError, match="type number 9999"):
        quant_type(9999)


@pytest.mark.parametrize("name", ["q6_k", "q8_0", "f16"])
def test_random_weights_deterministic_and_pooled(name, monkeypatch):
    q = QUANT_TYPES[name]
    a = q.random_weights(np.random.default_rng(9), 3, 512)
    np.testing.assert_array_equal(a, q.random_weights(np.random.default_rng(9), 3, 512))
    assert 0.015 < q.dequantize(a).std() < 0.025
    monkeypatch.setattr(quants, "POOL_WEIGHTS", 64 * 256)  # the pool path for anything above
    b = q.random_weights(np.random.default_rng(5), 64, 1024)
    np.testing.assert_array_equal(b, q.random_weights(np.random.default_rng(5), 64, 1024))
    assert b.shape == (64, q.row_bytes(1024))
    assert abs(q.dequantize(b).std() - 0.02) < 0.002
    assert len({row.tobytes() for row in b}) == 64, "rows must differ"
