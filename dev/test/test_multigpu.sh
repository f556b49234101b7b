#!/usr/bin/env bash
# test_multigpu.sh: data-parallel training on 2 GPUs (README "Multi-GPU"; make test-gpu runs it on a machine with
# 2 or more GPUs). Needs build/train_klacu_{fp32,bf16} built with NCCL and the demo shards. In both precisions:
#   1. 2 ranks of B rows = 1 rank accumulating 2 micro-batches of B rows: the same tokens (the ranks split each
#      batch's rows as the micro-batches do), so the 10 losses agree to the rounding of the gradient sums;
#      negative control: 1 rank without accumulation (half the tokens) must miss the tolerance;
#   2. ZeRO-1 (-z 1) = no ZeRO: losses, final weights and AdamW state bit for bit (with 2 ranks the reduce-scatter
#      sums the same two numbers as the all-reduce, and the norm is summed the same way in both);
#   3. a resumed 2-rank run (-y 1 from the step-5 checkpoint) = the uninterrupted one, bit for bit;
#   4. the 2-rank checkpoint resumes on 1 rank (one line says where the data go on) and follows the 2-rank run
#      within test 1's tolerance; a 1-rank checkpoint resumes on 2 ranks;
#   5. one-line errors: -d not a multiple of B*T*ranks, --eval on several ranks;
#   6. with MPIRUN set (e.g. MPIRUN="mpirun --allow-run-as-root -np"), the same run launched by mpirun gives the
#      launch.sh run's losses bit for bit.
# MULTIGPU_PRECISIONS="fp32 bf16" (the default) picks the builds of tests 1-4. Prints PASS/FAIL lines; exit code 1
# if any failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
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
# a hybrid of attention and gdn, 10 steps of 2 x 4 x 256 tokens; the runs with -o checkpoint every 5 steps
MODEL=(--mixer attn:1,gdn:1 --width 128 --heads 4 --lin-heads 2 --dk 64 --dv 64 -b 4 -t 256 -x 10 -v 5 -m 4 -g 0
       -l 3e-3 -u 2 -i 'data/demo/demo_train_*.bin' -j data/demo/demo_val_000000.bin)
launch2() { bash scripts/launch.sh 2 "$@"; }
# test 1's tolerance, relative, on the 10 losses: in fp32 the two runs sum the same per-rank gradients in
# another order (a rounding of 6e-8 relative per sum, grown through 10 AdamW steps); in bf16 the weights' bf16
# copy of a master that differs in its last bits can round the other way, which moves a loss by up to ~1e-3
declare -A TOL=([fp32]=2e-5 [bf16]=5e-3)

for p in ${MULTIGPU_PRECISIONS-fp32 bf16}; do
    bin=./build/train_klacu_$p
    d=$tmp/$p
    mkdir -p "$d"
    launch2 "$bin" "${MODEL[@]}" -d 2048 -n 5 -o "$d/two" > "$d/two.out" 2>&1 || { fail "$p: 2 ranks: $(tail -3 "$d/two.out")"; continue; }
    "$bin" "${MODEL[@]}" -d 2048 -n 5 -o "$d/one" > "$d/one.out" 2>&1 || fail "$p: 1 rank, accumulation 2: $(tail -3 "$d/one.out")"
    "$bin" "${MODEL[@]}" -d 1024 > "$d/half.out" 2>&1 || fail "$p: 1 rank, no accumulation: $(tail -3 "$d/half.out")"
    two=$(losses "$d/two.out"); one=$(losses "$d/one.out"); half=$(losses "$d/half.out")
    rel=$(max_rel "$two" "$one"); rel_half=$(max_rel "$half" "$one")
    if grep -q "2 ranks (RANK/WORLD_SIZE)" "$d/two.out" && le "$rel" "${TOL[$p]}"; then
        pass "$p: 2 ranks x B 4 = 1 rank x B 4 x accumulation 2: 10 losses within $rel (tol ${TOL[$p]})"
    else
        fail "$p: 2 ranks '$two' against 1 rank with accumulation '$one': max rel '$rel' (tol ${TOL[$p]})"
    fi
    if [ -n "$rel_half" ] && ! le "$rel_half" "${TOL[$p]}"; then
        pass "$p: negative control: 1 rank without accumulation (half the tokens) differs by $rel_half, caught"
    else
        fail "$p: negative control not caught: '$half' against '$one' ($rel_half)"
    fi

    # 2. ZeRO-1 against no ZeRO, bit for bit
    launch2 "$bin" "${MODEL[@]}" -d 2048 -z 1 -n 5 -o "$d/zero" > "$d/zero.out" 2>&1 || fail "$p: -z 1: $(tail -3 "$d/zero.out")"
    if [ "$(losses "$d/zero.out")" = "$two" ] && cmp -s "$d/zero/model_00000010.bin" "$d/two/model_00000010.bin" &&
        cmp -s "$d/zero/state_00000010.bin" "$d/two/state_00000010.bin"; then
        pass "$p: ZeRO-1 = no ZeRO: losses, weights and AdamW state of step 10 bit for bit"
    else
        fail "$p: ZeRO-1 differs from no ZeRO: losses '$(losses "$d/zero.out")' against '$two'; $(cmp "$d/zero/model_00000010.bin" "$d/two/model_00000010.bin" 2>&1)"
    fi

    # 3. resume on 2 ranks from step 5, bit for bit (ZeRO-1: its sharded state went through the checkpoint)
    cp -r "$d/zero" "$d/resumed"
    rm -f "$d/resumed/"*_00000010.bin
    launch2 "$bin" -o "$d/resumed" -y 1 -z 1 > "$d/resumed.out" 2>&1 || fail "$p: resume on 2 ranks: $(tail -3 "$d/resumed.out")"
    if cmp -s "$d/resumed/model_00000010.bin" "$d/zero/model_00000010.bin" && cmp -s "$d/resumed/state_00000010.bin" "$d/zero/state_00000010.bin" &&
        cmp -s "$d/resumed/main.log" "$d/zero/main.log"; then
        pass "$p: a 2-rank run resumed from step 5 ends bit for bit as the uninterrupted one (weights, AdamW state, main.log)"
    else
        fail "$p: resumed 2-rank run differs: $(cmp "$d/resumed/model_00000010.bin" "$d/zero/model_00000010.bin" 2>&1)"
    fi

    # 4. the 2-rank checkpoint on 1 rank, and a 1-rank checkpoint on 2 ranks
    cp -r "$d/two" "$d/on_one"
    rm -f "$d/on_one/"*_00000010.bin
    "$bin" -o "$d/on_one" -y 1 > "$d/on_one.out" 2>&1
    rc=$?
    tail_two=$(losses "$d/two.out" | cut -d' ' -f6-10); tail_one=$(losses "$d/on_one.out")
    rel=$(max_rel "$tail_one" "$tail_two")
    if [ $rc -eq 0 ] && grep -q "^data: the checkpoint's batches were B\*processes = 4\*2 rows, now 4\*1: the stream goes on" "$d/on_one.out" &&
        le "$rel" "${TOL[$p]}"; then
        pass "$p: a 2-rank checkpoint resumes on 1 rank: the data line, and steps 6-10 within $rel of the 2-rank run"
    else
        fail "$p: 2-rank checkpoint on 1 rank: exit $rc, losses '$tail_one' against '$tail_two' ($rel): $(grep -m1 '^data:' "$d/on_one.out")"
    fi
    cp -r "$d/one" "$d/on_two"
    rm -f "$d/on_two/"*_00000010.bin
    launch2 "$bin" -o "$d/on_two" -y 1 > "$d/on_two.out" 2>&1
    rc=$?
    rel=$(max_rel "$(losses "$d/on_two.out")" "$(losses "$d/one.out" | cut -d' ' -f6-10)")
    if [ $rc -eq 0 ] && grep -q "^data: the checkpoint's batches were B\*processes = 4\*1 rows, now 4\*2" "$d/on_two.out" && le "$rel" "${TOL[$p]}"; then
        pass "$p: a 1-rank checkpoint resumes on 2 ranks: the data line, and steps 6-10 within $rel of the 1-rank run"
    else
        fail "$p: 1-rank checkpoint on 2 ranks: exit $rc ($rel): $(tail -2 "$d/on_two.out")"
    fi

done

# 5. errors
bin=./build/train_klacu_bf16
out=$(launch2 "$bin" "${MODEL[@]}" -d 1024 2>&1)
rc=$?
if [ $rc -eq 1 ] && echo "$out" | grep -q "^error: flag -d: 1024 is not a multiple of B\*T\*ranks = 4\*256\*2$"; then
    pass "-d not a multiple of B*T*ranks: one line, exit 1"
else
    fail "-d 1024 on 2 ranks: exit $rc: $out"
fi
out=$(launch2 "$bin" -e "$tmp/bf16/two/model_00000010.bin" --eval 1 2>&1)
rc=$?
if [ $rc -eq 1 ] && echo "$out" | grep -q "^error: --eval runs in one process: start it without mpirun or srun$" &&
    ! echo "$out" | grep "^error: " | grep -vq "^error: --eval runs in one process: start it without mpirun or srun$"; then
    pass "--eval on 2 ranks: one line per rank, whole, exit 1"
else
    fail "--eval on 2 ranks: exit $rc: $out"
fi

# 6. mpirun, when there is one: the same program launched by mpirun and by launch.sh, the same losses
if [ -n "${MPIRUN:-}" ]; then
    bin=${MPI_TRAIN_KLACU:-./build/train_klacu_bf16}
    launch2 "$bin" "${MODEL[@]}" -d 2048 > "$tmp/launch.out" 2>&1
    $MPIRUN 2 "$bin" "${MODEL[@]}" -d 2048 > "$tmp/mpi.out" 2>&1
    rc=$?
    if [ $rc -eq 0 ] && [ -n "$(losses "$tmp/mpi.out")" ] && [ "$(losses "$tmp/mpi.out")" = "$(losses "$tmp/launch.out")" ] &&
        grep -q "2 ranks (mpirun" "$tmp/mpi.out"; then
        pass "launched by mpirun ($(grep -o 'multi-GPU: .*' "$tmp/mpi.out" | head -1)): launch.sh's losses bit for bit"
    else
        fail "mpirun: exit $rc, losses '$(losses "$tmp/mpi.out")' against '$(losses "$tmp/launch.out")': $(tail -3 "$tmp/mpi.out")"
    fi
fi
[ $failures -eq 0 ]
