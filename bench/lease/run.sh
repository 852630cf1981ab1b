#!/usr/bin/env bash
# One lent GPU, one call: what issues 12 and 13 still need measured, most important first. A task
# that draws a GPU gets 15 minutes of device time, a call at most 10, so every step runs under
# its own time limit within BUDGET seconds (an overrun costs that step only) and the whole log
# and each step's JSON land in $OUT (the device tool's folder; bench/lease/out elsewhere).
#
#   here, once (no GPU needed):  bash bench/lease/run.sh --fetch-wheels
#       cp312 wheels of what the GPU image lacks (pydantic & co, gguf, ptxas) into .whl/ (git-ignored)
#   on the GPU:                  device run, carry [".whl"], command "bash bench/lease/run.sh"
#
# Steps: install; Q4_K GEMVs (each CTA's rows requested into L2 before its PDL wait, 8-warp CTAs
# at 4096x4096 plain and with the fused norm, the defaults, 4096x4096 without PDL), the fused
# gate|up group and the Q6_K lm_head (bench/lease/decode.toml); the smallest decode kernels, for
# the card's launch cost per run and batched (launch.toml); decode attention at 4k/8k/32k keys
# with PDL and without, and with its K/V requested into L2 first (attention.toml); the 36-layer
# decoder (decoder.toml): the default, with its attention's K/V requested into L2 under phase A,
# with its GEMV tasks requested at the barriers, with its q/k heads made in the attention phase,
# with its grid barriers fenceless, with its polling warp's first GEMV task sent to L2, with a
# 3-stage attention ring, four of them together, and a 4-stage ring, each also as separate
# kernels; the step at pos 4095 with the lm_head (Q6_K, Q4_K) and without (whole_model.py); prefill with
# mma.sync (against torch SDPA; 128- and 64-row CTAs, each also splitting the heaviest blocks'
# keys up to 1k tokens) at 1k/4k and wgmma (sm_90a; tensor-map copies, ping-pong, persistent) at
# 1k/4k/8k; `pytest -m gpu` with what is left. `make bench` (every kernel, peers, whole-model
# decode) needs a call of its own.
# Afterwards: the log has each spec's variants against the rows they vary
# (bench.variant_comparisons; a verdict where a figure moved by more than 5%); copy $OUT under
# bench/results/ and run bench/model_check.py on the JSON files (launch.json with the others: it
# gives the card's launch cost).
set -uo pipefail
cd "$(dirname "$0")/../.."

# nvidia-cuda-nvcc: its ptxas assembles the Hopper prefill's setmaxnreg PTX whole (ptxgen/assemble.py).
WHEELS=(pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 gguf==0.19.0
        typing_extensions==4.16.0 nvidia-cuda-nvcc==13.5.37)
if [[ "${1:-}" == "--fetch-wheels" ]]; then
    exec python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl "${WHEELS[@]}"
fi

source bench/lease/common.sh
lease log.txt 560

echo "== $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv || true
installed || exit 1
# Peers once per kind, shapes and scalars: the specs' rows are variants of a few kernels (decode.toml's
# 9 rows are 5 shapes), and each peer set costs its own weight conversions and timings.
BENCH=(python3 -m ptxgen.cli bench --peers once)
step "decode GEMVs" 150 "${BENCH[@]}" --spec bench/lease/decode.toml --graph --json "$OUT/decode.json"
# The card's launch cost, per run and batched (model_check judges every row with it).
step "launch cost" 40 "${BENCH[@]}" --spec bench/lease/launch.toml --json "$OUT/launch.json"
step "decode attention" 120 "${BENCH[@]}" --spec bench/lease/attention.toml --set seq_len=4096,8192,32768 \
    --json "$OUT/attention.json"
# Issue 12's step before issue 13's prefill: its nine rows (~45 s each with their separate kernels on
# 2026-11-28, less now that rows of one shape share their sample inputs, bench.row_inputs, and
# with --peers once only the first times the separate kernels, every row still checked against
# them) are what this lease adds most to answer. At most 200 s, so that the prefills keep their
# time: the rows come most wanted first, and a cut keeps the JSON of those it made.
step "36-layer decoder" 200 "${BENCH[@]}" --spec bench/lease/decoder.toml --graph --json "$OUT/decoder.json"
# Issue 12's step with the lm_head, never measured (cut by the budget in every lease so far): the
# step at pos 4095 with the head and without, fused (with the Q4_K_M file's Q6_K lm_head, then with
# the Q4_K one issue 12 names) and as separate kernels (last: decoder.json times them too), and
# tokens/s from an empty cache (whole_model.py: Qwen3-8B shapes, random Q4_K_M-like weights, every
# layer alike, so that making them takes seconds, not the minutes of 36 distinct layers).
step "whole-model decode" 60 python3 bench/lease/whole_model.py --json "$OUT/whole_model.json"
# Each prefill at the lengths its targets name (mma.sync: 1k and 4k; wgmma: 4k and 8k), wgmma at 1k
# too (never timed there since 2026-11-27's 208 TFLOP/s; its persistent variants, untimed at 1k,
# deal the 1k blocks within 3% of an even spread: is the mma.sync target better met there?).
step "prefill" 90 "${BENCH[@]}" --spec bench/lease/prefill.toml --set seq_len=1024,4096 --json "$OUT/prefill.json"
step "prefill_sm90a" 150 "${BENCH[@]}" --spec bench/lease/prefill_sm90a.toml --set seq_len=1024,4096,8192 \
    --json "$OUT/prefill_sm90a.json"
# Four workers (the GPU machine has 16 cores; pytest-xdist is in its image): one process passed only
# ~100 and ~106 of the GPU tests in the 150 s of the 2026-11-27 and 2026-11-28 leases.
step "pytest -m gpu" 150 python3 -m pytest -m gpu -q -n 4 -p no:cacheprovider
echo "== done after $(( SECONDS - START )) s"
# Nsight Compute on the prefill kernels and the 12288x4096 GEMV: bench/lease/profile.sh, a second
# call if device time is left (run on 2026-11-27 and 2026-11-28). Done once, on the H100 of 2026-11-27
# (bench/results/H100-2026-11-27-lease), and left out since: why the 36-layer decoder parts from its separate kernels (depth, not races; bench.SPREAD_MULTIPLE):
#   python3 bench/lease/decoder_depth.py
