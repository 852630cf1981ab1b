#!/usr/bin/env bash
# The lease's second call, if device time is left after run.sh (same machine, still warm: its
# /tmp/site install is reused): first Nsight Compute on one launch each of the sm_90a prefill
# kernels issue 13 is about, at 4096 tokens (the default, tma, ping-pong), on the 12288x4096 GEMV,
# and the tma prefill's SASS with its stall samples (short steps, ~40 s together). Why: on
# 2026-11-27 the sm_90a prefill ran 454 TFLOP/s at 4k and FlashAttention-3's register split with
# overlap 453, and nothing measured says what the tensor cores wait on (pipe utilisation, warp
# stalls and where they sit in the SASS). Then where the 36-layer decoder's step goes, phase by
# phase (bench/lease/decoder_timeline.py: the default, then with head_prep "attention",
# barrier_acquire, kv_prefetch_keys and attention_stages = 3, together and alone, poller_prefetch
# and barrier_prefetch: on 2026-11-28 the attention phase ran 1621 GB/s and qkv 1933, against
# gate_up's 3975, and the barriers before GEMV phases took 2.1-2.5 us each), decode attention and
# the Q4_K GEMVs CTA by CTA, alone and back to back (bench/lease/attention_timeline.py,
# gemv_timeline.py). Each step has its own cap within BUDGET, so a slow one costs only itself; at
# 2026-11-28's pace (ncu ~45 s for the five) all fit in BUDGET=200, and at 180 the GEMV timeline is cut.
#
#   device run, carry [".whl"], command "BUDGET=200 bash bench/lease/profile.sh", timeout_s 220
# (only if `status` leaves 240 s or more, else BUDGET=180; each profile is a Python start and ~40 ncu passes).
set -uo pipefail
source "$(dirname "$0")/common.sh"
lease profile_log.txt 180
installed || exit 1
# --clock-control none: the card's clocks as found (the device README: leave them alone; ncu's
# default locks them to base, 1.31 GHz on the H200 of 2026-11-28).
SECTIONS=(--clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats
          --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
          --section InstructionStats --section SourceCounters)

# profile SPEC KERNEL SCALAR=VALUE...: ncu on one launch of KERNEL, its report in $OUT/ncu_KERNEL.txt.
profile() {
    local spec=$1 name=$2
    shift 2
    step "ncu $name $*" 30 bash -c 'report=$1; shift; "$@" > "$report" 2>&1' - "$OUT/ncu_${name}.txt" \
        ncu "${SECTIONS[@]}" -k regex:"^${name}\$" -c 1 python3 bench/lease/one_launch.py "$spec" "$name" "$@"
}

# Nsight Compute first: five short steps (6-8 s each on 2026-11-28) that the timelines, ~150 s
# together, would otherwise crowd out of a 180 s budget.
profile bench/lease/prefill_sm90a.toml prefill_sm90a seq_len=4096
profile bench/lease/prefill_sm90a.toml prefill_sm90a_tma seq_len=4096
profile bench/lease/prefill_sm90a.toml prefill_sm90a_pingpong seq_len=4096
profile bench/lease/decode.toml gemv_12288x4096
# Where the tma prefill's warps stall, instruction by instruction (SASS with its warp-state samples,
# CSV): whether the consumers wait on a full barrier (their tiles late), on wgmma.wait_group, or on
# their softmax. Eight files come back from a call: this one, the three ncu reports above, the
# gemv's, two timelines and the log (prefill_mma's report of 2026-11-28 stands for its unchanged PTX).
step "ncu source prefill_sm90a_tma" 40 bash -c 'report=$1; shift; "$@" > "$report" 2>&1' - \
    "$OUT/ncu_source_prefill_sm90a_tma.csv" ncu --clock-control none --section SourceCounters --section WarpStateStats \
    --page source --print-source sass --csv -k regex:'^prefill_sm90a_tma$' -c 1 \
    python3 bench/lease/one_launch.py bench/lease/prefill_sm90a.toml prefill_sm90a_tma seq_len=4096
# The default first (where the step's time goes), then the four changes together, then each
# alone: the heads made in the attention phase (does qkv stream like o, what does attention
# pay?), the barrier without fences and the polling warp's first task sent to L2 (which of them,
# if either, brings the barriers before GEMV phases down to the 1.17 us of the one before
# attention?), the attention ring 3 stages deep and its K/V requested into L2 under phase A (does
# attention speed up, does qkv slow down?), each GEMV phase's next tasks requested at its barrier: the JSON is rewritten after each (~10 s a
# decoder, 35 s for the first two on 2026-11-28: ~95 s for eight), so a cut keeps the first.
step "decoder timeline" 90 python3 bench/lease/decoder_timeline.py bench/lease/decoder.toml qwen3_8b_decoder \
    qwen3_8b_decoder_combined qwen3_8b_decoder_head_prep qwen3_8b_decoder_barrier_acquire \
    qwen3_8b_decoder_poller_prefetch qwen3_8b_decoder_stages3 qwen3_8b_decoder_kv_prefetch \
    qwen3_8b_decoder_barrier_prefetch --pos 4095 --json "$OUT/decoder_timeline.json"
# Decode attention the same way, CTA by CTA: where its fixed cost goes (the launch ramp, the PDL
# wait, the splits, the count-in and merge after the last one), with and without PDL.
step "attention timeline" 35 python3 bench/lease/attention_timeline.py bench/lease/attention.toml decode_attention \
    decode_attention_no_pdl --seq-len 4096 8192 32768 --json "$OUT/attention_timeline.json"
# The Q4_K GEMVs the same way, alone and back to back: where their ~3 us a launch beyond the bytes
# goes (the PDL wait, x's staging, the rows, the CTAs' and warps' tails), at the issue's shapes.
# Its figures go to the log only: a call brings back eight files, and the list above has them.
step "gemv timeline" 25 python3 bench/lease/gemv_timeline.py bench/lease/decode.toml gemv_12288x4096 \
    gemv_4096x4096 gemv_4096x4096_warps8 ffn_norm_gate_up_group
echo "== done after $(( SECONDS - START )) s"
