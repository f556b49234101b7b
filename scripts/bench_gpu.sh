#!/usr/bin/env bash
# GPU benchmark (not a test): the training step of train_klacu for 124M-sized models (attn = GPT-2 124M, gdn,
# kaczmarz by default, any mixer with BENCH_MODELS; 12 layers, width 768) at B=16, T=1024 and 4096 (the recurrent
# mixers also at B=1, T=16384 and 32768: long context, 16K and 32K tokens per step), beside a PyTorch
# peer of the attn model measured in the same run on the same GPU (torch.compile, bf16: scripts/bench_gpu_peer.py;
# when attn is among the models), plus the timing lines of the kernel labs of the models' cores
# (dev/cuda/gdn_chunk_fwd.cu and gdn_chunk_bwd.cu for gdn and kaczmarz, gka_core.cu for gka, kalman_scan.cu for
# kalman, pdn_core.cu for pdn, pgdn and pkda).
# Runs in one go on the GPU machine and prints a markdown
# table; with $OUT set (the device tool collects $OUT) it also writes it to $OUT/bench_gpu.md (rewritten after
# every run, so a run cut short still leaves the rows done so far) and the log of every run to $OUT/bench_gpu_logs/.
# Needs: nvcc for sm_90a (builds train_klacu and the labs when absent), the demo shards data/demo/demo_{train,val}_*.bin
# (made by `make data` on a machine with the npm packages; the GPU machine has no network, so carry data/demo along),
# and a python3 with torch and CUDA for the peer.
# Usage: bash scripts/bench_gpu.sh
#   BENCH_MODELS="attn gdn kaczmarz"   the models (any of attn gdn kaczmarz gka kalman pdn pgdn pkda; the others run
#                         their papers' blocks: kalman its LM recipe, the pdn family RMSNorm + SwiGLU; see MODEL_FLAGS)
#   BENCH_GDN_VERSION=N   kernel version of the gdn backward lab gdn_chunk_bwd.cu (default, as for every lab: the
#                         highest it accepts)
#   BENCH_RUN_TIMEOUT=S   seconds allowed to each run (default 300)
#   BENCH_LONG=0          skips the long-context rows (B=1, T=16384 and 32768)
# A failing run prints its error, its row reads FAILED and the others still run; the exit code is 1 if any failed.
set -uo pipefail      # no -e: a failure is recorded per row, not fatal
cd "$(dirname "$0")/.." || exit 1

B=16
STEPS=30; WARMUP=10      # steps per run; both programs time the steps after the first WARMUP
SEQ_LENS=(1024 4096)
LONG_LENS=(16384 32768)  # at B=1, every model but attn (issue 9: within 15% of B=16 T=1024's tok/s), unless BENCH_LONG=0
MODELS=(${BENCH_MODELS:-attn gdn kaczmarz})
# each model's block beyond the shared 12 layers of width 768 (issues 10-12 ask for these recipes)
declare -A MODEL_FLAGS=([attn]="" [gdn]="" [kaczmarz]="" [gka]=""
                        [kalman]="--kalman-preset mamba --kalman-n 32 --norm rmsnorm --mlp none"
                        [pdn]="--norm rmsnorm --mlp swiglu" [pgdn]="--norm rmsnorm --mlp swiglu" [pkda]="--norm rmsnorm --mlp swiglu")
for M in "${MODELS[@]}"; do
    [ -n "${MODEL_FLAGS[$M]+set}" ] || { echo "bench_gpu: unknown model '$M' in BENCH_MODELS (attn gdn kaczmarz gka kalman pdn pgdn pkda)" >&2; exit 1; }
done
MAX_SEQ_LEN=4096         # position-embedding rows of the attn model, the same in both programs
FLA_GDN_TOKS=242000      # DESIGN.md's figure for FLA's GDN layers (one H200, T=1024), not measured here
RUN_TIMEOUT=${BENCH_RUN_TIMEOUT:-300}
LAB_DIR=dev/cuda
# the labs of each core (gdn_chunk_fwd.cu times the forward alone, gdn_chunk_bwd.cu the forward+backward)
declare -A MODEL_LAB=([gdn]="gdn_chunk_fwd gdn_chunk_bwd" [kaczmarz]="gdn_chunk_fwd gdn_chunk_bwd" [gka]=gka_core
                   [kalman]=kalman_scan [pdn]=pdn_core [pgdn]=pdn_core [pkda]=pdn_core)
LABS=()   # the models' labs, each once, in the models' order
for M in "${MODELS[@]}"; do
    for lab in ${MODEL_LAB[$M]:-}; do
        [[ " ${LABS[*]} " != *" $lab "* ]] && LABS+=("$lab")
    done
done

# where the logs go: $OUT/bench_gpu_logs when the device tool collects $OUT, else a temporary folder
if [ -n "${OUT:-}" ]; then
    logs=$OUT/bench_gpu_logs
    mkdir -p "$logs"
else
    logs=$(mktemp -d)
    trap 'rm -rf "$logs"' EXIT
fi

failures=0
# results keyed "program/model/T" (program: train_klacu or peer); status: "ok" or why the run failed
declare -A ms tok mfu mem status

say() { echo "[bench_gpu] $*" >&2; }

# fail KEY WHY [LOG]: record a failed row, print why and the end of its log
fail() {
    status[$1]="FAILED: $2"
    failures=$((failures + 1))
    say "FAILED $1: $2"
    if [ -n "${3:-}" ] && [ -s "$3" ]; then
        tail -n 20 "$3" | sed 's/^/    /' >&2
    fi
}

# run_logged LOG CMD...: run CMD under the timeout, stdout and stderr into LOG; returns CMD's exit status
# (124 when the timeout stopped it)
run_logged() {
    local log=$1
    shift
    timeout "$RUN_TIMEOUT" "$@" > "$log" 2>&1
}

# field LINE NAME: the value after "| NAME " in a result line, e.g. field "$line" "ms/step" -> 31.20
field() {
    sed -n "s#.*| $2 \([^ |]*\).*#\1#p" <<< "$1"
}

# record KEY LINE: keep the figures of a result line
# (train_klacu: `summary | ms/step 31.20 | tok/s 525000 | mfu 45.1% | peak mem 12345 MiB`; the peer: the same
# without mfu)
record() {
    ms[$1]=$(field "$2" "ms/step")
    tok[$1]=$(field "$2" "tok/s")
    mfu[$1]=$(field "$2" "mfu")
    mem[$1]=$(field "$2" "peak mem")
    status[$1]=ok
}

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null | head -n 1)
gpu=${gpu:-unknown (nvidia-smi failed)}
started=$(date -u '+%Y-%m-%d %H:%M UTC')
declare -A lab_version lab_lines

# ---------------------------------------------------------------------------------------------------------------
# the report

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2fx", a / b }'; }

# lens MODEL: the sequence lengths it runs at (LONG_LENS at B=1, the others at B)
lens() {
    if [ "$1" != attn ] && [ "${BENCH_LONG:-1}" != 0 ]; then echo "${SEQ_LENS[*]} ${LONG_LENS[*]}"; else echo "${SEQ_LENS[*]}"; fi
}
batch() { if [ "$1" -gt 4096 ]; then echo 1; else echo "$B"; fi; }

# row PROGRAM LABEL MODEL T: one line of the table
row() {
    local key=$1/$3/$4 vs_peer="" vs_fla="" b
    b=$(batch "$4")
    if [ -z "${status[$key]:-}" ]; then
        echo "| $2 | $3 | $b | $4 | not run | | | | | |"
        return
    elif [ "${status[$key]}" != ok ]; then
        echo "| $2 | $3 | $b | $4 | ${status[$key]} | | | | | |"
        return
    fi
    if [ "$3" = attn ] && [ "${status[train_klacu/attn/$4]:-}" = ok ] && [ "${status[peer/attn/$4]:-}" = ok ]; then
        vs_peer=$(ratio "${tok[train_klacu/attn/$4]}" "${tok[peer/attn/$4]}")
    fi
    if [ "$1" = peer ]; then vs_peer="(reference)"; fi
    if { [ "$3" = gdn ] || [ "$3" = kaczmarz ]; } && [ "$4" = 1024 ]; then vs_fla=$(ratio "${tok[$key]}" "$FLA_GDN_TOKS"); fi
    echo "| $2 | $3 | $b | $4 | ${ms[$key]} | ${tok[$key]} | ${mfu[$key]:--} | ${mem[$key]} MiB | $vs_peer | $vs_fla |"
}

report() {
    local M T
    echo "# train_kla GPU benchmark"
    echo
    echo "GPU: $gpu. Date: $started. Commit: $(git rev-parse --short HEAD 2> /dev/null || echo unknown)."
    # which attention train_klacu was built with (its run table says: cuDNN with USE_CUDNN=1, else its own kernels)
    local attention
    attention=$(grep -ohE 'attention: [^|]*[^ |]' "$logs"/train_klacu_attn_T*.log 2> /dev/null | head -n 1 || true)
    if [ -n "$attention" ]; then echo "train_klacu: $attention."; fi
    echo "B=$B (B=1 at T > 4096), $STEPS steps per run, timed over the last $((STEPS - WARMUP)) (the first $WARMUP are warm-up). 12 layers,"
    echo "width 768, 12 attention heads, position embedding of $MAX_SEQ_LEN rows (attn); the head-based recurrent mixers: 6 heads,"
    echo "dk = dv = 128; kalman: \`${MODEL_FLAGS[kalman]}\`; pdn, pgdn, pkda: \`${MODEL_FLAGS[pdn]}\`."
    echo
    echo "| program | model | B | T | ms/step | tok/s | MFU | peak mem | train_klacu / PyTorch peer | vs FLA GDN 242K tok/s (DESIGN.md figure, not measured) |"
    echo "|---|---|---|---|---|---|---|---|---|---|"
    for M in "${MODELS[@]}"; do
        for T in $(lens "$M"); do
            row train_klacu train_klacu "$M" "$T"
            if [ "$M" = attn ]; then row peer "PyTorch peer (torch.compile)" attn "$T"; fi
        done
    done
    echo
    echo "- train_klacu / PyTorch peer: tok/s ratio for the attn model (GPT-2 124M) at the same T, both measured in"
    echo "  this run; above 1, train_klacu is faster."
    echo "- vs FLA GDN: tok/s divided by $FLA_GDN_TOKS, DESIGN.md's figure for PyTorch with flash-linear-attention's Triton"
    echo "  GDN layers (eager, same trunk, 6 heads of 128, one H200, B=16, T=1024): not measured in this run, T=1024 rows"
    echo "  only, comparable only on an H200. DESIGN.md's attn figures on one H200 at T=1024, for comparison: llm.c"
    echo "  524K tok/s, PyTorch torch.compile 514K tok/s."
    echo "- MFU: train_klacu's own figure; the peer's is derived from it (train_klacu's attn MFU x peer tok/s / train_klacu"
    echo "  tok/s: same model, same FLOPs per token)."
    echo "- ms/step: train_klacu times each step (host clock, stream synchronised at its end) and averages; the peer"
    echo "  times the $((STEPS - WARMUP)) steps together between two torch.cuda.synchronize calls."
    echo "- peak mem: train_klacu's own figure (the device memory it allocates itself); the peer's is"
    echo "  torch.cuda.max_memory_allocated (tensors only). Neither counts the CUDA context nor library workspaces."
    echo
    for lab in "${LABS[@]}"; do
        echo "## kernel lab $LAB_DIR/$lab.cu (version ${lab_version[$lab]:-default}): ${status[lab/$lab]:-not run}"
        echo
        echo '```'
        echo "${lab_lines[$lab]:-(no output)}"
        echo '```'
    done
}

# the report so far into $OUT/bench_gpu.md, if $OUT is set
save_report() {
    if [ -n "${OUT:-}" ]; then report > "$OUT/bench_gpu.md"; fi
}

say "GPU: $gpu; logs in $logs"

# ---------------------------------------------------------------------------------------------------------------
# builds (only what is absent)

if [ ! -x ./train_klacu ]; then
    say "building train_klacu (make train_klacu)"
    if ! make train_klacu > "$logs/build_train_klacu.log" 2>&1; then
        say "make train_klacu failed (its rows will fail):"
        tail -n 10 "$logs/build_train_klacu.log" | sed 's/^/    /' >&2
    fi
fi
for lab in "${LABS[@]}"; do
    if [ ! -x "$LAB_DIR/${lab}_bin" ]; then
        say "building $LAB_DIR/${lab}_bin"
        if ! (cd "$LAB_DIR" && nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -I../.. "$lab.cu" -o "${lab}_bin") > "$logs/build_$lab.log" 2>&1; then
            say "building $lab failed:"
            tail -n 10 "$logs/build_$lab.log" | sed 's/^/    /' >&2
        fi
    fi
done

# ---------------------------------------------------------------------------------------------------------------
# the kernel labs: each validates and times its own kernels

# highest_lab_version LAB: the highest version the lab accepts (argv[1]), read from its source: the upper bound of
# its range check (`version > N`, as gdn_chunk_bwd.cu has), else the highest `case N:` (llm.c labs dispatch with
# switch (kernel_num)); empty when neither is found, and the lab then runs its own default
highest_lab_version() {
    local src=$LAB_DIR/$1.cu n
    n=$(grep -oE 'version[[:space:]]*(>|<=)[[:space:]]*[0-9]+' "$src" 2> /dev/null | grep -oE '[0-9]+$' | sort -n | tail -n 1)
    [ -n "$n" ] || n=$(grep -oE 'case[[:space:]]+[0-9]+[[:space:]]*:' "$src" 2> /dev/null | grep -oE '[0-9]+' | sort -n | tail -n 1)
    echo "$n"
}
for lab in "${LABS[@]}"; do
    version=$(highest_lab_version "$lab")
    [ "$lab" = gdn_chunk_bwd ] && version=${BENCH_GDN_VERSION:-$version}
    lab_version[$lab]=$version
    lab_log=$logs/$lab.log
    if [ ! -x "$LAB_DIR/${lab}_bin" ]; then
        fail "lab/$lab" "$LAB_DIR/${lab}_bin missing (build failed, see above)"
    else
        say "running $LAB_DIR/${lab}_bin ${version:-(no version argument)}"
        # ${version:+...}: no argument at all when no version is known
        run_logged "$lab_log" "$LAB_DIR/${lab}_bin" ${version:+"$version"}
        rc=$?
        if [ "$rc" = 0 ]; then status[lab/$lab]=ok; else fail "lab/$lab" "exit code $rc" "$lab_log"; fi
        # the version it reports and its timing lines ("timing ... backward 12.5 ms, 6.4 TFLOP/s"; llm.c labs:
        # "block_size N | time X ms | ... TFLOPS"); its last lines when none match
        lab_lines[$lab]=$(grep -iE 'version [0-9]|(^|[^a-z])ms([^a-z]|$)|tflop|gb/s' "$lab_log")
        [ -n "${lab_lines[$lab]}" ] || lab_lines[$lab]=$(tail -n 20 "$lab_log")
    fi
    save_report
done

# ---------------------------------------------------------------------------------------------------------------
# train_klacu: every model at every T

have_data=1
if ! compgen -G "data/demo/demo_train_*.bin" > /dev/null || ! compgen -G "data/demo/demo_val_*.bin" > /dev/null; then
    have_data=0
    say "no demo data: data/demo/demo_{train,val}_*.bin are missing. Make them with 'make data' on a machine with" \
        "the npm packages (the GPU machine has no network) and carry data/demo along; the train_klacu rows fail."
fi
for M in "${MODELS[@]}"; do
    for T in $(lens "$M"); do
        key=train_klacu/$M/$T
        log=$logs/train_klacu_${M}_T$T.log
        if [ ! -x ./train_klacu ]; then
            fail "$key" "./train_klacu missing (build failed, see above)"
        elif [ "$have_data" = 0 ]; then
            fail "$key" "no demo data (make data)"
        else
            say "train_klacu --mixer $M:12 ${MODEL_FLAGS[$M]} B=$(batch "$T") T=$T"
            # -u: the lr warmup. --mixer carries the layer count: a bare `attn` is one layer, refused with --depth 12.
            # --max-seq-len sizes attn's position embedding; the recurrent mixers have none
            # shellcheck disable=SC2086
            run_logged "$log" ./train_klacu -b "$(batch "$T")" -t "$T" -x "$STEPS" -v 0 -m 1 -g 0 -u "$WARMUP" \
                --depth 12 --width 768 --heads 12 --lin-heads 6 --dk 128 --dv 128 \
                --max-seq-len "$((T > MAX_SEQ_LEN ? T : MAX_SEQ_LEN))" --mixer "$M:12" ${MODEL_FLAGS[$M]}
            rc=$?
            line=$(grep 'summary | ms/step' "$log" | tail -n 1)
            if [ "$rc" != 0 ]; then
                fail "$key" "exit code $rc$([ "$rc" = 124 ] && echo ", over the ${RUN_TIMEOUT} s timeout")" "$log"
            elif [ -z "$line" ]; then
                fail "$key" "no summary line in the output" "$log"
            else
                record "$key" "$line"
            fi
        fi
        save_report
    done
done

# ---------------------------------------------------------------------------------------------------------------
# the PyTorch peer (attn) at every T, when attn is among the models

py=""
for candidate in python3 /usr/bin/python3; do
    if "$candidate" -c 'import torch' 2> /dev/null; then py=$candidate; break; fi
done
peer_lens=()
[[ " ${MODELS[*]} " == *" attn "* ]] && peer_lens=("${SEQ_LENS[@]}")
for T in "${peer_lens[@]}"; do
    key=peer/attn/$T
    log=$logs/peer_attn_T$T.log
    if [ -z "$py" ]; then
        fail "$key" "no python3 that imports torch"
    else
        say "PyTorch peer T=$T ($py)"
        run_logged "$log" "$py" scripts/bench_gpu_peer.py --B "$B" --T "$T" --steps "$STEPS" --warmup "$WARMUP" \
            --max-seq-len "$MAX_SEQ_LEN"
        rc=$?
        line=$(grep '^peer | attn' "$log" | tail -n 1)
        if [ "$rc" != 0 ]; then
            fail "$key" "exit code $rc$([ "$rc" = 124 ] && echo ", over the ${RUN_TIMEOUT} s timeout")" "$log"
        elif [ -z "$line" ]; then
            fail "$key" "no result line in the output" "$log"
        else
            record "$key" "$line"
            # the peer does not know the GPU's peak: its MFU is train_klacu's attn MFU scaled by the tok/s ratio
            kla_mfu=${mfu[train_klacu/attn/$T]:-}
            kla_mfu=${kla_mfu%\%}
            if [ "${status[train_klacu/attn/$T]:-}" = ok ] && [[ $kla_mfu =~ ^[0-9]+(\.[0-9]+)?$ ]]; then
                mfu[$key]=$(awk -v m="$kla_mfu" -v p="${tok[$key]}" -v c="${tok[train_klacu/attn/$T]}" \
                            'BEGIN { printf "%.1f%% (derived)", m * p / c }')
            fi
        fi
    fi
    save_report
done

# ---------------------------------------------------------------------------------------------------------------

report
if [ "$failures" -gt 0 ]; then
    say "$failures run(s) failed"
    exit 1
fi
