#!/usr/bin/env bash
# Process-level tests of the multiple-choice evaluation (--hellaswag, README "HellaSwag"), on small eval files that
# scripts/hellaswag.py --from-shards cuts out of the demo val split (no network): a model trained for a few steps
# picks the true continuation far above chance, the same run's untrained model (step 0) and a file of random labels
# score near chance; --eval from the checkpoint gives the training run's count, whatever -b; the accuracy reaches
# main.log once per step, also across -y 1; every mixer runs it; bad eval files and flags give one-line errors.
# Needs the demo data (make data) and /usr/bin/python3 (standard library only). Prints PASS/FAIL lines.
set -uo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source dev/test/expect_error.sh  # pass, fail, expect_error

VAL="data/demo/demo_val_*.bin"
N=60  # examples of each file
make_file() {  # make_file OUT [generator flags]: N examples, contexts of 16 tokens, completions of 4
    local out=$1; shift
    /usr/bin/python3 scripts/hellaswag.py --from-shards "$VAL" -n $N --context 16 --completion 4 -o "$out" "$@" > /dev/null
}
# The wrong completions are random token ids: a model that has learned which tokens are common (a few dozen steps)
# tells the true continuation from them. (Against spans of other documents, the file scripts/hellaswag.py makes by
# default, the model of this test after 200 steps scored 28/100: telling those apart needs a model that reads the
# context, more training than a test can afford on 2 cores.)
make_file "$tmp/choice.bin" --distractors random && make_file "$tmp/shuffled.bin" --distractors random --shuffle-labels
if [ -s "$tmp/choice.bin" ] && [ -s "$tmp/shuffled.bin" ]; then pass "scripts/hellaswag.py --from-shards writes the eval files"; else fail "generator" "no eval file"; exit 0; fi

# Chance is 1/4. Of N = 60 guesses at random, the count correct is binomial(60, 1/4): mean 15, sd 3.35; the band
# [6, 24] is the mean +- 2.7 sd (a false alarm about once in 150 runs of a fixed seed, and the seeds are fixed).
# The trained bound: this model scored 57/60 after 50 steps and 58/60 after 100 (measured); 40 must clear 40/60.
in_chance_band() { [ "$1" -ge 6 ] && [ "$1" -le 24 ]; }
count_of() { sed -n "s/^step $1 | hellaswag \([0-9]*\)\/$N = .*/\1/p" "$2" | head -1; }

SMALL=(--width 64 --depth 2 --heads 2 -b 8 -t 32 -v 0 -m 1 -g 0)
./train_kla "${SMALL[@]}" -x 40 -n 40 -o "$tmp/run" --hellaswag "$tmp/choice.bin" --hellaswag-every 20 > "$tmp/train.out" 2>&1
untrained=$(count_of 0 "$tmp/train.out")
trained=$(count_of 40 "$tmp/train.out")
if [ -n "$untrained" ] && in_chance_band "$untrained"; then pass "the untrained model (step 0) is near chance: $untrained/$N"; else fail "untrained near chance" "got '$untrained'/$N ($(tail -2 "$tmp/train.out" | head -c 300))"; fi
if [ -n "$trained" ] && [ "$trained" -ge 40 ]; then pass "after 40 steps the model picks the true continuation: $trained/$N"; else fail "trained above chance" "got '$trained'/$N, expected >= 40"; fi
lines=$(grep -c ' eval:' "$tmp/run/main.log")
acc40=$(sed -n 's/^s:40 eval:\(.*\)/\1/p' "$tmp/run/main.log")
expected=$(awk -v c="$trained" -v n=$N 'BEGIN { printf "%.4f", c / n }')
if [ "$lines" = 3 ] && grep -q '^s:0 eval:' "$tmp/run/main.log" && grep -q '^s:20 eval:' "$tmp/run/main.log" && [ "$acc40" = "$expected" ]; then
    pass "main.log has s:<step> eval:<accuracy> at steps 0, 20, 40 (s:40 eval:$acc40)"
else
    fail "main.log eval lines" "$lines lines, s:40 eval:'$acc40', expected $expected"
fi

# ---- the checkpoint: --eval gives the training run's count, with any batch (rows of one example split across
# batches with -b 3, a partly padded last batch with -b 7); each row is scored alone, so the count is the same
model="$tmp/run/model_00000040.bin"
for b in 8 3 7; do
    ./train_kla -e "$model" --eval 1 -m 1 -b $b --hellaswag "$tmp/choice.bin" > "$tmp/eval.out" 2>&1
    got=$(count_of 40 "$tmp/eval.out")
    [ "$got" = "$trained" ] && pass "--eval -b $b from the checkpoint: $got/$N, as the training run" || fail "--eval -b $b" "got '$got', training gave $trained"
done
./train_kla -e "$model" --eval 1 -m 1 --hellaswag "$tmp/shuffled.bin" > "$tmp/eval.out" 2>&1
got=$(count_of 40 "$tmp/eval.out")
if [ -n "$got" ] && in_chance_band "$got"; then pass "negative control: random labels score near chance with the trained model: $got/$N"; else fail "random labels near chance" "got '$got'/$N"; fi
./train_kla -e "$model" --eval 1 -m 1 --hellaswag "$tmp/choice.bin" --hellaswag-max 10 > "$tmp/eval.out" 2>&1
grep -q '^step 40 | hellaswag [0-9]*/10 = ' "$tmp/eval.out" && pass "--hellaswag-max 10 scores the first 10 examples" || fail "--hellaswag-max" "$(tail -1 "$tmp/eval.out")"

# ---- -y 1 keeps --hellaswag (a run flag) and logs each step's accuracy once: the one of step 40 is evaluated again
./train_kla -o "$tmp/run" -y 1 -x 60 > "$tmp/resume.out" 2>&1
steps=$(sed -n 's/^s:\([0-9]*\) eval:.*/\1/p' "$tmp/run/main.log" | tr '\n' ' ')
[ "$steps" = "0 20 40 60 " ] && pass "-y 1 keeps --hellaswag; main.log has each step's accuracy once (steps $steps)" || fail "resume eval lines" "steps '$steps'"

# ---- every mixer runs it (one model of all eight; only the forward pass is used)
ALL=(--mixer attn:1,gdn:1,kaczmarz:1,kalman:1,gka:1,pdn:1,pgdn:1,pkda:1 --width 32 --heads 2 --lin-heads 2 --dk 16 --dv 16)
./train_kla "${ALL[@]}" -b 4 -t 16 -x 1 -v 0 -m 1 -g 0 --hellaswag "$tmp/choice.bin" --hellaswag-max 8 > "$tmp/all.out" 2>&1
grep -q '^step 1 | hellaswag [0-9]*/8 = ' "$tmp/all.out" && pass "every mixer (a model of all eight) is scored" || fail "all mixers" "$(tail -1 "$tmp/all.out")"

# ---- bad eval files: one line, exit 1
edit() {  # edit IN OUT PYTHON: OUT = IN's bytes b after the statement PYTHON
    /usr/bin/python3 -c "import struct, sys; b = bytearray(open(sys.argv[1], 'rb').read()); $3; open(sys.argv[2], 'wb').write(b)" "$1" "$2"
}
edit "$tmp/choice.bin" "$tmp/magic.bin" "b[0:4] = struct.pack('<i', 20240520)"
edit "$tmp/choice.bin" "$tmp/trunc.bin" "b = b[:-10]"
edit "$tmp/choice.bin" "$tmp/label.bin" "b[1030:1032] = struct.pack('<H', 4)"
edit "$tmp/choice.bin" "$tmp/delim.bin" "b[1024:1026] = struct.pack('<H', 65534)"
edit "$tmp/choice.bin" "$tmp/empty.bin" "b = b[:1024]; b[8:12] = struct.pack('<i', 0)"
edit "$tmp/choice.bin" "$tmp/short.bin" "b = b[:100]"
EVAL=(-e "$model" --eval 1 -m 1)
expect_error "missing eval file" "nope.bin" -- ./train_kla "${EVAL[@]}" --hellaswag "$tmp/nope.bin"
expect_error "eval file is a directory" "not a regular file" -- ./train_kla "${EVAL[@]}" --hellaswag "$tmp"
expect_error "eval file: bad magic" "magic.bin" "bad magic 20240520" -- ./train_kla "${EVAL[@]}" --hellaswag "$tmp/magic.bin"
expect_error "eval file: shorter than its header" "short.bin" "too small" -- ./train_kla "${EVAL[@]}" --hellaswag "$tmp/short.bin"
expect_error "eval file: truncated" "trunc.bin" "truncated" -- ./train_kla "${EVAL[@]}" --hellaswag "$tmp/trunc.bin"
expect_error "eval file: label out of range" "label.bin" "example 0" "label 4" -- ./train_kla "${EVAL[@]}" --hellaswag "$tmp/label.bin"
expect_error "eval file: wrong delimiter" "delim.bin" "example 0" "delimiter 65534" -- ./train_kla "${EVAL[@]}" --hellaswag "$tmp/delim.bin"
expect_error "eval file: no examples" "empty.bin" "0 examples" -- ./train_kla "${EVAL[@]}" --hellaswag "$tmp/empty.bin"
# before any training: a row longer than attn's position embedding, a token beyond the model's vocabulary
expect_error "eval example longer than attn's max_seq_len" "--hellaswag" "max_seq_len 8" -- ./train_kla --mixer attn:1 --width 32 --heads 2 --max-seq-len 8 -t 8 -x 1 --hellaswag "$tmp/choice.bin"
expect_error "eval token beyond the vocabulary" "choice.bin" "vocabulary [0, 1000)" -- ./train_kla --mixer gdn:1 --width 32 --vocab-size 1000 -x 1 --hellaswag "$tmp/choice.bin"
# flags
expect_error "--hellaswag-every without --hellaswag" "--hellaswag-every" "needs --hellaswag" -- ./train_kla --hellaswag-every 10
expect_error "--hellaswag-max without --hellaswag" "--hellaswag-max" "needs --hellaswag" -- ./train_kla --hellaswag-max 10
expect_error "negative --hellaswag-max" "--hellaswag-max" ">= 0" -- ./train_kla --hellaswag "$tmp/choice.bin" --hellaswag-max -1
expect_error "--hellaswag with --generate" "--hellaswag" "only --eval" -- ./train_kla -e "$model" --generate 4 --hellaswag "$tmp/choice.bin"
expect_error "--hellaswag-every with --eval" "--hellaswag-every" "training flag" -- ./train_kla "${EVAL[@]}" --hellaswag "$tmp/choice.bin" --hellaswag-every 5
expect_error "--hellaswag with a task" "--hellaswag" "task" -- ./train_kla --task a5 -x 5 --hellaswag "$tmp/choice.bin"
