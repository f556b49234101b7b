#!/usr/bin/env bash
# reproduce_tasks.sh: an experiment, not a test (issue 13, "reproductions"). It trains a grid of small models on the
# built-in synthetic tasks (README "Synthetic tasks"), several runs at a time on one GPU, and writes a markdown table
# of their test accuracies, to check three claims of the seed papers at a budget of a few minutes:
#   claim 2 (spec/kalman.md 7.3, 8.1; paper 004 Fig. 1a): on the A5 word problem, kalman with 1-2 layers reaches
#            >= 90% token accuracy at lengths where gdn and attn of the same depth do not.       (runs first)
#   claim 3 (spec/gka.md 12.1, spec/pdn.md 8.1, 7.4; papers 000/003): on Zoology's MQAR at the same small width,
#            gka and pgdn recall at least as well as gdn.                                         (runs second)
#   claim 1 (spec/gdn_kaczmarz.md 6.2, 7.3; paper 002): kaczmarz extrapolates MQAR to 8x its training length better
#            than gdn (paper: 73.8% against 66.8%), and solves S-NIAH at 2x-8x.                   (runs last)
# The grid (every run's flags are in its log) is in grid() below; the recipes follow the specs' where the budget
# allows and say where they do not.
#
# Usage: bash scripts/reproduce_tasks.sh [trainer, default ./train_klacu; ./train_kla is the CPU trainer]
# Variables:
#   REPRO_JOBS=10          runs at a time (all on the one GPU: the models are tiny, one run leaves it mostly idle)
#   REPRO_DEADLINE_S=330   no run starts after this many seconds from the start ...
#   REPRO_GRACE_S=30       ... and the runs still going this much later are killed and marked "cut" (the table then
#                          shows their last validation accuracy)
#   REPRO_SEEDS="1337"     seeds; each cell of the grid runs once per seed
#   REPRO_SCALE=1          divides every run's steps (quick checks, e.g. 500 on the CPU)
#   REPRO_BATCH=           overrides every run's batch size -b (quick checks on the CPU)
#   REPRO_EVAL_BATCHES=-1  -m: validation/test batches per length; -1 = 2000 sequences, the specs' test-set size
#   REPRO_ONLY=            an extended regex: run only the grid entries whose name matches; names are
#                          claim2_a5_<mixer>_d<depth>_L<len>_s<seed>, claim3_zoo_<mixer>_P<pairs>[_lr<lr>]_s<seed>,
#                          claim1_mqar_<mixer>[_lr<lr>]_s<seed>, claim1_sniah_<mixer>[_lr<lr>]_s<seed>
#                          (e.g. REPRO_ONLY='^claim2')
#   REPRO_ZOO_LRS="3e-3"   claim 3's learning rates, REPRO_KLA_LRS="1e-3" claim 1's: each runs every cell once
#   REPRO_A5_LENS="20 10 5 40"  claim 2's lengths, REPRO_A5_DEPTHS="1 2" its depths (the minimum depth per length
#                          needs more), REPRO_A5_STEPS=3000 its steps
#   REPRO_THREADS=1        OMP_NUM_THREADS of each run
#   REPRO_CONTENTION_PCT=20  the estimate's assumption: each other run on the GPU adds this % to a run's step time
#   REPRO_CALIBRATE=1      first measure the GPU as loaded now (below) and rescale every run's steps by x0.5-x1.5;
#                          default 1 for a CUDA trainer (name with "cu"), 0 for the CPU trainer
#   REPRO_DRY_RUN=1        print the grid and the time estimate, run nothing
# Output: each run's stdout/stderr in <runs>/<name>.log and its main.log in <runs>/<name>/ (checkpoints deleted),
# <runs> = $OUT/reproduce_tasks when $OUT is set, else a new temporary folder (kept, its path printed). The table
# goes to $OUT/reproduce_tasks.md (else <runs>/reproduce_tasks.md), rewritten whenever a run ends, so a grid cut
# short still leaves the rows of what finished; it is printed at the end. Exit code 0 when every run that started
# ended ok or cut, 1 if one failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

TRAINER=${1:-./train_klacu}
JOBS=${REPRO_JOBS:-10}
DEADLINE_S=${REPRO_DEADLINE_S:-330}
GRACE_S=${REPRO_GRACE_S:-30}
read -ra SEEDS <<< "${REPRO_SEEDS:-1337}"
SCALE=${REPRO_SCALE:-1}
BATCH=${REPRO_BATCH:-}
EVAL_BATCHES=${REPRO_EVAL_BATCHES:--1}
ONLY=${REPRO_ONLY:-}
THREADS=${REPRO_THREADS:-1}
CONTENTION_PCT=${REPRO_CONTENTION_PCT:-20}
DRY_RUN=${REPRO_DRY_RUN:-0}
CALIBRATE=${REPRO_CALIBRATE:-}
if [ -z "$CALIBRATE" ]; then [[ $(basename "$TRAINER") == *cu* ]] && CALIBRATE=1 || CALIBRATE=0; fi

T0=$(date +%s)  # the deadline counts from here
elapsed() { echo $(( $(date +%s) - T0 )); }

for v in JOBS DEADLINE_S GRACE_S SCALE THREADS CONTENTION_PCT; do
    [[ ${!v} =~ ^[0-9]+$ ]] || { echo "error: REPRO_$v must be a whole number (got '${!v}')" >&2; exit 1; }
done
(( JOBS >= 1 && SCALE >= 1 )) || { echo "error: REPRO_JOBS and REPRO_SCALE must be >= 1" >&2; exit 1; }
[ -z "$BATCH" ] || [[ $BATCH =~ ^[1-9][0-9]*$ ]] || { echo "error: REPRO_BATCH must be a positive number" >&2; exit 1; }
[ "$DRY_RUN" = 1 ] || [ -x "$TRAINER" ] || { echo "error: $TRAINER is missing; build it first (make ${TRAINER#./})" >&2; exit 1; }

# ---- the grid, in priority order (a run cut short by the deadline is more likely at the end of the list)
# J_* arrays, one entry per run: name, claim, task (for the table), mixer, depth, width, training length, eval
# lengths (comma-separated, "" = none), steps, batch, vocabulary (for the estimate), the trainer's flags.
J_NAME=(); J_CLAIM=(); J_TASK=(); J_MIXER=(); J_DEPTH=(); J_WIDTH=(); J_LEN=(); J_EVAL=(); J_STEPS=(); J_B=(); J_V=(); J_FLAGS=()
add() {  # add NAME CLAIM TASK MIXER DEPTH WIDTH LEN EVAL STEPS B V FLAGS...
    local name=$1 claim=$2 task=$3 mixer=$4 depth=$5 width=$6 len=$7 eval=$8 steps=$9 b=${10} v=${11}
    shift 11
    [ -n "$BATCH" ] && b=$BATCH
    steps=$(( steps / SCALE )); [ "$steps" -ge 1 ] || steps=1
    local s
    for s in "${SEEDS[@]}"; do
        [ -n "$ONLY" ] && ! [[ ${name}_s$s =~ $ONLY ]] && continue
        J_NAME+=("${name}_s$s"); J_CLAIM+=("$claim"); J_TASK+=("$task"); J_MIXER+=("$mixer"); J_DEPTH+=("$depth")
        J_WIDTH+=("$width"); J_LEN+=("$len"); J_EVAL+=("$eval"); J_STEPS+=("$steps"); J_B+=("$b"); J_V+=("$v")
        J_FLAGS+=("$* -b $b --seed $s")
    done
}

# Trunk of every run: RMSNorm and SwiGLU blocks (the pdn and KLA papers' synthetic setups; spec/kalman.md 1.5), the
# same for every mixer of a claim. Head layout: attn 4 heads of C/4; gdn, kaczmarz, pgdn, gka 2 heads of dk = dv =
# 2C/4 unless a spec gives others (claim 1: the KLA paper's 4 heads of 48/96).
TRUNK="--norm rmsnorm --mlp swiglu"
# Recipes (README "Synthetic tasks" for the task flags):
# claim 2, A5 (spec/kalman.md 6.3, 8.1): kalman's synthetic recipe (AdamW, constant lr, clip 5.0, weight decay 0),
#   plain preset, N = 16, expand 2 (the package default; the spec: "not stated"), width 128 for every mixer (paper:
#   C = 1024, lr 3e-4, up to 500 epochs: far beyond a minute per run; we take lr 1e-3, the recipe's common rate, and
#   3000 steps of 128 fresh sequences). Lengths: 20, the longest of the paper's protocol (T = 2..20), then 10, 5 and 40.
#   This budget may be too small for any mixer: on the CPU (L = 10, B = 64, 2026-11-26) 1000-1200 steps left kalman
#   (lr 1e-3: 0.14) and attn (lr 3e-3: 0.12) near the floor of 0.115, and gdn (lr 1e-3) at 0.21.
A5_RECIPE="-k constant -l 1e-3 -u 100 -c 0 --grad-clip 5"
A5_STEPS=${REPRO_A5_STEPS:-3000}
read -ra A5_LENS <<< "${REPRO_A5_LENS:-20 10 5 40}"
read -ra A5_DEPTHS <<< "${REPRO_A5_DEPTHS:-1 2}"
declare -A A5_MIXER_FLAGS=([kalman]="--kalman-preset plain --kalman-n 16 --kalman-expand 2"
                           [gdn]="--lin-heads 2 --dk 64 --dv 64" [attn]="")
# claim 3, Zoology MQAR (spec/pdn.md 8.1, spec/gka.md 12.1): 2 layers, width 64 (Zoology's smallest; the gka paper
#   stresses widths at or below the number of pairs), vocab 8192, length 256, pairs 64 / 32 / 16 (4P <= L), batch 64,
#   cosine lr 3e-3 by default (one point of Zoology's sweep {1e-3, 3.2e-3, 1e-2, 3.2e-2}; the papers report the best
#   of a sweep: REPRO_ZOO_LRS="1e-3 3e-3 1e-2" runs each; pgdn learned nothing at 3e-3 on 2026-11-26),
#   weight decay 0.1, 2000 steps (Zoology: about 2500 steps of 256). Our gka keeps its gates (the paper's MQAR gka
#   has none: gamma = alpha = 1).
ZOO_RECIPE="-k cosine -u 100 -q 0.1 -c 0.1 --grad-clip 1"
ZOO_LRS=(${REPRO_ZOO_LRS:-3e-3})
ZOO_STEPS=2000
declare -A ZOO_MIXER_FLAGS=([gka]="--gka-iters 30" [pgdn]="" [gdn]="")
# claim 1 (spec/gdn_kaczmarz.md 6.2): the KLA paper's MQAR model (2 layers, width 256, 4 heads of dk 48, dv 96,
#   SwiGLU 1024, vocab 8192) and recipe (AdamW, constant lr 1e-3, weight decay 0.1, clip 1.0, batch 32; we add 100
#   warmup steps), 4000 steps instead of up to 10000 with early stopping. MQAR: length 256, 32 pairs, evaluated at
#   2x, 4x, 8x. S-NIAH: trained at 512 (paper: 1024) and evaluated at 2x, 4x, 8x, the paper's factors at half the
#   lengths (the 8K evaluation would need several GiB per run).
#   REPRO_KLA_LRS="3e-4 1e-3 3e-3" sweeps its learning rate (default the paper's 1e-3; at 1e-3 kaczmarz stayed near 15%
#   on S-NIAH where gdn reached 98%, 2026-11-26).
KLA_MODEL="--width 256 --heads 4 --lin-heads 4 --dk 48 --dv 96 --mlp-hidden 1024"
KLA_RECIPE="-k constant -u 100 -c 0.1 --grad-clip 1"
KLA_LRS=(${REPRO_KLA_LRS:-1e-3})
KLA_STEPS=4000

# the run names of claims 3 and 1 carry the learning rate when several are swept (_lr1e-2), else nothing
zoo_lr_tag() { [ ${#ZOO_LRS[@]} -gt 1 ] && echo "_lr$1"; }
kla_lr_tag() { [ ${#KLA_LRS[@]} -gt 1 ] && echo "_lr$1"; }

grid() {
    local L d m P
    for L in "${A5_LENS[@]}"; do
        for d in "${A5_DEPTHS[@]}"; do
            for m in kalman gdn attn; do
                # shellcheck disable=SC2086  # the flag strings hold several flags
                add "claim2_a5_${m}_d${d}_L$L" 2 "a5" "$m" "$d" 128 "$L" "" "$A5_STEPS" 128 60 \
                    --task a5 --task-len "$L" --mixer "$m:$d" --width 128 --heads 4 $TRUNK ${A5_MIXER_FLAGS[$m]} $A5_RECIPE
            done
        done
    done
    local lr
    for P in 64 32 16; do
        for lr in "${ZOO_LRS[@]}"; do
            for m in gka pgdn gdn; do
                # shellcheck disable=SC2086
                add "claim3_zoo_${m}_P${P}$(zoo_lr_tag "$lr")" 3 "mqar-zoology P=$P lr $lr" "$m" 2 64 256 "" "$ZOO_STEPS" 64 8192 \
                    --task mqar-zoology --task-len 256 --task-pairs "$P" --mixer "$m:2" --width 64 --heads 4 \
                    --lin-heads 2 --dk 32 --dv 32 $TRUNK ${ZOO_MIXER_FLAGS[$m]} $ZOO_RECIPE -l "$lr"
            done
        done
    done
    for lr in "${KLA_LRS[@]}"; do
        for m in kaczmarz gdn; do
            # shellcheck disable=SC2086
            add "claim1_mqar_$m$(kla_lr_tag "$lr")" 1 "mqar P=32$(kla_lr_tag "$lr" | sed 's/_lr/ lr /')" "$m" 2 256 256 \
                "512,1024,2048" "$KLA_STEPS" 32 8192 --task mqar --task-len 256 --task-pairs 32 --task-eval 512,1024,2048 \
                --mixer "$m:2" $KLA_MODEL $TRUNK $KLA_RECIPE -l "$lr"
        done
        for m in kaczmarz gdn; do
            # shellcheck disable=SC2086
            add "claim1_sniah_$m$(kla_lr_tag "$lr")" 1 "sniah$(kla_lr_tag "$lr" | sed 's/_lr/ lr /')" "$m" 2 256 512 \
                "1024,2048,4096" "$KLA_STEPS" 32 8192 --task sniah --task-len 512 --task-eval 1024,2048,4096 \
                --mixer "$m:2" $KLA_MODEL $TRUNK $KLA_RECIPE -l "$lr"
        done
    done
}
grid
N=${#J_NAME[@]}
[ "$N" -ge 1 ] || { echo "error: REPRO_ONLY='$ONLY' matches no run of the grid" >&2; exit 1; }

# ---- the time estimate, for one H200 (the step times of tiny models are launch-bound: README "GPU" gives the
# sequential scans' costs; gdn/attn at this size take about 3-10 ms a step alone). Per step, alone on the GPU:
# 3 ms + per layer (attn, gdn, kaczmarz 1.5 ms; pgdn 2 ms + 8 us per token of the sequence, its sequential core;
# kalman 2.5 ms + 5 us per token, its sequential scan; gka 2.5 ms + 12 us per token, its 30-iteration solve and
# recurrent backward) + the LM head's 6*B*T*V*C flops at 200 TFLOP/s. Sharing the GPU with the other runs multiplies
# it by 1 + (REPRO_CONTENTION_PCT/100)*(REPRO_JOBS-1), an assumption (2.8 at 10 runs) that the measured ms/step of
# the table checks. A run = 5 s to start + its steps + its evaluations (validation at step 0, every steps/4 and the
# test: a forward pass is a third of a step, plus its tokens' share) over ceil(2000/B) batches per length.
step_us() {  # step_us MIXER DEPTH T B V C: the estimated time of one training step alone on the GPU, microseconds
    local per_layer=1500 per_token=0
    case $1 in
        kalman) per_layer=2500; per_token=5 ;;
        pdn|pgdn|pkda) per_layer=2000; per_token=8 ;;
        gka) per_layer=2500; per_token=12 ;;
    esac
    echo $(( 3000 + $2 * (per_layer + per_token * $3) + 6 * $4 * $3 * $5 * $6 / 200000000 ))
}
contention_x100=$(( 100 + CONTENTION_PCT * (JOBS - 1) ))  # the calibration replaces it by its measurement
every_of() { echo $(( $1 / 4 > 0 ? $1 / 4 : 1 )); }    # -v of a run of $1 steps: validations at 0, 1/4, ..., the end
estimate_runs() {  # J_EST (seconds) and J_STEP_EST_MS of every run, from J_STEPS and contention_x100
    local i s len batches evals eval_us train_us
    J_EST=(); J_STEP_EST_MS=()
    for ((i = 0; i < N; i++)); do
        s=$(step_us "${J_MIXER[i]}" "${J_DEPTH[i]}" "${J_LEN[i]}" "${J_B[i]}" "${J_V[i]}" "${J_WIDTH[i]}")
        train_us=$(( J_STEPS[i] * s * contention_x100 / 100 ))
        batches=$(( EVAL_BATCHES > 0 ? EVAL_BATCHES : (2000 + J_B[i] - 1) / J_B[i] ))
        evals=$(( J_STEPS[i] / $(every_of "${J_STEPS[i]}") + 2 ))
        eval_us=0
        for len in ${J_LEN[i]} ${J_EVAL[i]//,/ }; do
            eval_us=$(( eval_us + $(step_us "${J_MIXER[i]}" "${J_DEPTH[i]}" "$len" "${J_B[i]}" "${J_V[i]}" "${J_WIDTH[i]}") / 3 ))
        done
        eval_us=$(( evals * batches * eval_us * contention_x100 / 100 ))
        J_EST[i]=$(( 5 + (train_us + eval_us) / 1000000 ))
        J_STEP_EST_MS[i]=$(( s * contention_x100 / 100000 ))
    done
}
# the schedule the runner follows: each run starts when one of REPRO_JOBS slots frees, in grid order
estimate() {
    local slots=() i k best start end makespan=0 late=0
    for ((k = 0; k < JOBS; k++)); do slots[k]=$(elapsed); done  # after a calibration, the runs start later
    printf '%-34s %6s %4s %9s %7s %7s\n' "run (estimate for one H200)" steps B "ms/step" "run s" "ends s"
    for ((i = 0; i < N; i++)); do
        best=0
        for ((k = 1; k < JOBS; k++)); do (( slots[k] < slots[best] )) && best=$k; done
        start=${slots[best]}
        if (( start >= DEADLINE_S )); then late=$((late + 1)); continue; fi
        end=$(( start + J_EST[i] )); slots[best]=$end
        (( end > makespan )) && makespan=$end
        printf '%-34s %6d %4d %9d %7d %7d\n' "${J_NAME[i]}" "${J_STEPS[i]}" "${J_B[i]}" "${J_STEP_EST_MS[i]}" "${J_EST[i]}" "$end"
    done
    local total=0; for ((i = 0; i < N; i++)); do total=$(( total + J_EST[i] )); done
    echo "estimate: $N runs, $total run-seconds, $JOBS at a time (each step x$(x100 "$contention_x100") for sharing the GPU): the grid ends after about $makespan s (deadline $DEADLINE_S s, kill at $((DEADLINE_S + GRACE_S)) s)"
    [ "$late" = 0 ] || echo "estimate: $late run(s) would start after the deadline and not run"
    [ "$CALIBRATE" = 1 ] && [ "$(elapsed)" -lt 5 ] && echo "estimate: the calibration first takes about 10-15 s (it may rescale the steps)"
    [[ $(basename "$TRAINER") == *cu* ]] || echo "note: these are GPU figures; $TRAINER is the CPU trainer, far slower"
}
x100() { printf '%d.%02d' $(( $1 / 100 )) $(( $1 % 100 )); }  # 280 -> 2.80
estimate_runs
estimate
[ "$DRY_RUN" = 1 ] && exit 0

# ---- where the runs and the table go
if [ -n "${OUT:-}" ]; then runs=$OUT/reproduce_tasks; table_file=$OUT/reproduce_tasks.md
else runs=$(mktemp -d -t reproduce_tasks.XXXXXX); table_file=$runs/reproduce_tasks.md; fi
mkdir -p "$runs" || exit 1
echo "runs: $runs; table: $table_file"
if [[ $(basename "$TRAINER") == *cu* ]] && command -v nvidia-smi > /dev/null; then
    device=$(nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null | head -n 1)
fi
[ -n "${device:-}" ] || device="CPU ($(nproc) cores)"
commit=$(git rev-parse --short HEAD 2> /dev/null || echo unknown)
[ -z "$(git status --porcelain --untracked-files=no 2> /dev/null)" ] || commit+=" + uncommitted changes"
started=$(date -u '+%Y-%m-%d %H:%M UTC')

# ---- calibration: how fast does this GPU, loaded as it is now, run REPRO_JOBS runs side by side? REPRO_JOBS copies of
# one A5 gdn run (depth 1, L = 20) train together for a few seconds (until each has 20 steps, then 5 s more; at most
# 45 s); the median step time of the second half of their step lines, against the estimate for that run, gives a
# factor f, clamped to [0.5, 1.5], that multiplies every run's steps (rounded to 10s): more training when the GPU is
# faster than assumed, less (down to half; past that the deadline and the priority order decide) when slower. The
# measured contention also replaces the assumed one in the estimate. f = 1 when the measurement fails.
calibration_note="none"
calibrate() {
    local k dir=$runs/calibration t0 done_ pids=() measured_us solo_us est_us f100 i
    mkdir -p "$dir"
    echo "calibration: $JOBS copies of the A5 gdn depth-1 L=20 run side by side"
    for ((k = 0; k < JOBS; k++)); do
        # shellcheck disable=SC2086
        OMP_NUM_THREADS=$THREADS "$TRAINER" --task a5 --task-len 20 --mixer gdn:1 --width 128 --heads 4 $TRUNK \
            ${A5_MIXER_FLAGS[gdn]} $A5_RECIPE -b "${BATCH:-128}" -x 1000000 -v 0 -m 1 --seed $((k + 1)) > "$dir/copy$k.log" 2>&1 &
        pids+=($!)
    done
    t0=$(date +%s)
    while :; do
        done_=0
        for ((k = 0; k < JOBS; k++)); do [ "$(grep -c '^step ' "$dir/copy$k.log")" -ge 20 ] && done_=$((done_ + 1)); done
        (( done_ == JOBS || $(date +%s) - t0 >= 40 )) && break
        kill -0 "${pids[@]}" 2> /dev/null || break  # all copies ended (a broken trainer)
        sleep 1
    done
    sleep 5
    kill -TERM "${pids[@]}" 2> /dev/null
    wait "${pids[@]}" 2> /dev/null
    # the second half of each copy's step lines, pooled; their median, in microseconds
    measured_us=$(for ((k = 0; k < JOBS; k++)); do
                      sed -n 's/^step .* | \([0-9.]*\) ms | .*/\1/p' "$dir/copy$k.log" | awk '{ a[NR] = $1 } END { for (j = int(NR / 2) + 1; j <= NR; j++) print a[j] }'
                  done | sort -n | awk '{ a[NR] = $1 } END { if (NR >= 10) printf "%d", 1000 * a[int((NR + 1) / 2)] }')
    solo_us=$(step_us gdn 1 20 "${BATCH:-128}" 60 128)
    est_us=$(( solo_us * contention_x100 / 100 ))
    if [ -z "$measured_us" ] || [ "$measured_us" -le 0 ]; then
        calibration_note="failed (too few step lines in $dir), steps as planned"
        echo "calibration: $calibration_note"; return
    fi
    f100=$(( est_us * 100 / measured_us ))
    (( f100 < 50 )) && f100=50
    (( f100 > 150 )) && f100=150
    contention_x100=$(( measured_us * 100 / solo_us ))
    for ((i = 0; i < N; i++)); do
        J_STEPS[i]=$(( J_STEPS[i] * f100 / 100 ))
        (( J_STEPS[i] >= 20 )) && J_STEPS[i]=$(( (J_STEPS[i] + 5) / 10 * 10 ))
        (( J_STEPS[i] >= 1 )) || J_STEPS[i]=1
    done
    calibration_note="$JOBS copies of the A5 gdn d1 L=20 run: $((measured_us / 1000)).$(printf '%03d' $((measured_us % 1000))) ms/step, estimate $((est_us / 1000)).$(printf '%03d' $((est_us % 1000))) ms (solo estimate x$(x100 "$contention_x100")); steps x$(x100 "$f100")"
    echo "calibration: $calibration_note"
    estimate_runs
    estimate
}
[ "$CALIBRATE" = 1 ] && calibrate

# ---- results of the runs, filled in as they end
R_STATUS=(); R_ACC=(); R_STEPS=(); R_SECS=(); R_MS=()
for ((i = 0; i < N; i++)); do R_STATUS[i]="not run"; R_ACC[i]=""; R_STEPS[i]=""; R_SECS[i]=""; R_MS[i]=""; done

# acc_of I: the accuracies of run I from its main.log, in the order of its lengths (training length first): the test
# split's after a whole run; for a run cut short, those of its last validation, prefixed "val@<step>". Sets R_ACC.
acc_of() {
    local i=$1 log=$runs/${J_NAME[$1]}/main.log kind=test_len step="" len a out=""
    [ -f "$log" ] || { R_ACC[i]=""; return; }
    if ! grep -q ' test_len:' "$log"; then
        kind=val_len
        step=$(grep ' val_len:' "$log" | tail -n 1 | sed 's/^s:\([0-9]*\) .*/\1/')
        [ -n "$step" ] || { R_ACC[i]=""; return; }
    fi
    for len in ${J_LEN[i]} ${J_EVAL[i]//,/ }; do
        a=$(grep "^s:${step:-[0-9]*} $kind:$len " "$log" | tail -n 1 | sed 's/.* acc://')
        out+="${out:+ / }${a:--}"
    done
    R_ACC[i]="${step:+val@$step: }$out"
}

# write_table: the markdown table of every run so far, then the claims' summaries; replaces the table file whole
write_table() {
    local i tmp=$table_file.tmp
    {
        echo "# Synthetic-task reproductions (scripts/reproduce_tasks.sh)"
        echo
        echo "Device: $device; trainer $TRAINER; started $started; commit $commit; $JOBS runs at a time; deadline ${DEADLINE_S} s (+${GRACE_S} s); seeds ${SEEDS[*]}; steps divided by $SCALE${BATCH:+; batch $BATCH}; -m $EVAL_BATCHES; calibration: $calibration_note."
        echo
        echo "| claim | task | mixer | depth | width | train len | eval lens | steps | test acc per length | status | seconds | ms/step | est. s |"
        echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        for ((i = 0; i < N; i++)); do
            echo "| ${J_CLAIM[i]} | ${J_TASK[i]} | ${J_MIXER[i]} | ${J_DEPTH[i]} | ${J_WIDTH[i]} | ${J_LEN[i]} | ${J_LEN[i]}${J_EVAL[i]:+,${J_EVAL[i]}} | ${R_STEPS[i]:-${J_STEPS[i]}} | ${R_ACC[i]} | ${R_STATUS[i]} | ${R_SECS[i]} | ${R_MS[i]} | ${J_EST[i]} |"
        done
        echo
        echo "Token accuracy over the labelled positions, at each length in the order of 'eval lens' (the training length first), on the test split (2000 fresh sequences per length with -m -1); a cut run shows its last validation instead (val@step). A5: position 1 is the input itself, so a model that learned nothing scores about 1/L + (1-1/L)/60."
        echo
        summary
        echo
        echo "Recipes: claim 2 \`--task a5 $TRUNK --width 128 --heads 4 -b ${BATCH:-128} $A5_RECIPE\` (kalman ${A5_MIXER_FLAGS[kalman]}; gdn ${A5_MIXER_FLAGS[gdn]});"
        echo "claim 3 \`--task mqar-zoology --task-len 256 --width 64 --heads 4 --lin-heads 2 --dk 32 --dv 32 $TRUNK -b ${BATCH:-64} $ZOO_RECIPE -l <${ZOO_LRS[*]}>\`;"
        echo "claim 1 \`$KLA_MODEL $TRUNK -b ${BATCH:-32} $KLA_RECIPE -l <${KLA_LRS[*]}>\`; every run's full command line is the first line of its log."
    } > "$tmp" && mv "$tmp" "$table_file"
}

# first_acc I: run I's accuracy at its training length ("" if none); last_acc I: at its longest length
first_acc() { local a=${R_ACC[$1]#val@*: }; a=${a%% /*}; [ "$a" = - ] && a=""; echo "$a"; }
last_acc() { local a=${R_ACC[$1]#val@*: }; a=${a##*/ }; [ "$a" = - ] && a=""; echo "$a"; }
find_run() {  # find_run PREFIX SEED: the index of the run named PREFIX_sSEED, or nothing
    local i; for ((i = 0; i < N; i++)); do [ "${J_NAME[i]}" = "${1}_s$2" ] && { echo "$i"; return; }; done
}
# summary: per claim, the numbers the claim is about, from the finished runs (the runs cut short are left out)
summary() {
    local s L d m P i a line any
    echo "Summary (finished runs only; a claim reads 'supported' only where every run it needs finished):"
    echo
    for s in "${SEEDS[@]}"; do
        for L in $(printf '%s\n' "${A5_LENS[@]}" | sort -n); do
            for d in "${A5_DEPTHS[@]}"; do
                line=""; any=0; local solved="" complete=1
                for m in kalman gdn attn; do
                    i=$(find_run "claim2_a5_${m}_d${d}_L$L" "$s"); [ -n "$i" ] || { complete=0; continue; }
                    a=""; [ "${R_STATUS[i]}" = ok ] && a=$(first_acc "$i")
                    [ -n "$a" ] || { complete=0; line+=" $m -,"; continue; }
                    any=1; line+=" $m $a,"
                    awk -v a="$a" 'BEGIN { exit !(a >= 0.9) }' && solved+=" $m"
                done
                [ "$any" = 1 ] || continue
                local verdict="reaching >= 0.9:${solved:- none}"
                if [ "$complete" = 1 ]; then
                    if [ "$solved" = " kalman" ]; then verdict+=" (supports claim 2)"; else verdict+=" (does not support claim 2 here)"; fi
                fi
                echo "- claim 2, A5 L=$L depth $d, seed $s:${line%,}; $verdict"
            done
            # the minimum depth per mixer that reaches 0.9 at this length, among the depths run
            line=""
            for m in kalman gdn attn; do
                local least="none of ${A5_DEPTHS[*]}"
                for d in $(printf '%s\n' "${A5_DEPTHS[@]}" | sort -n); do
                    i=$(find_run "claim2_a5_${m}_d${d}_L$L" "$s"); [ -n "$i" ] && [ "${R_STATUS[i]}" = ok ] || continue
                    a=$(first_acc "$i")
                    if [ -n "$a" ] && awk -v a="$a" 'BEGIN { exit !(a >= 0.9) }'; then least=$d; break; fi
                done
                line+=" $m $least,"
            done
            echo "- claim 2, A5 L=$L, seed $s: minimum depth reaching >= 0.9:${line%,}"
        done
        for P in 64 32 16; do
            for lr in "${ZOO_LRS[@]}"; do
                line=""; any=0
                for m in gka pgdn gdn; do
                    i=$(find_run "claim3_zoo_${m}_P${P}$(zoo_lr_tag "$lr")" "$s"); [ -n "$i" ] || continue
                    a=""; [ "${R_STATUS[i]}" = ok ] && a=$(first_acc "$i") && any=1; line+=" $m ${a:--},"
                done
                [ "$any" = 1 ] && echo "- claim 3, mqar-zoology P=$P width 64, lr $lr, seed $s:${line%,}"
            done
        done
        local k g lr
        for lr in "${KLA_LRS[@]}"; do
            k=$(find_run "claim1_mqar_kaczmarz$(kla_lr_tag "$lr")" "$s"); g=$(find_run "claim1_mqar_gdn$(kla_lr_tag "$lr")" "$s")
            if [ -n "$k" ] && [ -n "$g" ] && [ "${R_STATUS[k]}" = ok ] && [ "${R_STATUS[g]}" = ok ]; then
                local ak ag; ak=$(last_acc "$k"); ag=$(last_acc "$g")
                echo "- claim 1, mqar at 8x (2048), lr $lr, seed $s: kaczmarz $ak, gdn $ag, difference $(awk -v a="$ak" -v b="$ag" 'BEGIN { printf "%+.2f", 100 * (a - b) }') points (paper: +7.03)"
            fi
            k=$(find_run "claim1_sniah_kaczmarz$(kla_lr_tag "$lr")" "$s"); g=$(find_run "claim1_sniah_gdn$(kla_lr_tag "$lr")" "$s")
            for i in $k $g; do
                [ "${R_STATUS[i]}" = ok ] && echo "- claim 1, sniah ${J_LEN[i]},${J_EVAL[i]}, lr $lr, seed $s: ${J_MIXER[i]} ${R_ACC[i]} (paper at 1K-8K: kaczmarz 1.00 everywhere, gdn 0.98-0.99)"
            done
        done
    done
}

# ---- the runner: REPRO_JOBS runs at a time, in grid order; none starts after the deadline; at deadline + grace
# the ones still going are killed (their pids, started here) and marked cut
declare -A RUNNING=()   # pid -> run index
J_START=()

launch() {
    local i=$1 dir=$runs/${J_NAME[$1]} flags
    # claim 1 evaluates 2000 sequences of up to 4096 tokens per length: only at the end (-v 0). On the first GPU run
    # (2026-11-26) its evaluation at step 0 alone outlasted the whole budget, when train_klacu still took each
    # evaluation batch's argmax on the host; on the GPU it now takes seconds, but the budget goes to training
    local every
    every=$(every_of "${J_STEPS[i]}")
    [ "${J_CLAIM[i]}" = 1 ] && every=0
    flags="${J_FLAGS[i]} -x ${J_STEPS[i]} -v $every -m $EVAL_BATCHES"
    mkdir -p "$dir"
    echo "$TRAINER $flags -o $dir --overwrite 1" > "$dir.log"
    # shellcheck disable=SC2086  # flags holds the run's flags (no spaces inside one)
    OMP_NUM_THREADS=$THREADS "$TRAINER" $flags -o "$dir" --overwrite 1 >> "$dir.log" 2>&1 &
    RUNNING[$!]=$i
    J_START[i]=$(date +%s)
    R_STATUS[i]=running
    echo "[$(elapsed) s] start ${J_NAME[i]} (pid $!, estimate ${J_EST[i]} s)"
}

# finish I RC CUT: record run I's end (exit code RC; CUT=1 when we killed it), delete its checkpoints, rewrite the table
finish() {
    local i=$1 rc=$2 cut=$3 dir=$runs/${J_NAME[$1]} last
    R_SECS[i]=$(( $(date +%s) - J_START[i] ))
    rm -f "$dir"/model_*.bin "$dir"/state_*.bin "$dir"/DONE_*
    acc_of "$i"
    last=$(grep ' trl:' "$dir/main.log" 2> /dev/null | tail -n 1 | sed 's/^s:\([0-9]*\) .*/\1/')
    R_STEPS[i]="$(( ${last:--1} + 1 ))/${J_STEPS[i]}"
    # ms/step: the trainer's summary (the mean after the first 10 steps), else (a run cut short) the same mean of its
    # step lines "step N/M | loss .. | lr .. | norm .. | X ms | ..."
    R_MS[i]=$(grep 'summary | ms/step' "$dir.log" | tail -n 1 | sed 's/.*ms\/step \([0-9.]*\).*/\1/')
    [ -n "${R_MS[i]}" ] || R_MS[i]=$(sed -n 's/^step .* | \([0-9.]*\) ms | .*/\1/p' "$dir.log" |
        awk '{ ms[NR] = $1 } END { for (k = (NR > 10 ? 11 : 1); k <= NR; k++) { s += ms[k]; n++ } if (n) printf "%.2f", s / n }')
    if [ "$cut" = 1 ]; then R_STATUS[i]="cut"
    elif [ "$rc" = 0 ] && grep -q ' test_len:' "$dir/main.log" 2> /dev/null; then R_STATUS[i]=ok
    else R_STATUS[i]="failed (exit $rc)"; fi
    echo "[$(elapsed) s] ${R_STATUS[i]}: ${J_NAME[i]} after ${R_SECS[i]} s, ${R_STEPS[i]} steps, accuracy ${R_ACC[i]:-none}"
    [ "${R_STATUS[i]}" = ok ] || [ "$cut" = 1 ] || tail -n 3 "$dir.log" | sed 's/^/    /'
    write_table
}

reap() {  # finish the runs that have ended
    local pid rc
    for pid in "${!RUNNING[@]}"; do
        if ! kill -0 "$pid" 2> /dev/null; then
            wait "$pid"; rc=$?
            local i=${RUNNING[$pid]}; unset "RUNNING[$pid]"
            finish "$i" "$rc" 0
        fi
    done
}

kill_running() {  # kill the runs still going: TERM, and KILL to those left after 3 s
    local pid alive
    for pid in "${!RUNNING[@]}"; do kill -TERM "$pid" 2> /dev/null; done
    for _ in 1 2 3; do
        alive=0
        for pid in "${!RUNNING[@]}"; do kill -0 "$pid" 2> /dev/null && alive=1; done
        [ "$alive" = 1 ] || return 0
        sleep 1
    done
    for pid in "${!RUNNING[@]}"; do kill -KILL "$pid" 2> /dev/null; done
}
cut_running() {
    local pid
    kill_running
    for pid in "${!RUNNING[@]}"; do
        wait "$pid" 2> /dev/null
        local i=${RUNNING[$pid]}; unset "RUNNING[$pid]"
        finish "$i" 137 1
    done
}
trap 'echo "interrupted: killing the runs"; cut_running; echo "table: $table_file"; exit 130' INT TERM

write_table
next=0
while :; do
    reap
    now=$(elapsed)
    if (( now >= DEADLINE_S + GRACE_S )); then
        [ "${#RUNNING[@]}" -gt 0 ] && echo "[$now s] deadline + grace: cutting ${#RUNNING[@]} run(s)"
        cut_running
        break
    fi
    if (( next < N && now < DEADLINE_S && ${#RUNNING[@]} < JOBS )); then
        launch "$next"; next=$((next + 1))
        write_table
        continue
    fi
    (( (next >= N || now >= DEADLINE_S) && ${#RUNNING[@]} == 0 )) && break
    sleep 1
done
(( next < N )) && echo "deadline: $((N - next)) run(s) not started"
write_table
echo
cat "$table_file"
echo
echo "runs: $runs"
failed=0
for ((i = 0; i < N; i++)); do [[ ${R_STATUS[i]} == failed* ]] && failed=1; done
exit $failed
