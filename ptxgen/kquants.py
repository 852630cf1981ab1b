"""GGML's K-quants Q4_K and Q6_K in numpy: block layouts, dequantisation, ggml's reference quantisers.

Both pack 256 weights a block; a row of k weights is k/256 blocks. Functions here work on
blocks (``[..., block bytes]`` u8 and ``[..., 256]`` float32); ``ptxgen.quants`` adds rows,
checks and the other types.

**Q4_K** (``block_q4_K``, 144 bytes)::

    f16 d, f16 dmin, u8 scales[12], u8 qs[128]

Sub-block j (32 weights) has a 6-bit scale ``sc_j`` and 6-bit min ``m_j`` packed into
``scales`` as ggml's ``get_scale_min_k4`` reads them; in 64-weight chunk c, byte
``qs[32c + l]`` holds weight ``64c + l`` (low nibble) and ``64c + 32 + l`` (high nibble);
``weight = d * sc_j * q - dmin * m_j``.

**Q6_K** (``block_q6_K``, 210 bytes)::

    u8 ql[128], u8 qh[64], i8 scales[16], f16 d

The block is two halves of 128 weights; in half h, weight ``128h + 32s + l`` (quarter
s = 0..3, l = 0..31) has a 6-bit code whose low 4 bits are the low nibble (s = 0, 1) or
high nibble (s = 2, 3) of ``ql[64h + 32(s % 2) + l]`` and whose top 2 bits are bits
``2s, 2s+1`` of ``qh[32h + l]``. Sub-block j (16 weights, j = weight // 16) has the signed
8-bit scale ``scales[j]``; ``weight = d * scales[j] * (code - 32)`` (ggml's quantiser gives d
the sign that makes the largest-magnitude scale -128, so d is negative in about half the blocks).

The quantisers follow ggml's ``quantize_row_q4_K_ref`` and ``quantize_row_q6_K_ref`` (no
importance matrix). Known deviations, none of which changes the algorithm:

* Non-finite input is rejected (in ``ptxgen.quants``) rather than quantised to garbage.
* Float32 sums run in ggml's sequential order (numpy reduces the leading axis of a
  [positions, S] array row by row; a last-axis sum would be pairwise), but a C compiler may
  contract ``a*b+c`` into FMAs (``-march=native``), so bytes can differ from a given ggml
  build where a grid search meets last-ulp ties.
* Q4_K: ggml's 6-bit codes go through ``uint8_t`` before ``MIN(63, .)``, so a (never
  observed) negative sub-block scale would wrap to 63; here codes are clipped to 0..63. A
  sub-block whose grid span ``max - min`` turns non-positive after an offset update
  (undefined in ggml, never seen) keeps a span of 1 instead.
"""

from __future__ import annotations

import numpy as np

QK_K = 256  # weights a block
Q4_K_BYTES = 144
Q6_K_BYTES = 210

# make_qkx2_quants settings that quantize_row_q4_K_ref uses (32-weight sub-blocks, codes 0..15).
_Q4_SUB = 32
_Q4_NMAX = 15
_Q4_RMIN = np.float32(-1.0)
_Q4_RDELTA = np.float32(0.1)
_Q4_NSTEP = 20

# make_qx_quants settings of quantize_row_q6_K_ref: 16-weight sub-blocks, signed codes
# -32..31, a first guess at -32/max and 18 nearby grid scales -(32 + 0.1 i)/max, i = +-1..9.
_Q6_SUB = 16
_Q6_NMAX = 32
_Q6_STEPS = [i for i in range(-9, 10) if i]
_GROUP_MAX_EPS = np.float32(1e-15)  # ggml: an all-zero (sub-)block below this


def _rint(v: np.ndarray) -> np.ndarray:
    """ggml's nearest_int: round half to even, as int32."""
    return np.rint(v).astype(np.int32)


def _sum(a: np.ndarray) -> np.ndarray:
    # Reducing the leading axis of a [positions, S] array accumulates row by row, which is
    # ggml's sequential float32 order (a last-axis sum would be pairwise).
    return np.add.reduce(a, axis=0, dtype=np.float32)


def _f16_at(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The little-endian f16 at byte `offset` of each block, as float32 [...]."""
    return blocks[..., offset:offset + 2].copy().view(np.float16)[..., 0].astype(np.float32)


# --- Q4_K ------------------------------------------------------------------------------------

def q4_k_scale_min_codes(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """12 packed bytes [..., 12] -> 6-bit (scale, min) codes [..., 8], as get_scale_min_k4."""
    lo, mid, hi = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    # Sub-blocks 0-3 sit in the low 6 bits of bytes 0-3 / 4-7; sub-blocks 4-7 take
    # their low nibble from bytes 8-11 and their top 2 bits from bits 6-7 of bytes 0-7.
    sc = np.concatenate([lo & 63, (hi & 15) | ((lo >> 6) << 4)], axis=-1)
    mn = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=-1)
    return sc, mn


def q4_k_pack_scale_min(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Inverse of q4_k_scale_min_codes: 6-bit codes [..., 8] -> 12 bytes [..., 12]."""
    sc = sc.astype(np.uint8)
    mn = mn.astype(np.uint8)
    lo = sc[..., :4] | ((sc[..., 4:] >> 4) << 6)
    mid = mn[..., :4] | ((mn[..., 4:] >> 4) << 6)
    hi = (sc[..., 4:] & 15) | ((mn[..., 4:] & 15) << 4)
    return np.concatenate([lo, mid, hi], axis=-1)


def unpack_q4_k(blocks: np.ndarray):
    """Q4_K blocks [..., 144] -> ``(d, dmin, scales, mins, q)``: d, dmin float32 [...];
    scales, mins u8 [..., 8]; q u8 [..., 256] (codes 0..15 in weight order)."""
    d, dmin = _f16_at(blocks, 0), _f16_at(blocks, 2)
    sc, mn = q4_k_scale_min_codes(blocks[..., 4:16])
    qs = blocks[..., 16:].reshape(*blocks.shape[:-1], 4, 1, 32)
    # Low nibble then high nibble of each 32-byte run: weights 64c+l and 64c+32+l.
    q = (qs >> np.array([0, 4], np.uint8).reshape(2, 1)) & 15
    return d, dmin, sc, mn, q.reshape(*blocks.shape[:-1], QK_K)


def dequantize_q4_k(blocks: np.ndarray) -> np.ndarray:
    """Q4_K blocks [..., 144] -> float32 [..., 256], ``(d*sc)*q - dmin*m`` as ggml rounds it."""
    d, dmin, sc, mn, q = unpack_q4_k(blocks)
    ds = (d[..., None] * sc.astype(np.float32))[..., None]  # [..., 8, 1]
    dm = (dmin[..., None] * mn.astype(np.float32))[..., None]
    y = ds * q.reshape(*q.shape[:-1], 8, _Q4_SUB).astype(np.float32) - dm
    return y.reshape(q.shape)


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

    iscale = f32(_Q4_NMAX) / span
    scale = f32(1) / iscale
    L = np.clip(_rint(iscale * (x - xmin)), 0, _Q4_NMAX)
    Lf = L.astype(f32)
    diff = scale * Lf + xmin - x
    best = _sum(wt * (diff * diff))
    best_min = xmin

    for step in range(_Q4_NSTEP + 1):
        # As in ggml, the grid is laid from the best offset found so far, not the
        # sub-block minimum: an improvement moves every later step's grid.
        span = xmax - best_min
        span = np.where(flat | (span <= 0), f32(1), span)  # guard only; never seen
        iscale = (_Q4_RMIN + _Q4_RDELTA * f32(step) + f32(_Q4_NMAX)) / span
        la = np.clip(_rint(iscale * (x - best_min)), 0, _Q4_NMAX).astype(f32)
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


def quantize_q4_k(xb: np.ndarray) -> np.ndarray:
    """Finite float32 blocks [B, 256] -> Q4_K u8 [B, 144], as quantize_row_q4_K_ref."""
    f32 = np.float32
    B = xb.shape[0]
    nsub = QK_K // _Q4_SUB
    # Position-major [32, B*8] so reductions over a sub-block run sequentially.
    x = np.ascontiguousarray(xb.reshape(B * nsub, _Q4_SUB).T)

    # ggml's weighting: RMS of the sub-block plus |x|, favouring large weights.
    av_x = np.sqrt(_sum(x * x) / f32(_Q4_SUB))
    wt = av_x + np.abs(x)
    scales, mins, L = _make_qkx2(x, wt)
    scales = scales.reshape(B, nsub)
    mins = mins.reshape(B, nsub)

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
    out = np.empty((B, Q4_K_BYTES), np.uint8)
    out[:, 0:2] = d16.reshape(B, 1).view(np.uint8)
    out[:, 2:4] = dmin16.reshape(B, 1).view(np.uint8)
    out[:, 4:16] = q4_k_pack_scale_min(sc, mn)
    out[:, 16:] = qs.reshape(B, 128)
    return out


# --- Q6_K ------------------------------------------------------------------------------------

def unpack_q6_k(blocks: np.ndarray):
    """Q6_K blocks [..., 210] -> ``(d, scales, codes)``: d float32 [...], scales int8 [..., 16],
    codes u8 [..., 256] (0..63 in weight order; the weight is ``d * scale * (code - 32)``)."""
    lead = blocks.shape[:-1]
    ql = blocks[..., 0:128].reshape(*lead, 2, 1, 2, 32)  # [half, ., ql run (s % 2), l]
    qh = blocks[..., 128:192].reshape(*lead, 2, 1, 32)  # [half, ., l]
    # Quarters s = 0..3 of a half: nibble s // 2 of ql run s % 2, bits 2s..2s+1 of qh.
    low = (ql >> np.array([0, 4], np.uint8).reshape(2, 1, 1)) & 15  # [half, s // 2, s % 2, l]
    high = (qh >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)) & 3  # [half, s, l]
    codes = low.reshape(*lead, 2, 4, 32) | (high << 4)
    scales = blocks[..., 192:208].view(np.int8)
    return _f16_at(blocks, 208), scales, codes.reshape(*lead, QK_K)


def dequantize_q6_k(blocks: np.ndarray) -> np.ndarray:
    """Q6_K blocks [..., 210] -> float32 [..., 256], ``(d*scale)*q`` as ggml rounds it."""
    d, scales, codes = unpack_q6_k(blocks)
    ds = (d[..., None] * scales.astype(np.float32))[..., None]  # [..., 16, 1]
    q = codes.reshape(*codes.shape[:-1], 16, _Q6_SUB).astype(np.float32) - np.float32(32)
    return (ds * q).reshape(codes.shape)


def _make_qx(x: np.ndarray):
    """make_qx_quants(nmax=32, rmse_type=1) over many sub-blocks at once.

    x: float32 [16, S] (weight position first). Returns (signed scale [S], codes u8 [16, S]
    as l + 32). The scale's sign puts the largest-magnitude weight at code -32, the end
    of the grid with the extra step.
    """
    f32 = np.float32
    picked = np.abs(x).argmax(axis=0)  # first of equal magnitudes, as ggml's strict >
    xmax = np.take_along_axis(x, picked[None, :], axis=0)[0]
    zero = np.abs(xmax) < _GROUP_MAX_EPS
    xmax = np.where(zero, f32(1), xmax)
    weight = x * x  # rmse_type 1: weight each position by x^2

    def fit(iscale):
        l = np.clip(_rint(iscale * x), -_Q6_NMAX, _Q6_NMAX - 1).astype(f32)
        sum_lx = _sum(weight * x * l)
        sum_l2 = _sum(weight * l * l)
        return l, sum_lx, sum_l2

    L, sum_lx, sum_l2 = fit(f32(-_Q6_NMAX) / xmax)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(sum_l2 != 0, sum_lx / sum_l2, f32(0))
    best = scale * sum_lx
    for step in _Q6_STEPS:
        l, sum_lx, sum_l2 = fit(-(f32(_Q6_NMAX) + f32(0.1) * f32(step)) / xmax)
        better = (sum_l2 > 0) & (sum_lx * sum_lx > best * sum_l2)
        with np.errstate(divide="ignore", invalid="ignore"):
            this_scale = sum_lx / sum_l2
        L = np.where(better, l, L)
        scale = np.where(better, this_scale, scale)
        best = np.where(better, this_scale * sum_lx, best)
    codes = np.where(zero, f32(0), L + f32(_Q6_NMAX)).astype(np.uint8)
    return np.where(zero, f32(0), scale).astype(f32), codes


def quantize_q6_k(xb: np.ndarray) -> np.ndarray:
    """Finite float32 blocks [B, 256] -> Q6_K u8 [B, 210], as quantize_row_q6_K_ref."""
    f32 = np.float32
    B = xb.shape[0]
    nsub = QK_K // _Q6_SUB
    x = np.ascontiguousarray(xb.reshape(B * nsub, _Q6_SUB).T)  # [16, B*16]
    scales, L = _make_qx(x)
    scales = scales.reshape(B, nsub)

    # The sub-block scale of largest magnitude, sign kept, becomes code -128 (the int8 end
    # with the extra step), as the weights' largest magnitude became code -32.
    picked = np.abs(scales).argmax(axis=1)
    max_scale = np.take_along_axis(scales, picked[:, None], axis=1)[:, 0]
    empty = np.abs(max_scale) < _GROUP_MAX_EPS
    iscale = f32(-128) / np.where(empty, f32(1), max_scale)
    d16 = np.where(empty, f32(0), f32(1) / iscale).astype(np.float16)
    sc = np.clip(_rint(iscale[:, None] * scales), -128, 127)
    sc = np.where(empty[:, None], 0, sc).astype(np.int8)

    # Requantise against the f16 super-scale times the 8-bit scale, as dequantisation sees it.
    d_eff = (d16.astype(f32)[:, None] * sc.astype(f32)).reshape(1, -1)  # [1, B*16]
    live = d_eff != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        requant = np.clip(_rint(x / np.where(live, d_eff, f32(1))), -_Q6_NMAX, _Q6_NMAX - 1) + _Q6_NMAX
    # ggml skips sub-blocks whose effective scale is 0 and keeps their first-pass codes.
    codes = np.where(live, requant, L).astype(np.uint8)
    codes = codes.T.reshape(B, 2, 4, 32)  # [block, half, quarter s, l]
    codes = np.where(empty[:, None, None, None], 0, codes).astype(np.uint8)

    low, high = codes & 15, codes >> 4
    ql = low[:, :, 0:2] | (low[:, :, 2:4] << 4)  # run s % 2 holds quarter s (low) and s + 2 (high)
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
    out = np.empty((B, Q6_K_BYTES), np.uint8)
    out[:, 0:128] = ql.reshape(B, 128)
    out[:, 128:192] = qh.reshape(B, 64)
    out[:, 192:208] = sc.view(np.uint8)
    out[:, 208:210] = d16.reshape(B, 1).view(np.uint8)
    return out
