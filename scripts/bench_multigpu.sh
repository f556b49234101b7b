#!/usr/bin/env bash
# bench_multigpu.sh: data-parallel scaling of train_klacu (not a test; README "Multi-GPU"). The 124M-class models
# of scripts/bench_gpu.sh (12 layers, width 768; attn: 12 heads; gdn: 6 heads of dk = dv = 128) at B=16, T=1024 per
# GPU, on 1, 2, ... up to the GPUs of the machine (at most 8; the powers of two), 30 steps timed over the last 20.
# Scaling efficiency = tok/s on N GPUs / (N x tok/s on 1 GPU), measured in the same run on the same machine.
# Usage: bash scripts/bench_multigpu.sh [train_klacu binary, default ./train_klacu]
#   BENCH_MODELS="attn gdn"  BENCH_ZERO=0|1 (-z)  BENCH_RUN_TIMEOUT=S (default 300)
# Prints a markdown table (and writes it to $OUT/bench_multigpu.md when $OUT is set); the logs of the runs go to
# $OUT/bench_multigpu_logs or a temporary folder. Exit code 1 if a run failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
bin=${1:-./train_klacu}
MODELS=(${BENCH_MODELS:-attn gdn})
ZERO=${BENCH_ZERO:-0}
RUN_TIMEOUT=${BENCH_RUN_TIMEOUT:-300}
B=16; T=1024; STEPS=30; WARMUP=10
gpus=$(nvidia-smi -L 2> /dev/null | wc -l)
[ "$gpus" -ge 1 ] || { echo "bench_multigpu: no GPU" >&2; exit 1; }
counts=(); for n in 1 2 4 8; do [ "$n" -le "$gpus" ] && counts+=("$n"); done
if [ -n "${OUT:-}" ]; then logs=$OUT/bench_multigpu_logs; mkdir -p "$logs"; else logs=$(mktemp -d); trap 'rm -rf "$logs"' EXIT; fi
failures=0
declare -A tok ms
for M in "${MODELS[@]}"; do
    for n in "${counts[@]}"; do
        log=$logs/${M}_gpus$n.log
        echo "[bench_multigpu] $M:12 on $n GPU(s)" >&2
        timeout "$RUN_TIMEOUT" bash scripts/launch.sh "$n" "$bin" -b $B -t $T -d $((B * T * n)) -x $STEPS -v 0 -m 1 -g 0 -u $WARMUP \
            -z "$ZERO" --depth 12 --width 768 --heads 12 --lin-heads 6 --dk 128 --dv 128 --max-seq-len $T --mixer "$M:12" > "$log" 2>&1
        line=$(grep 'summary | ms/step' "$log" | tail -n 1)
        if [ -z "$line" ]; then
            echo "[bench_multigpu] FAILED $M on $n GPU(s):" >&2; tail -n 5 "$log" >&2
            failures=$((failures + 1)); continue
        fi
        ms[$M/$n]=$(echo "$line" | sed 's/.*ms\/step \([0-9.]*\).*/\1/')
        tok[$M/$n]=$(echo "$line" | sed 's/.*tok\/s \([0-9]*\).*/\1/')
    done
done
table() {
    echo "device: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1) x $gpus; $bin; ZeRO-1 $ZERO"
    echo
    echo "| model | GPUs | ms/step | tok/s | tok/s per GPU | scaling efficiency |"
    echo "|---|---|---|---|---|---|"
    for M in "${MODELS[@]}"; do
        for n in "${counts[@]}"; do
            t=${tok[$M/$n]:-}
            if [ -z "$t" ]; then echo "| \`$M:12\` | $n | FAILED | | | |"; continue; fi
            eff=""
            [ -n "${tok[$M/1]:-}" ] && eff=$(awk -v t="$t" -v o="${tok[$M/1]}" -v n="$n" 'BEGIN { printf "%.1f%%", 100 * t / (n * o) }')
            echo "| \`$M:12\` | $n | ${ms[$M/$n]} | $t | $((t / n)) | $eff |"
        done
    done
}
table | tee ${OUT:+"$OUT/bench_multigpu.md"}
[ $failures -eq 0 ]
