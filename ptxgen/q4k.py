"""GGML Q4_K weights in numpy: pack layout, dequantisation and ggml's reference quantiser.

A row of k weights is k/256 blocks of 144 bytes, each a GGML ``block_q4_K``::

    f16 d, f16 dmin, u8 scales[12], u8 qs[128]

Sub-block j (32 weights) has a 6-bit scale ``sc_j`` and 6-bit min ``m_j`` packed into
``scales`` as ggml's ``get_scale_min_k4`` reads them; in 64-weight chunk c, byte
``qs[32c + l]`` holds weight ``64c + l`` (low nibble) and ``64c + 32 + l`` (high nibble);
``weight = d * sc_j * q - dmin * m_j``.

``quantize`` follows ggml's ``quantize_row_q4_K_ref`` (no importance matrix). Known
deviations, none of which changes the algorithm:

* ggml's 6-bit codes go through ``uint8_t`` before ``MIN(63, .)``, so a (never observed)
  negative sub-block scale would wrap to 63; here codes are clipped to 0..63.
* Non-finite input is rejected rather than quantised to garbage.
* Float32 sums run in ggml's sequential order (numpy reduces the leading axis of a
  [32, S] array row by row; a last-axis sum would be pairwise), but a C compiler may
  contract ``a*b+c`` into FMAs (``-march=native``), so bytes can differ from a given
  ggml build where the grid search meets last-ulp ties.
* A sub-block whose grid span ``max - min`` turns non-positive after an offset update
  (undefined in ggml, never seen) keeps a span of 1 instead.
"""

from __future__ import annotations

import functools

import numpy as np

from ptxgen.errors import PtxgenError

BLOCK_WEIGHTS = 256
BLOCK_BYTES = 144
SUB = 32  # weights per sub-block
NSUB = BLOCK_WEIGHTS // SUB

# make_qkx2_quants settings that quantize_row_q4_K_ref uses.
_NMAX = 15
_RMIN = np.float32(-1.0)
_RDELTA = np.float32(0.1)
_NSTEP = 20

# Blocks per quantiser pass: bounds the grid search's temporaries (~20 arrays of
# chunk*256 float32) to a few hundred MB.
_CHUNK_BLOCKS = 1 << 14


def row_bytes(k: int) -> int:
    """Bytes of one Q4_K row of k weights (k a multiple of 256)."""
    if k % BLOCK_WEIGHTS:
        raise PtxgenError(f"Q4_K row length must be a multiple of {BLOCK_WEIGHTS}, got k={k}")
    return k // BLOCK_WEIGHTS * BLOCK_BYTES


def _check_packed(w: np.ndarray, k: int | None) -> np.ndarray:
    """Validate packed weights; return them as u8 [n, nb*144]."""
    w = np.asarray(w)
    if w.dtype != np.uint8:
        raise PtxgenError(f"Q4_K weights must be uint8, got {w.dtype}")
    if w.ndim == 1:
        w = w[None, :]
    if w.ndim != 2:
        raise PtxgenError(f"Q4_K weights must be 1-D or 2-D [n, k/256*144], got shape {w.shape}")
    if w.shape[1] % BLOCK_BYTES:
        raise PtxgenError(
            f"Q4_K row must be a multiple of {BLOCK_BYTES} bytes, got shape {w.shape}"
        )
    if k is not None and w.shape[1] != row_bytes(k):
        raise PtxgenError(
            f"Q4_K weights for k={k} must have {row_bytes(k)} bytes a row, got shape {w.shape}"
        )
    return w


def _scale_min_codes(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """12 packed bytes [..., 12] -> 6-bit (scale, min) codes [..., 8], as get_scale_min_k4."""
    lo, mid, hi = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    # Sub-blocks 0-3 sit in the low 6 bits of bytes 0-3 / 4-7; sub-blocks 4-7 take
    # their low nibble from bytes 8-11 and their top 2 bits from bits 6-7 of bytes 0-7.
    sc = np.concatenate([lo & 63, (hi & 15) | ((lo >> 6) << 4)], axis=-1)
    mn = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=-1)
    return sc, mn


def _pack_scale_min(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Inverse of _scale_min_codes: 6-bit codes [..., 8] -> 12 bytes [..., 12]."""
    sc = sc.astype(np.uint8)
    mn = mn.astype(np.uint8)
    lo = sc[..., :4] | ((sc[..., 4:] >> 4) << 6)
    mid = mn[..., :4] | ((mn[..., 4:] >> 4) << 6)
    hi = (sc[..., 4:] & 15) | ((mn[..., 4:] & 15) << 4)
    return np.concatenate([lo, mid, hi], axis=-1)


def unpack(w: np.ndarray):
    """Split packed rows into fields.

    Returns ``(d, dmin, scales, mins, q)``: d, dmin float32 [n, nb]; scales, mins
    uint8 [n, nb, 8]; q uint8 [n, nb*256] (codes 0..15 in weight order).
    """
    w = _check_packed(w, None)
    n, nb = w.shape[0], w.shape[1] // BLOCK_BYTES
    blk = w.reshape(n, nb, BLOCK_BYTES)
    d = blk[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    dmin = blk[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    sc, mn = _scale_min_codes(blk[..., 4:16])
    qs = blk[..., 16:].reshape(n, nb, 4, 1, 32)
    # Low nibble then high nibble of each 32-byte run: weights 64c+l and 64c+32+l.
    q = (qs >> np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1)) & 15
    return d, dmin, sc, mn, q.reshape(n, nb * BLOCK_WEIGHTS)


def dequantize(w: np.ndarray, k: int | None = None) -> np.ndarray:
    """Packed u8 [n, nb*144] (or one row, 1-D) -> float32 [n, k].

    Computes ``(d*sc)*q - dmin*m`` in float32, the same rounding steps as ggml.
    """
    w = _check_packed(w, k)
    d, dmin, sc, mn, q = unpack(w)
    n, nb = d.shape
    ds = (d[..., None] * sc.astype(np.float32))[..., None]  # [n, nb, 8, 1]
    dm = (dmin[..., None] * mn.astype(np.float32))[..., None]
    y = ds * q.reshape(n, nb, NSUB, SUB).astype(np.float32) - dm
    return y.reshape(n, nb * BLOCK_WEIGHTS)


def dequantize_f64(w: np.ndarray) -> np.ndarray:
    """The ground truth for kernel references: gguf's own Q4_K dequantisation, as float64."""
    import gguf

    return gguf.quants.dequantize(w, gguf.GGMLQuantizationType.Q4_K).astype(np.float64)


def _rint(v: np.ndarray) -> np.ndarray:
    """ggml's nearest_int: round half to even, as int32."""
    return np.rint(v).astype(np.int32)


def _sum(a: np.ndarray) -> np.ndarray:
    # Reducing the leading axis of a [32, S] array accumulates row by row, which is
    # ggml's sequential float32 order (a last-axis sum would be pairwise).
    return np.add.reduce(a, axis=0, dtype=np.float32)


def _make_qkx2(x: np.ndarray, wt: np.ndarray):
    """make_qkx2_quants over many sub-blocks at once.

    x, wt: float32 [32, S] (weight position first). Returns (scale [S], min [S] as
    ggml's positive ``the_min``, codes u8 [32, S]).
    """
    f32 = np.float32
    xmin = np.minimum(x.min(axis=0), f32(0))  # the offset is never positive
    xmax = x.max(axis=0)
    sum_w = _sum(wt)
    sum_x = _sum(wt * x)
    flat = xmax == xmin  # all-equal non-positive sub-block: codes 0, scale 0
    span = np.where(flat, f32(1), xmax - xmin)

    iscale = f32(_NMAX) / span
    scale = f32(1) / iscale
    L = np.clip(_rint(iscale * (x - xmin)), 0, _NMAX)
    Lf = L.astype(f32)
    diff = scale * Lf + xmin - x
    best = _sum(wt * (diff * diff))
    best_min = xmin

    for step in range(_NSTEP + 1):
        # As in ggml, the grid is laid from the best offset found so far, not the
        # sub-block minimum: an improvement moves every later step's grid.
        span = xmax - best_min
        span = np.where(flat | (span <= 0), f32(1), span)  # guard only; never seen
        iscale = (_RMIN + _RDELTA * f32(step) + f32(_NMAX)) / span
        la = np.clip(_rint(iscale * (x - best_min)), 0, _NMAX).astype(f32)
        wl = wt * la
        sum_l = _sum(wl)
        sum_l2 = _sum(wl * la)
        sum_xl = _sum(wl * x)
        D = sum_w * sum_l2 - sum_l * sum_l
        ok = D > 0
        D_safe = np.where(ok, D, f32(1))
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / D_safe
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D_safe
        # A positive offset is not representable (the stored min is subtracted):
        # pin it to 0 and refit the scale alone.
        pos = this_min > 0
        this_min = np.where(pos, f32(0), this_min)
        with np.errstate(divide="ignore", invalid="ignore"):
            this_scale = np.where(pos, sum_xl / sum_l2, this_scale)
        diff = this_scale * la + this_min - x
        mad = _sum(wt * (diff * diff))
        better = ok & (mad < best)
        Lf = np.where(better, la, Lf)
        best = np.where(better, mad, best)
        scale = np.where(better, this_scale, scale)
        best_min = np.where(better, this_min, best_min)

    scale = np.where(flat, f32(0), scale)
    Lf = np.where(flat, f32(0), Lf)
    best_min = np.where(flat, xmin, best_min)
    return scale.astype(f32), (-best_min).astype(f32), Lf.astype(np.uint8)


def _quantize_blocks(xb: np.ndarray) -> np.ndarray:
    """float32 [B, 256] -> u8 [B, 144]."""
    f32 = np.float32
    B = xb.shape[0]
    # Position-major [32, B*8] so reductions over a sub-block run sequentially.
    x = np.ascontiguousarray(xb.reshape(B * NSUB, SUB).T)

    # ggml's weighting: RMS of the sub-block plus |x|, favouring large weights.
    av_x = np.sqrt(_sum(x * x) / f32(SUB))
    wt = av_x + np.abs(x)
    scales, mins, L = _make_qkx2(x, wt)
    scales = scales.reshape(B, NSUB)
    mins = mins.reshape(B, NSUB)

    max_scale = np.maximum(scales.max(axis=1), f32(0))
    max_min = np.maximum(mins.max(axis=1), f32(0))
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > 0, f32(63) / max_scale, f32(0))
        inv_min = np.where(max_min > 0, f32(63) / max_min, f32(0))
    sc = np.clip(_rint(inv_scale[:, None] * scales), 0, 63).astype(np.uint8)
    mn = np.clip(_rint(inv_min[:, None] * mins), 0, 63).astype(np.uint8)
    d16 = (max_scale / f32(63)).astype(np.float16)
    dmin16 = (max_min / f32(63)).astype(np.float16)

    # Requantise against what dequantisation will actually use: the f16 super-scales
    # times the 6-bit codes.
    d_eff = (d16.astype(f32)[:, None] * sc.astype(f32)).reshape(1, -1)
    dm_eff = (dmin16.astype(f32)[:, None] * mn.astype(f32)).reshape(1, -1)
    live = d_eff != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        requant = np.clip(_rint((x + dm_eff) / np.where(live, d_eff, f32(1))), 0, 15)
    # ggml skips sub-blocks whose effective scale is 0 and keeps their first-pass codes.
    L = np.where(live, requant, L).astype(np.uint8)

    q = L.T.reshape(B, 4, 2, 32)
    qs = q[:, :, 0, :] | (q[:, :, 1, :] << 4)
    out = np.empty((B, BLOCK_BYTES), np.uint8)
    out[:, 0:2] = d16.reshape(B, 1).view(np.uint8)
    out[:, 2:4] = dmin16.reshape(B, 1).view(np.uint8)
    out[:, 4:16] = _pack_scale_min(sc, mn)
    out[:, 16:] = qs.reshape(B, 128)
    return out


def quantize(x: np.ndarray) -> np.ndarray:
    """float [n, k] (or one row, 1-D) -> Q4_K u8 [n, k/256*144], as quantize_row_q4_K_ref."""
    x = np.asarray(x)
    if x.dtype.kind != "f":
        raise PtxgenError(f"Q4_K quantize needs a float array, got {x.dtype}")
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2:
        raise PtxgenError(f"Q4_K quantize needs a 1-D or 2-D [n, k] array, got shape {x.shape}")
    n, k = x.shape
    if k == 0 or k % BLOCK_WEIGHTS:
        raise PtxgenError(
            f"Q4_K quantize needs k a positive multiple of {BLOCK_WEIGHTS}, got shape {x.shape}"
        )
    x = x.astype(np.float32)
    if not np.isfinite(x).all():
        raise PtxgenError("Q4_K quantize needs finite weights, got NaN or inf")
    xb = x.reshape(-1, BLOCK_WEIGHTS)
    out = np.empty((xb.shape[0], BLOCK_BYTES), np.uint8)
    for s in range(0, xb.shape[0], _CHUNK_BLOCKS):
        out[s : s + _CHUNK_BLOCKS] = _quantize_blocks(xb[s : s + _CHUNK_BLOCKS])
    return out.reshape(n, row_bytes(k))


POOL_WEIGHTS = 1 << 22  # beyond this many weights, blocks are drawn from a quantised pool
POOL_SEED = 20250101


def random_weights(rng: np.random.Generator, n: int, k: int, std: float = 0.02) -> np.ndarray:
    """Q4_K u8 [n, k/256*144] of quantised N(0, std^2) weights; deterministic in rng.

    Large matrices draw whole blocks (with rng) from a pool of POOL_WEIGHTS quantised weights
    made once per std, so every block is still a real quantised Gaussian block, and a model's
    worth of weights (Qwen3-8B: 7.6G) costs a gather, not the quantiser."""
    if n * k <= POOL_WEIGHTS:
        return quantize(rng.standard_normal((n, k), dtype=np.float32) * np.float32(std))
    pool = block_pool(float(std), POOL_WEIGHTS)
    picks = rng.integers(0, len(pool), size=n * (k // BLOCK_WEIGHTS))
    return pool[picks].reshape(n, row_bytes(k))


@functools.lru_cache(maxsize=16)
def block_pool(std: float, weights: int) -> np.ndarray:
    """Q4_K blocks [weights / 256, 144] of N(0, std^2) weights from a fixed seed (read-only)."""
    rng = np.random.default_rng(POOL_SEED)
    pool = quantize(rng.standard_normal((weights // BLOCK_WEIGHTS, BLOCK_WEIGHTS), dtype=np.float32) * np.float32(std))
    pool.setflags(write=False)
    return pool


def load_gguf_tensor(path, tensor_name: str, n: int, k: int) -> np.ndarray:
    """The Q4_K tensor `tensor_name` of a GGUF file as u8 [n, k/256*144] (a copy, in memory).

    GGUF lists dimensions fastest first, so a weight of n rows of k is stored as [k, n].
    Raises PtxgenError naming the file, the tensor and what was expected for a missing or
    unreadable file, a missing tensor, a tensor that is not Q4_K, or another shape.
    """
    from pathlib import Path

    import gguf

    path = Path(path)
    expected_bytes = row_bytes(k)  # also rejects k that is not a multiple of 256
    try:
        reader = gguf.GGUFReader(path, "r")
    except OSError as error:
        raise PtxgenError(f"{path}: cannot read GGUF file: {error.strerror or error}") from None
    except (ValueError, KeyError, IndexError) as error:
        raise PtxgenError(f"{path}: not a readable GGUF file: {error}") from None
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    if tensor_name not in tensors:
        names = sorted(tensors)
        shown = ", ".join(names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")
        raise PtxgenError(f"{path}: no tensor named {tensor_name!r} (tensors: {shown or 'none'})")
    tensor = tensors[tensor_name]
    quant = gguf.GGMLQuantizationType(tensor.tensor_type)
    if quant != gguf.GGMLQuantizationType.Q4_K:
        raise PtxgenError(f"{path}: tensor {tensor_name!r} is {quant.name}, expected Q4_K")
    dims = [int(d) for d in tensor.shape]  # fastest first: [k, n]
    while len(dims) > 2 and dims[-1] == 1:
        dims.pop()
    if dims != [k, n] and not (n == 1 and dims == [k]):
        shown = "[" + ", ".join(str(d) for d in reversed(dims)) + "]"
        raise PtxgenError(
            f"{path}: tensor {tensor_name!r} has shape {shown} (rows, weights per row), "
            f"expected [{n}, {k}] for this kernel"
        )
    data = np.asarray(tensor.data, dtype=np.uint8).reshape(n, expected_bytes)
    return np.array(data, copy=True)
