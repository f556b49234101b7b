#!/usr/bin/env bash
# Experiment (not a test): the batch layouts of --rows (README "Batches") compared on the same tokens. Each model
# trains once per layout and seed, with everything else equal, and the final validation loss over the whole val
# split (-m -1, the same fixed windows for every run) goes into a markdown table.
#   bash scripts/compare_rows.sh cpu   # ./train_kla: gdn, 4 layers of width 128, B=8, T=64, 300 steps (README's CPU rows)
#   bash scripts/compare_rows.sh gpu   # ./train_klacu: 124M gdn and attn, B=16, T=1024, 150 steps (the GPU rows)
#   SEEDS="1337 1338" restricts the seeds (default: 1337 1338 1339).
# Needs the demo shards (make data; on the GPU machine, carry data/demo along) and the trainer built. The runs
# write under $OUT/compare_rows when $OUT is set (the device tool collects it), else under a temporary folder;
# the table is printed and, with $OUT, also written to $OUT/compare_rows.md.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
preset=${1:-}
SEEDS=(${SEEDS:-1337 1338 1339})
case "$preset" in
    cpu)
        TRAINER=./train_kla
        MODELS=(gdn)
        declare -A MODEL_FLAGS=([gdn]="--mixer gdn --depth 4 --width 128")
        RUN_FLAGS=(-b 8 -t 64 -x 300 -l 3e-3 -u 20)
        ;;
    gpu)
        TRAINER=./train_klacu
        MODELS=(gdn attn)
        declare -A MODEL_FLAGS=([gdn]="--mixer gdn:12 --width 768 --heads 12 --lin-heads 6 --dk 128 --dv 128"
                                [attn]="--mixer attn:12 --width 768 --heads 12")
        RUN_FLAGS=(-b 16 -t 1024 -x 150 -l 6e-4 -u 20)
        ;;
    *) echo "usage: bash scripts/compare_rows.sh cpu|gpu (SEEDS=\"...\" optional)" >&2; exit 1 ;;
esac
[ -x "$TRAINER" ] || { echo "error: $TRAINER is missing; build it first (make ${TRAINER#./})" >&2; exit 1; }

runs=${OUT:-}/compare_rows
[ -n "${OUT:-}" ] || { runs=$(mktemp -d); trap 'rm -rf "$runs"' EXIT; }
mkdir -p "$runs"

table="| model | --rows | seed | steps | tokens | val loss (whole split) |"$'\n'"|---|---|---|---|---|---|"
# seed by seed, both layouts of a seed one after the other, so that a cut-short run still has pairs to compare
for model in "${MODELS[@]}"; do
    for seed in "${SEEDS[@]}"; do
        for rows in independent contiguous; do
            dir=$runs/${model}_${rows}_$seed
            echo "== $model --rows $rows --seed $seed" >&2
            # shellcheck disable=SC2086  # MODEL_FLAGS holds several flags
            if ! "$TRAINER" ${MODEL_FLAGS[$model]} "${RUN_FLAGS[@]}" --rows "$rows" --seed "$seed" \
                    -v 0 -m -1 -g 0 -o "$dir" --overwrite 1 > "$dir.log" 2>&1; then
                echo "run failed, see $dir.log:" >&2
                tail -n 3 "$dir.log" >&2
                table+=$'\n'"| $model | $rows | $seed | | | FAILED |"
                continue
            fi
            # main.log: "s:<step> trl:<loss> ..." per step, "s:<step> tel:<val loss>" at the end
            steps=$(grep -c ' trl:' "$dir/main.log")
            val=$(grep ' tel:' "$dir/main.log" | tail -n 1 | sed 's/.*tel://')
            tokens=$(grep -oE 'grad accum [0-9]+ = [0-9]+ tokens' "$dir.log" | grep -oE '[0-9]+ tokens' | grep -oE '[0-9]+')  # per step
            table+=$'\n'"| $model | $rows | $seed | $steps | $((steps * ${tokens:-0})) | $val |"
        done
    done
done
echo "$table"
[ -n "${OUT:-}" ] && echo "$table" > "$OUT/compare_rows.md"
exit 0
