#!/usr/bin/env bash
# Parameters and training FLOPs per token of a 124M-class model of each mixer (12 layers of width 768, GPT-2
# vocabulary; attn: 12 heads of 64; the recurrent mixers: 6 heads of dk = dv = 128; kalman: the LM preset, mamba,
# expand 1, N = 32), at T = 1024. Both numbers come from train_kla's own run table: the parameter layout, and the
# FLOP count of model.h (model_flops_per_token: 6 per matmul weight plus each mixer core's forward and backward
# from its spec), the same count the trainers' MFU uses.
# Usage: bash scripts/model_table.sh (needs the demo data: each model runs one step of B=1 on the CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
C=768; L=12; T=1024
printf "| mixer | parameters | training GFLOP per token | of which the mixer cores |\n|---|---|---|---|\n"
for m in attn gdn kaczmarz pdn pgdn pkda gka kalman; do
    extra=()
    [ "$m" = kalman ] && extra=(--kalman-preset mamba --kalman-n 32 --mlp none)
    table=$(./train_kla --mixer "$m" --depth $L --width $C --heads 12 "${extra[@]}" -b 1 -t $T -x 1 -v 0 -m 1 -g 0 --max-seq-len $T)
    echo "$table" | awk -F'|' -v m="$m" -v extra="${extra[*]:-}" '
        / parameters / { gsub(/ /, "", $3); p = $3 }
        / train FLOPs per token / { split($3, a, /[ ,]+/); total = a[2]; cores = a[5] }
        END { printf "| `%s`%s | %.1fM | %.3f | %.3f |\n", m, extra != "" ? " (" extra ")" : "", p / 1e6, total / 1e9, cores / 1e9 }'
done
