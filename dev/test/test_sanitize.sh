#!/usr/bin/env bash
# test_sanitize.sh: the fast part of the suite with the CPU programs built with -fsanitize=address,undefined
# (make sanitize, build/sanitize/). Any sanitizer finding aborts the program with a report, which fails the check:
#   - test_dataloader, all of it (the tokenizer and the file readers run under ASan/UBSan in test_fuzz.sh);
#   - train_kla: a model with all eight mixers trains 2 steps with validation, sampling from a prompt and a
#     checkpoint every step, then resumes for a third step (decode, checkpoint write and read, -y 1 included);
#   - train_kla on bad input: a corrupt shard, a damaged checkpoint, a bad flag: one line "error: ...", exit 1.
# Needs the demo data (make data). Prints PASS/FAIL lines. About 5 seconds.
set -uo pipefail
cd "$(dirname "$0")/../.."
if ! make --no-print-directory -s sanitize > /dev/null 2>&1; then echo "FAIL sanitize build: make sanitize failed"; exit 1; fi
S=build/sanitize
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export ASAN_OPTIONS=abort_on_error=1:detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

# run NAME COMMAND...: passes when the command exits 0 and printed no sanitizer report
run() {
    local name=$1; shift
    "$@" > "$tmp/out" 2>&1
    local rc=$?
    if [ $rc -eq 0 ] && ! grep -q -E "ERROR: (Address|Leak)Sanitizer|runtime error:" "$tmp/out"; then echo "PASS sanitize: $name"; else
        echo "FAIL sanitize: $name: exit $rc, $(grep -m1 -E "Sanitizer|runtime error:|^FAIL" "$tmp/out" | head -c 300)"; fi
}
# refuses NAME SUBSTRING COMMAND...: passes when the command exits 1 with one "error:" line that names SUBSTRING,
# and no sanitizer report
refuses() {
    local name=$1 want=$2; shift 2
    "$@" > /dev/null 2> "$tmp/err"
    local rc=$?
    if [ $rc -eq 1 ] && [ "$(wc -l < "$tmp/err")" -eq 1 ] && grep -q "^error: .*$want" "$tmp/err"; then echo "PASS sanitize: $name  [$(head -c 200 "$tmp/err")]"; else
        echo "FAIL sanitize: $name: exit $rc, $(head -c 300 "$tmp/err")"; fi
}

run "test_dataloader" $S/test_dataloader
ALL8=(--mixer attn:1,gdn:1,kaczmarz:1,pdn:1,pgdn:1,pkda:1,gka:1,kalman:1 --kalman-n 4 --width 32 --heads 2 --lin-heads 2
      --dk 8 --dv 8 -b 2 -t 16 -v 1 -m 1 -g 6 --prompt "It is")
run "train_kla, all eight mixers: 2 steps, validation, sampling, checkpoints" $S/train_kla "${ALL8[@]}" -n 1 -x 2 -o "$tmp/all8"
run "train_kla, all eight mixers: resumed with -y 1 for a third step" $S/train_kla "${ALL8[@]}" -n 1 -x 3 -o "$tmp/all8" -y 1
head -c 2000 data/demo/demo_val_000000.bin > "$tmp/cut_000000.bin"
refuses "train_kla refuses a truncated shard" "cut_000000.bin" $S/train_kla "${ALL8[@]}" -x 1 -j "$tmp/cut_*.bin"
cp "$tmp/all8/model_00000003.bin" "$tmp/damaged.bin"
printf '\x01' | dd of="$tmp/damaged.bin" bs=1 seek=20000 conv=notrunc 2> /dev/null
refuses "train_kla refuses a damaged checkpoint" "damaged.bin" $S/train_kla "${ALL8[@]}" -x 1 -e "$tmp/damaged.bin"
refuses "train_kla refuses a bad flag" "mamba" $S/train_kla --mixer gdn:2,mamba:1
