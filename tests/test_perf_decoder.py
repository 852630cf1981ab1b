"""The performance model of the persistent decoder: its serial steps (grid barriers, each layer's
split-KV count-in: PersistentDecoder.dependent_tail) worked out by hand, and the counts of a
decoder too large to interpret extrapolated from one and two layers (model_scaling,
Count.extrapolated), checked against the counts of a decoder the interpreter runs whole."""

from __future__ import annotations

import pytest

from ptxgen import perf
from ptxgen.generate import more_bits
from ptxgen.kernels import kind_of, persistent_decoder
from ptxgen.kernels.base import DependentTail, TailStep
from ptxgen.pipeline import compile_kernel

from helpers import make_config
from test_persistent_decoder import MIXED_THREE_LAYERS, QWEN3_8B, TINY

GPU = perf.gpu_named("h100-sxm")


def test_serial_steps_of_a_decode_step():
    """Qwen3-8B at pos 4095: 5 x 36 - 1 = 179 barriers of 2 round trips; before the 143 of them
    that precede a GEMV phase (all but attention's, and no wait before the first layer's A) all
    1056 warps have 4 row-steps of Q4_K weights (8 blocks of 144 bytes each) in flight; per layer
    the count-in's release and atomic and the merge's partial loads (16 splits at 4096 keys,
    read in one round)."""
    kind = kind_of(make_config("persistent_decoder", name="pd", **QWEN3_8B))
    tail = kind.dependent_tail({"pos": 4095})
    _, splits = kind.attention.split(4096)
    merge_rounds = -(-splits // (kind.attention.splits_per_round * kind.attention.split_lanes))
    assert tail.round_trips == 2 * 179 + 36 * (1 + 1 + merge_rounds)
    early = 132 * 8 * 4 * 8 * 144
    assert [(step.round_trips, step.overlapped_bytes) for step in tail.steps[:5]] == [
        (2 * 36, 0), (2 * 35, 35 * early), (2 * 36, 36 * early), (2 * 36, 36 * early), (2 * 36, 36 * early)]
    assert not tail.counted_by_every_warp, "one thread's atomics: nothing taken out of the mean warp's rounds"
    # Each barrier streams its round trips' worth of those bytes (4.9 MB would take 1.6 us).
    assert perf.tail_streamed_us(tail, GPU) == pytest.approx(143 * 2 * GPU.latency_ns * 1e-3)
    one = kind_of(make_config("persistent_decoder", name="pd", **{**QWEN3_8B, "num_layers": 1})).dependent_tail({"pos": 0})
    assert one.round_trips == 2 * 4, "one key: a lone split, no count-in; the last layer's final barrier is skipped"


def test_a_tail_streams_what_is_in_flight_up_to_its_round_trips():
    """Bytes in flight through a step count against its round trips' time, never more."""
    few = TailStep("a barrier with 1 MB in flight", 2, every_cta=True, returns_value=False, overlapped_bytes=10**6)
    many = TailStep("a barrier with 10 MB in flight", 2, every_cta=True, returns_value=False, overlapped_bytes=10**7)
    tail = DependentTail((few, many), group_ctas=1)
    assert perf.tail_streamed_us(tail, GPU) == pytest.approx(10**6 / (GPU.bandwidth_gbs * 1e3) + 2 * GPU.latency_ns * 1e-3)


def test_model_scaling_counts_one_layer_and_each_kind_of_later_layer():
    layers = QWEN3_8B["num_layers"]
    q4_k_m = tuple("q6_k" if more_bits(layer, layers) else "q4_k" for layer in range(layers))
    kind = kind_of(make_config("persistent_decoder", name="pd", **QWEN3_8B, weight_quants={"wv": q4_k_m,
                                                                                          "w_down": q4_k_m}))
    scaling = kind.model_scaling()
    assert scaling.base.num_layers == 1 and scaling.base.weight_quants["wv"] == ("q6_k",)
    assert [(config.num_layers, config.weight_quants["wv"], times) for config, times in scaling.steps] == [
        (2, ("q6_k", "q6_k"), q4_k_m[1:].count("q6_k")), (2, ("q6_k", "q4_k"), q4_k_m[1:].count("q4_k"))]
    assert kind_of(make_config("persistent_decoder", name="pd", **TINY, num_layers=3)).model_scaling() is None


@pytest.mark.parametrize("weight_quants", [{}, MIXED_THREE_LAYERS], ids=("q4_k", "mixed"))
def test_extrapolated_counts_match_the_whole_launch(monkeypatch, weight_quants):
    """A three-layer decoder counted whole and from its first layer plus one two-layer config a
    kind of later layer: the same instructions and rounds (to 1%), bytes in flight, tail (to 5%)."""
    config = make_config("persistent_decoder", name="pd", **TINY, num_layers=3, weight_quants=weight_quants)
    compiled = compile_kernel(config, ("sm_90",))
    whole = perf.evaluate_kernel(compiled, GPU)
    monkeypatch.setattr(persistent_decoder, "MAX_VERIFY_WEIGHTS", 0)
    scaled = perf.evaluate_kernel(compiled, GPU)
    assert scaled["counted"].startswith("1 layer and") and whole["counted"].startswith("all")
    for key in ("thread_instructions", "warp_instructions", "rounds_per_warp"):
        assert scaled[key] == pytest.approx(whole[key], rel=0.01), key
    assert scaled["bytes_in_flight"] == whole["bytes_in_flight"]
    # The tail's serial instructions are the slowest warp's excess, which a layer need not add
    # the same way each time: within 5%.
    assert scaled["tail_time_us"] == pytest.approx(whole["tail_time_us"], rel=0.05)


def test_count_extrapolation_by_hand():
    """A decoder's layers add everything, the slowest warp's excess included; a GEMV's queued
    units (dealt) keep the last step's excess over the mean, and its totals scale to its CTAs."""
    from ptxgen.kernels.base import ModelScaling

    base = perf.Count(100, 10, 2.0, 3, 48, 5.0, 6, 4, 4)
    later = perf.Count(150, 15, 3.5, 5, 40, 7.0, 9, 4, 4)
    total = base.extrapolated([(later, 3)], ModelScaling(None, (), "note"))
    assert (total.thread_instructions, total.warp_instructions, total.rounds_per_warp, total.critical_rounds,
            total.instructions_per_warp, total.critical_instructions) == (250, 25, 6.5, 9, 11.0, 15)
    assert total.outstanding_bytes == 48 and total.counted == "note"
    dealt = base.extrapolated([(later, 2.5)], ModelScaling(None, (), "dealt", cta_scale=10, dealt=True))
    assert (dealt.thread_instructions, dealt.warp_instructions, dealt.rounds_per_warp, dealt.critical_rounds,
            dealt.instructions_per_warp, dealt.critical_instructions) == (2250, 225, 5.75, 7, 10.0, 12)
    assert dealt.outstanding_bytes == 40 and dealt.counted == "dealt"
