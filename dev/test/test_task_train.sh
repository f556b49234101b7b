#!/usr/bin/env bash
# Process-level tests of ./train_kla --task (tasks.h): bad task flags give one-line errors; a seed makes the same
# run twice and another seed a different one; a checkpoint records its task, so -e and -y 1 continue it (resume
# bit for bit); the accuracy lines reach main.log; a tiny model learns a short task well above chance.
# Needs no data files. Prints PASS/FAIL lines.
set -uo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

source dev/test/expect_error.sh  # pass, fail, expect_error

# a tiny recurrent model: a few milliseconds per step on one core
TINY=(--mixer gdn:2 --width 32 --heads 2 -b 16 -l 1e-2 -u 10 -k constant -m 8)

# ---- bad task flags
expect_error "unknown task" "--task" "parity" "mqar" "a5" -- ./train_kla --task parity -x 5
expect_error "more pairs than fit" "--task-len" "pairs" -- ./train_kla --task mqar --task-len 32 --task-pairs 16 -x 5
expect_error "zoology: more pairs than fit" "--task-len" "4*pairs" -- ./train_kla --task mqar-zoology --task-len 64 --task-pairs 20 -x 5
expect_error "zoology: more keys than the vocabulary" "--task-pairs" "keys" -- ./train_kla --task mqar-zoology --task-vocab 16 --task-len 64 --task-pairs 8 -x 5
expect_error "length too short" "--task-len" "too short" -- ./train_kla --task stack --task-len 2 -x 5
expect_error "eval length too short" "--task-eval" "pairs" -- ./train_kla --task mqar --task-len 128 --task-eval 256,40 -x 5
expect_error "bad eval list" "--task-eval" -- ./train_kla --task a5 --task-eval 16,x -x 5
expect_error "fixed vocabulary" "--task-vocab" "stack" "128" -- ./train_kla --task stack --task-vocab 64 -x 5
expect_error "sniah has one pair" "--task-pairs" "sniah" -- ./train_kla --task sniah --task-pairs 2 -x 5
expect_error "task flag without --task" "--task-len" "needs --task" -- ./train_kla --task-len 64
expect_error "-t with a task" "-t" "--task-len" -- ./train_kla --task a5 -t 64 -x 5
expect_error "shards with a task" "-i" -- ./train_kla --task a5 -i 'data/demo/demo_train_*.bin' -x 5
expect_error "a task needs -x" "-x" "steps" -- ./train_kla --task a5
expect_error "samples with a task" "-g" -- ./train_kla --task a5 -x 5 -g 10
expect_error "attn: training length beyond max_seq_len" "--task-len" "max_seq_len" -- ./train_kla --task a5 --task-len 40 --mixer attn:1 --max-seq-len 32 -x 1 -v 0

# ---- attn evaluates only the lengths its position embedding covers; each length is one line in main.log
./train_kla --task a5 --task-len 16 --task-eval 32,64 --mixer attn:1 --width 32 --heads 2 --max-seq-len 32 -b 4 -x 2 -m 1 \
    -o "$tmp/attn" > "$tmp/attn.out" 2>&1
if grep -q "val len 64 | skipped" "$tmp/attn.out" && grep -q "test len 32 | loss" "$tmp/attn.out" &&
   grep -q "s:2 test_len:32 loss" "$tmp/attn/main.log" && ! grep -q "len:64" "$tmp/attn/main.log"; then
    pass "attn: lengths beyond max_seq_len are skipped with a note, the others evaluated and logged"
else
    fail "attn: lengths beyond max_seq_len are skipped with a note, the others evaluated and logged" "$(grep -E 'len|error' "$tmp/attn.out" | head -5)"
fi

# ---- a seed makes the same run; another seed another one (negative control)
run_a5() { ./train_kla --task a5 --task-len 12 --task-eval 24 "${TINY[@]}" -x 6 -v 3 --seed "$1" -o "$2" > /dev/null 2>&1; }
run_a5 5 "$tmp/s1"; run_a5 5 "$tmp/s2"; run_a5 6 "$tmp/s3"
if cmp -s "$tmp/s1/main.log" "$tmp/s2/main.log" && ! cmp -s "$tmp/s1/main.log" "$tmp/s3/main.log" &&
   [ "$(grep -c 'len:24 ' "$tmp/s1/main.log")" -eq 4 ]; then
    pass "same seed, same data and main.log (4 lines at the eval length); another seed differs"
else
    fail "same seed, same data and main.log; another seed differs" "$(diff "$tmp/s1/main.log" "$tmp/s2/main.log" | head -3)"
fi

# ---- the checkpoint records the task: -y 1 resumes bit for bit, -e picks the task up without task flags
# (validation at the resume step too: main.log keeps its tel and val_len lines once, as the uninterrupted run's)
./train_kla --task stack --task-len 24 --task-eval 48 "${TINY[@]}" -x 8 -n 4 -v 4 -o "$tmp/full" > /dev/null 2>&1
./train_kla --task stack --task-len 24 --task-eval 48 "${TINY[@]}" -x 8 -n 4 -v 4 -o "$tmp/part" > /dev/null 2>&1
rm -f "$tmp/part/DONE_00000008" "$tmp/part/model_00000008.bin" "$tmp/part/state_00000008.bin"
./train_kla --task stack --task-len 24 --task-eval 48 "${TINY[@]}" -x 8 -n 4 -v 4 -o "$tmp/part" -y 1 > "$tmp/resume.out" 2>&1
if grep -q "resuming from .*model_00000004.bin" "$tmp/resume.out" && cmp -s "$tmp/full/model_00000008.bin" "$tmp/part/model_00000008.bin" &&
   cmp -s "$tmp/full/main.log" "$tmp/part/main.log" && [ "$(grep -c '^s:4 val_len:' "$tmp/part/main.log")" -eq 2 ]; then
    pass "task run resumed from step 4 ends bit-identical to the uninterrupted run, main.log line for line"
else
    fail "task run resumed from step 4 ends bit-identical to the uninterrupted run, main.log line for line" \
        "$(tail -2 "$tmp/resume.out"; diff "$tmp/full/main.log" "$tmp/part/main.log" | head -4)"
fi
./train_kla -e "$tmp/full/model_00000008.bin" -b 16 -x 1 -m 2 > "$tmp/e.out" 2>&1
if grep -q "| task .*stack, vocab 128, length 24" "$tmp/e.out" && grep -q "test len 24 | loss" "$tmp/e.out"; then
    pass "-e of a task checkpoint runs its task with no task flags"
else
    fail "-e of a task checkpoint runs its task with no task flags" "$(tail -2 "$tmp/e.out")"
fi
expect_error "-e with another task" "--task" "stack" "mqar" -- ./train_kla -e "$tmp/full/model_00000008.bin" --task mqar -x 1
expect_error "-e with another task length" "--task-len" "24" -- ./train_kla -e "$tmp/full/model_00000008.bin" --task stack --task-len 30 -x 1

# ---- a tiny model learns a short task: stack at length 30 (10 operations), 500 steps. The labels are the 26
# stack values, so a model that cannot read the stacks scores about 1/26 = 0.04; we ask for 0.2 on the test split
# (seeds 1, 3, 7 reached 0.35, 0.65, 0.62; at 300 steps seed 1 was still at 0.10).
start=$(date +%s)
./train_kla --task stack --task-len 30 "${TINY[@]}" -x 500 -v 0 --seed 7 -o "$tmp/learn" > "$tmp/learn.out" 2>&1
secs=$(( $(date +%s) - start ))
acc=$(sed -n 's/^s:500 test_len:30 loss:[0-9.]* acc:\([0-9.]*\)$/\1/p' "$tmp/learn/main.log")
if [ -n "$acc" ] && awk -v a="$acc" 'BEGIN { exit !(a > 0.2) }'; then
    pass "tiny gdn model learns stack (length 30) in 500 steps: test accuracy $acc > 0.2 (chance 0.04), ${secs}s"
else
    fail "tiny gdn model learns stack (length 30) in 500 steps" "test accuracy '${acc}' (chance 0.04), ${secs}s: $(tail -2 "$tmp/learn.out")"
fi
