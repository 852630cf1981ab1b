#!/usr/bin/env bash
# An alternative second call of a lease (instead of profile.sh, when run.sh's figures matter more
# than a diagnosis): `ptxgen bench --tune` sweeps of the knobs issue 12's kernels expose, each
# variant checked on the GPU and timed beside the spec's config, ranked back to back (batched,
# with PDL as the specs build them), the fastest printed as a spec entry to make the default.
# Why: the defaults come from one H100 run (2026-11-27) of a few hand-picked variants, and the
# model (`ptxgen show`, which takes the same --tune to price each variant) cannot price the launch
# gap PDL may hide nor what L1/L2 hints do, and puts these variants within ~10% of each other.
#   - the 12288x4096 GEMV: rows a warp (CTAs of the grid: 384 or 128, waves 2.9 or 0.97 at one an
#     SM), row-steps in flight (bytes in flight, registers), loads that skip L1;
#   - 4096x4096 (128 CTAs by default: one wave, one dependent round): CTA size against rows a warp;
#   - decode attention at 4k and 8k keys: splits (CTAs an SM in the split rule) and keys a ring stage;
#   - the sm_90a prefill with the ping-pong split at 4k: ring stages and key-tile width.
#
#   device run, carry [".whl"], command "bash bench/lease/tune.sh", timeout_s 230
set -uo pipefail
source "$(dirname "$0")/common.sh"
lease tune_log.txt 200
installed || exit 1

# tune SECONDS SPEC KERNEL OPTION...: bench KERNEL's --tune variants into $OUT/tune_KERNEL.json.
tune() {
    local cap=$1 spec=$2 name=$3
    shift 3
    step "tune $name" "$cap" python3 -m ptxgen.cli bench "$name" --spec "$spec" --rank batch \
        --json "$OUT/tune_${name}.json" "$@"
}

tune 80 bench/lease/decode.toml gemv_12288x4096 --tune rows_per_warp=1,3 --tune unroll=2,4 \
    --tune l1_no_allocate=false,true
tune 50 bench/lease/decode.toml gemv_4096x4096 --tune rows_per_warp=1,2 --tune warps=8,16,32
tune 50 bench/lease/attention.toml decode_attention --set seq_len=4096,8192 --tune ctas_per_sm=1,4 \
    --tune tile_keys=none,128
tune 40 bench/lease/prefill_sm90a.toml prefill_sm90a_pingpong --set seq_len=4096 --tune sm90a.stages=2,3 \
    --tune sm90a.block_n=64,128
echo "== done after $(( SECONDS - START )) s"
