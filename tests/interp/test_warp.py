"""Warp-level collectives: shfl.sync with sub-warp widths, vote, redux, activemask."""
import numpy as np
import pytest

from interp_helpers import elementwise

N = 128
LANE = np.arange(N) % 32


def cuda_shuffle(values, mode, b, width):
    """Reference written from the CUDA __shfl*_sync definitions (not the PTX pseudo-code)."""
    out = values.copy()
    for t in range(N):
        lane, warp_base = t % 32, t - t % 32
        seg = lane & ~(width - 1)
        if mode == "idx":
            src = seg + (b % width)
        elif mode == "up":
            src = lane - b if lane - b >= seg else lane
        elif mode == "down":
            src = lane + b if lane + b < seg + width else lane
        else:
            src = lane ^ b if (lane ^ b) < seg + width else lane
        out[t] = values[warp_base + src]
    return out


@pytest.mark.parametrize("width", [32, 16, 8])
@pytest.mark.parametrize("mode,b", [("up", 1), ("up", 3), ("down", 1), ("down", 5), ("bfly", 4),
                                    ("bfly", 1), ("idx", 3), ("idx", 13)])
def test_shfl_matches_cuda_semantics(mode, b, width):
    c = ((32 - width) << 8) | (0 if mode == "up" else 0x1F)
    values = (np.arange(N, dtype=np.uint32) * 7 + 3)
    got, pred = elementwise(f"shfl.sync.{mode}.b32 %d|%p, %a, {b}, {c}, 0xffffffff; "
                            "selp.u32 %e, 1, 0, %p;", values, extra=True)
    want = cuda_shuffle(values, mode, b, width)
    assert np.array_equal(got, want)
    if mode in ("up", "down"):           # the predicate says whether the source lane was in range
        lane, seg = LANE, LANE & ~(width - 1)
        inside = (lane - b >= seg) if mode == "up" else (lane + b < seg + width)
        assert np.array_equal(pred.astype(bool), inside)


def test_shfl_register_operands_and_partial_mask():
    values = np.arange(N, dtype=np.uint32)
    # lanes 0..15 shuffle among themselves with mask 0xffff; others skip the instruction
    got = elementwise("mov.u32 %d, 999; mov.u32 %i, %laneid; setp.lt.u32 %p, %i, 16; "
                      "@%p shfl.sync.idx.b32 %d, %a, %b, 0x1f, 0xffff;", values,
                      np.full(N, 2, np.uint32))
    want = np.where(LANE < 16, values - LANE + 2, 999)
    assert np.array_equal(got, want)


def test_vote_and_ballot():
    a = np.zeros(N, np.uint32)
    a[[0, 5, 31, 40]] = 1
    a[64:96] = 1
    ballot = elementwise("setp.ne.u32 %p, %a, 0; vote.sync.ballot.b32 %d, %p, 0xffffffff;", a)
    assert ballot[0] == (1 | 1 << 5 | 1 << 31) and ballot[33] == 1 << 8
    assert ballot[64] == 0xFFFFFFFF and ballot[100] == 0
    for mode, per_warp in {"all": [0, 0, 1, 0], "any": [1, 1, 1, 0], "uni": [0, 0, 1, 1]}.items():
        got = elementwise(f"setp.ne.u32 %p, %a, 0; vote.sync.{mode}.pred %q, %p, 0xffffffff; "
                          "selp.u32 %d, 1, 0, %q;", a)
        assert list(got[::32]) == per_warp, mode
    inverted = elementwise("setp.ne.u32 %p, %a, 0; vote.sync.ballot.b32 %d, !%p, 0xffffffff;", a)
    assert inverted[64] == 0 and inverted[100] == 0xFFFFFFFF


def test_vote_counts_only_the_lanes_of_its_member_mask():
    """Each half-warp votes with its own member mask: the ballot holds that half's bits only, .all
    looks at that half only (lanes 16..31 vote false in warp 0)."""
    a = np.ones(N, np.uint32)
    a[16:32] = 0
    votes = ("mov.u32 %i, %laneid; setp.lt.u32 %q, %i, 16; selp.b32 %c, 0xffff, 0xffff0000, %q; "
             "setp.ne.u32 %p, %a, 0; ")
    ballot = elementwise(votes + "vote.sync.ballot.b32 %d, %p, %c;", a)
    assert ballot[0] == 0xFFFF and ballot[16] == 0 and ballot[32] == 0xFFFF and ballot[48] == 0xFFFF0000
    every = elementwise(votes + "vote.sync.all.pred %p, %p, %c; selp.u32 %d, 1, 0, %p;", a)
    assert list(every[::16]) == [1, 0] + [1] * 6


def test_redux_and_activemask():
    a = (np.arange(N, dtype=np.uint32) * 37) % 101
    for op, fn in {"add": np.sum, "min": np.min, "max": np.max}.items():
        got = elementwise(f"redux.sync.{op}.u32 %d, %a, 0xffffffff;", a)
        assert np.array_equal(got, np.repeat([fn(a[w * 32:(w + 1) * 32]) for w in range(4)], 32)), op
    got = elementwise("redux.sync.or.b32 %d, %a, 0xffffffff;", a)
    assert got[0] == np.bitwise_or.reduce(a[:32])
    got = elementwise("mov.u32 %i, %laneid; and.b32 %i, %i, 1; setp.eq.u32 %p, %i, 0; "
                      "mov.u32 %d, 0; @%p activemask.b32 %d;", a)
    assert got[0] == 0x55555555 and got[1] == 0
