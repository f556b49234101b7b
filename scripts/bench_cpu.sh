#!/usr/bin/env bash
# CPU benchmark (not a test): ms per training step of train_kla.c beside PyTorch for the same small models,
# on the same number of threads. PyTorch runs at its best on CPU: fused attention where available and a
# chunkwise gdn in pure torch (scripts/bench_cpu.py). Needs the demo data (make data) and torch.
# Usage: bash scripts/bench_cpu.sh [threads, default: all cores]
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-$(nproc)}
py=/usr/bin/python3
$py -c 'import torch' 2> /dev/null || py=python3
B=4; T=256; STEPS=10
models=(
    "attn:4 --width 256 --heads 4"
    "gdn:4 --width 256 --heads 4 --lin-heads 2 --dk 128 --dv 128"
    "kaczmarz:4 --width 256 --heads 4 --lin-heads 2 --dk 128 --dv 128"
)
printf "%-12s %-8s %14s %14s %10s\n" "model" "threads" "train_kla ms" "pytorch ms" "ratio"
for m in "${models[@]}"; do
    set -- $m
    pattern=$1; shift
    # train_kla: mean ms/step of steps 3..(STEPS+2), the first two are warmup
    ms_c=$(OMP_NUM_THREADS=$threads ./train_kla --mixer "$pattern" "$@" -b $B -t $T -x $((STEPS + 2)) -v 0 -m 1 -g 0 |
           grep -o '| [0-9.]* ms |' | awk 'NR > 2 { s += $2; n++ } END { printf "%.1f", s / n }')
    ms_py=$($py scripts/bench_cpu.py --mixer "$pattern" "$@" --B $B --T $T --threads "$threads" --steps $STEPS --warmup 2 |
            grep -o '[0-9.]* ms/step' | awk '{ print $1 }')
    awk -v p="$pattern" -v t="$threads" -v c="$ms_c" -v y="$ms_py" 'BEGIN { printf "%-12s %-8s %14s %14s %9.2fx\n", p, t, c, y, y / c }'
done
echo "ratio = pytorch ms / train_kla ms (above 1: train_kla is faster). B=$B T=$T, vocab 50257, $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
# every mixer, train_kla only: the same step (4 layers of width 256; the head-based mixers 2 heads of dk = dv = 128,
# kalman plain with N = 16, expand 1)
printf "%-12s %14s\n" "mixer" "train_kla ms"
for m in attn gdn kaczmarz pdn pgdn pkda gka kalman; do
    ms_c=$(OMP_NUM_THREADS=$threads ./train_kla --mixer "$m" --depth 4 --width 256 --heads 4 --lin-heads 2 --dk 128 --dv 128 \
           -b $B -t $T -x $((STEPS + 2)) -v 0 -m 1 -g 0 | grep -o '| [0-9.]* ms |' | awk 'NR > 2 { s += $2; n++ } END { printf "%.1f", s / n }')
    printf "%-12s %14s\n" "$m" "$ms_c"
done
