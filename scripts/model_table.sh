#!/usr/bin/env bash
# Parameters and training FLOPs per token of a 124M-class model of each mixer (12 layers of width 768, GPT-2
# vocabulary; attn: 12 heads of 64 at T = 1024; the recurrent mixers: 6 heads of dk = dv = 128, chunk 64; kalman:
# the LM preset, mamba, expand 1, N = 32). Parameter counts come from train_kla itself (its layout is the only
# source of truth); FLOPs are 6 per parameter per token (forward + backward of every matmul, the LM head included)
# plus each mixer's core, fwd + bwd, from its spec:
#   attn      6 C T per layer (llm.c's count, causal)
#   gdn/kaczmarz  H * (F_fwd + F_bwd), gdn spec 3.7: 181.6k + 507.9k per head at dk = dv = 128, BT = 64
#   pdn/pgdn/pkda H * (199,893 + 560,896), pdn spec 3.7 (dk = dv = 128, CH = 64)
#   gka       H * 4.72M, gka spec 6 (D = 128, BT = 64, r = 30)
#   kalman    ~72 flops per lane (15 forward + 57 backward incl. replay), lanes = Dk * N, kalman spec 3.6
# Usage: bash scripts/model_table.sh (needs the demo data for the one tiny step that prints the table).
set -euo pipefail
cd "$(dirname "$0")/.."
C=768; L=12; T=1024; H=6
core() {  # mixer core FLOPs per token per layer
    case "$1" in
        attn) echo $((6 * C * T)) ;;
        gdn|kaczmarz) echo $((H * (181589 + 507904))) ;;
        pdn|pgdn|pkda) echo $((H * (199893 + 560896))) ;;
        gka) echo $((H * 4720000)) ;;
        kalman) echo $((72 * C * 32)) ;;
    esac
}
printf "| mixer | parameters | training GFLOP per token | of which the mixer cores |\n|---|---|---|---|\n"
for m in attn gdn kaczmarz pdn pgdn pkda gka kalman; do
    extra=()
    [ "$m" = kalman ] && extra=(--kalman-preset mamba --kalman-n 32 --mlp none)
    params=$(./train_kla --mixer "$m:$L" --width $C --heads 12 "${extra[@]}" -b 1 -t 8 -x 1 -v 0 -m 1 -g 0 --max-seq-len $T |
             awk -F'|' '/ parameters / { gsub(/ /, "", $3); print $3 }')
    cores=$((L * $(core "$m")))
    awk -v m="$m" -v p="$params" -v c="$cores" -v extra="${extra[*]:-}" 'BEGIN {
        printf "| `%s`%s | %.1fM | %.3f | %.3f |\n", m, extra != "" ? " (" extra ")" : "", p / 1e6, (6 * p + c) / 1e9, c / 1e9 }'
done
