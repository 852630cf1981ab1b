#!/usr/bin/env bash
# An alternative second call of a lease (instead of profile.sh, when run.sh's figures matter more
# than a diagnosis): `ptxgen bench --tune` sweeps of the knobs issue 12's kernels expose, each
# variant checked on the GPU and timed beside the spec's config, ranked back to back (batched,
# with PDL as the specs build them), the fastest printed as a spec entry to make the default.
# Why: the defaults come from hand-picked variants on two cards, and the model (`ptxgen show`, which
# takes the same --tune to price each variant) cannot price CTA size, the launch gap PDL hides, or
# L1/L2 hints. On the H200 of 2026-11-28 (bench/results/H200-2026-11-28-lease) 4096x4096 ran 1.18x
# faster in 8-warp CTAs than the default 32 while the model ranked it 0.93x; 12288x4096's other
# rows/unroll/L1 choices all lost (0.74-0.92x), and decode attention's splits and tile width and
# the ping-pong prefill's stages moved it by 5% at most. So now:
#   - CTA size (warps 8, 16, 32 at the same rows a warp) at the other GEMV shapes: 12288x4096
#     (3 rows a warp), 4096x12288 (6 steps a row) and the fused norm + q projection (4096x4096);
#   - decode attention at 4k and 8k keys: the keys of its chunk a CTA requests into L2 before its
#     PDL wait (kv_prefetch_keys: 128 is a whole 4k-key chunk, 256 an 8k one) and ring stages.
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

tune 45 bench/lease/decode.toml gemv_12288x4096 --tune warps=8,16,32
tune 45 bench/lease/decode.toml gemv_4096x12288 --tune warps=8,16,32
tune 45 bench/lease/decode.toml attn_norm_q_proj --tune warps=8,16,32
tune 60 bench/lease/attention.toml decode_attention --set seq_len=4096,8192 --tune kv_prefetch_keys=0,128,256 \
    --tune stages=2,3
echo "== done after $(( SECONDS - START )) s"
