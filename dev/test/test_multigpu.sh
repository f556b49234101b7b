#!/usr/bin/env bash
# test_multigpu.sh: data-parallel training on R GPUs (README "Multi-GPU"; make test-gpu runs it with R = 2 on a
# machine with 2 or more GPUs, and again with R = 4 where there are 4). Needs build/train_klacu_{fp32,bf16} built
# with NCCL and the demo shards. In both precisions:
#   1. R ranks of B rows = 1 rank accumulating R micro-batches of B rows: the same tokens (the ranks split each
#      batch's rows as the micro-batches do), so the 10 losses agree to the rounding of the gradient sums;
#      negative control: 1 rank without accumulation (1/R of the tokens) must miss the tolerance;
#   2. ZeRO-1 (-z 1) = no ZeRO: losses, final weights and AdamW state bit for bit at R = 2 (the reduce-scatter sums
#      the same two numbers as the all-reduce, and the norm is summed the same way in both). At R > 2 NCCL may add
#      the R numbers in another order in the two collectives, so there the losses must agree within test 1's
#      tolerance, and the line says whether they were bit for bit;
#   3. a resumed R-rank run (-y 1 from the step-5 checkpoint) = the uninterrupted one, bit for bit;
#   4. the R-rank checkpoint resumes on 1 rank (one line says where the data go on) and follows the R-rank run
#      within test 1's tolerance; a 1-rank checkpoint resumes on R ranks;
#   5. one-line errors: -d not a multiple of B*T*ranks, --eval on several ranks;
#   6. with MPIRUN set (e.g. MPIRUN="mpirun --allow-run-as-root -np"), the same run launched by mpirun gives the
#      launch.sh run's losses bit for bit.
# MULTIGPU_RANKS=R (default 2); MULTIGPU_PRECISIONS="fp32 bf16" (the default) picks the builds of tests 1-4.
# Prints PASS/FAIL lines; exit code 1 if any failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
R=${MULTIGPU_RANKS:-2}
failures=0
pass() { echo "PASS multi-GPU: $*"; }
fail() { echo "FAIL multi-GPU: $*"; failures=$((failures + 1)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# the step lines' losses (rank 0's stdout), space-separated
losses() { sed -n 's/^step *[0-9]*\/[0-9]* | loss \([0-9.]*\) .*/\1/p' "$1" | tr '\n' ' '; }
# max relative difference of two equally long lists ("" when their lengths differ or they are empty)
max_rel() { awk -v a="$1" -v b="$2" 'BEGIN { n = split(a, x, " "); m = split(b, y, " "); if (n != m || n == 0) { exit };
    w = 0; for (i = 1; i <= n; i++) { d = x[i] - y[i]; d = d < 0 ? -d : d; r = d / (y[i] < 0 ? -y[i] : y[i]); if (r > w) { w = r } }
    printf "%.2e", w }'; }
le() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a != "" && a + 0 <= b + 0) }'; }
# a hybrid of attention and gdn, 10 steps of R x 4 x 256 tokens; the runs with -o checkpoint every 5 steps
MODEL=(--mixer attn:1,gdn:1 --width 128 --heads 4 --lin-heads 2 --dk 64 --dv 64 -b 4 -t 256 -x 10 -v 5 -m 4 -g 0
       -l 3e-3 -u 2 -i 'data/demo/demo_train_*.bin' -j data/demo/demo_val_000000.bin)
launchR() { bash scripts/launch.sh "$R" "$@"; }
# test 1's tolerance, relative, on the 10 losses: in fp32 the two runs sum the same per-micro-batch gradients in
# another order (a rounding of 6e-8 relative per sum, grown through 10 AdamW steps); in bf16 the weights' bf16
# copy of a master that differs in its last bits can round the other way, which moves a loss by up to ~1e-3
declare -A TOL=([fp32]=2e-5 [bf16]=5e-3)

for p in ${MULTIGPU_PRECISIONS-fp32 bf16}; do
    bin=./build/train_klacu_$p
    d=$tmp/$p
    mkdir -p "$d"
    launchR "$bin" "${MODEL[@]}" -d $((1024 * R)) -n 5 -o "$d/many" > "$d/many.out" 2>&1 || { fail "$p: $R ranks: $(tail -3 "$d/many.out")"; continue; }
    "$bin" "${MODEL[@]}" -d $((1024 * R)) -n 5 -o "$d/one" > "$d/one.out" 2>&1 || fail "$p: 1 rank, accumulation $R: $(tail -3 "$d/one.out")"
    "$bin" "${MODEL[@]}" -d 1024 > "$d/few.out" 2>&1 || fail "$p: 1 rank, no accumulation: $(tail -3 "$d/few.out")"
    many=$(losses "$d/many.out"); one=$(losses "$d/one.out"); few=$(losses "$d/few.out")
    rel=$(max_rel "$many" "$one"); rel_few=$(max_rel "$few" "$one")
    if grep -q "$R ranks (RANK/WORLD_SIZE)" "$d/many.out" && le "$rel" "${TOL[$p]}"; then
        pass "$p: $R ranks x B 4 = 1 rank x B 4 x accumulation $R: 10 losses within $rel (tol ${TOL[$p]})"
    else
        fail "$p: $R ranks '$many' against 1 rank with accumulation '$one': max rel '$rel' (tol ${TOL[$p]})"
    fi
    if [ -n "$rel_few" ] && ! le "$rel_few" "${TOL[$p]}"; then
        pass "$p: negative control: 1 rank without accumulation (1/$R of the tokens) differs by $rel_few, caught"
    else
        fail "$p: negative control not caught: '$few' against '$one' ($rel_few)"
    fi

    # 2. ZeRO-1 against no ZeRO: bit for bit at 2 ranks; at more, within test 1's tolerance (see the header)
    launchR "$bin" "${MODEL[@]}" -d $((1024 * R)) -z 1 -n 5 -o "$d/zero" > "$d/zero.out" 2>&1 || fail "$p: -z 1: $(tail -3 "$d/zero.out")"
    zero=$(losses "$d/zero.out")
    if [ "$zero" = "$many" ] && cmp -s "$d/zero/model_00000010.bin" "$d/many/model_00000010.bin" &&
        cmp -s "$d/zero/state_00000010.bin" "$d/many/state_00000010.bin"; then
        pass "$p: ZeRO-1 = no ZeRO on $R ranks: losses, weights and AdamW state of step 10 bit for bit"
    elif [ "$R" -gt 2 ] && rel=$(max_rel "$zero" "$many") && le "$rel" "${TOL[$p]}"; then
        pass "$p: ZeRO-1 = no ZeRO on $R ranks: 10 losses within $rel (tol ${TOL[$p]}), not bit for bit"
    else
        fail "$p: ZeRO-1 differs from no ZeRO: losses '$zero' against '$many'; $(cmp "$d/zero/model_00000010.bin" "$d/many/model_00000010.bin" 2>&1)"
    fi

    # 3. resume on $R ranks from step 5, bit for bit (ZeRO-1: its sharded state went through the checkpoint)
    cp -r "$d/zero" "$d/resumed"
    rm -f "$d/resumed/"*_00000010.bin
    launchR "$bin" -o "$d/resumed" -y 1 -z 1 > "$d/resumed.out" 2>&1 || fail "$p: resume on $R ranks: $(tail -3 "$d/resumed.out")"
    if cmp -s "$d/resumed/model_00000010.bin" "$d/zero/model_00000010.bin" && cmp -s "$d/resumed/state_00000010.bin" "$d/zero/state_00000010.bin" &&
        cmp -s "$d/resumed/main.log" "$d/zero/main.log"; then
        pass "$p: a $R-rank run resumed from step 5 ends bit for bit as the uninterrupted one (weights, AdamW state, main.log)"
    else
        fail "$p: resumed $R-rank run differs: $(cmp "$d/resumed/model_00000010.bin" "$d/zero/model_00000010.bin" 2>&1)"
    fi

    # 4. the $R-rank checkpoint on 1 rank, and a 1-rank checkpoint on $R ranks
    cp -r "$d/many" "$d/on_one"
    rm -f "$d/on_one/"*_00000010.bin
    "$bin" -o "$d/on_one" -y 1 > "$d/on_one.out" 2>&1
    rc=$?
    tail_many=$(losses "$d/many.out" | cut -d' ' -f6-10); tail_one=$(losses "$d/on_one.out")
    rel=$(max_rel "$tail_one" "$tail_many")
    if [ $rc -eq 0 ] && grep -q "^data: the checkpoint's batches were B\*processes = 4\*$R rows, now 4\*1: the stream goes on" "$d/on_one.out" &&
        le "$rel" "${TOL[$p]}"; then
        pass "$p: a $R-rank checkpoint resumes on 1 rank: the data line, and steps 6-10 within $rel of the $R-rank run"
    else
        fail "$p: $R-rank checkpoint on 1 rank: exit $rc, losses '$tail_one' against '$tail_many' ($rel): $(grep -m1 '^data:' "$d/on_one.out")"
    fi
    cp -r "$d/one" "$d/on_many"
    rm -f "$d/on_many/"*_00000010.bin
    launchR "$bin" -o "$d/on_many" -y 1 > "$d/on_many.out" 2>&1
    rc=$?
    rel=$(max_rel "$(losses "$d/on_many.out")" "$(losses "$d/one.out" | cut -d' ' -f6-10)")
    if [ $rc -eq 0 ] && grep -q "^data: the checkpoint's batches were B\*processes = 4\*1 rows, now 4\*$R" "$d/on_many.out" && le "$rel" "${TOL[$p]}"; then
        pass "$p: a 1-rank checkpoint resumes on $R ranks: the data line, and steps 6-10 within $rel of the 1-rank run"
    else
        fail "$p: 1-rank checkpoint on $R ranks: exit $rc ($rel): $(tail -2 "$d/on_many.out")"
    fi

done

# 5. errors
bin=./build/train_klacu_bf16
out=$(launchR "$bin" "${MODEL[@]}" -d 1024 2>&1)
rc=$?
if [ $rc -eq 1 ] && echo "$out" | grep -q "^error: flag -d: 1024 is not a multiple of B\*T\*ranks = 4\*256\*$R$"; then
    pass "-d not a multiple of B*T*ranks: one line, exit 1"
else
    fail "-d 1024 on $R ranks: exit $rc: $out"
fi
out=$(launchR "$bin" -e "$tmp/bf16/many/model_00000010.bin" --eval 1 2>&1)
rc=$?
if [ $rc -eq 1 ] && echo "$out" | grep -q "^error: --eval runs in one process: start it without mpirun or srun$" &&
    ! echo "$out" | grep "^error: " | grep -vq "^error: --eval runs in one process: start it without mpirun or srun$"; then
    pass "--eval on $R ranks: one line per rank, whole, exit 1"
else
    fail "--eval on $R ranks: exit $rc: $out"
fi

# 6. mpirun, when there is one: the same program launched by mpirun and by launch.sh, the same losses
if [ -n "${MPIRUN:-}" ]; then
    bin=${MPI_TRAIN_KLACU:-./build/train_klacu_bf16}
    launchR "$bin" "${MODEL[@]}" -d $((1024 * R)) > "$tmp/launch.out" 2>&1
    $MPIRUN $R "$bin" "${MODEL[@]}" -d $((1024 * R)) > "$tmp/mpi.out" 2>&1
    rc=$?
    if [ $rc -eq 0 ] && [ -n "$(losses "$tmp/mpi.out")" ] && [ "$(losses "$tmp/mpi.out")" = "$(losses "$tmp/launch.out")" ] &&
        grep -q "$R ranks (mpirun" "$tmp/mpi.out"; then
        pass "launched by mpirun ($(grep -o 'multi-GPU: .*' "$tmp/mpi.out" | head -1)): launch.sh's losses bit for bit"
    else
        fail "mpirun: exit $rc, losses '$(losses "$tmp/mpi.out")' against '$(losses "$tmp/launch.out")': $(tail -3 "$tmp/mpi.out")"
    fi
fi
[ $failures -eq 0 ]
