#!/usr/bin/env bash
# Fault tests of ./train_kla (issue 15): the run survives what a machine does to it.
#   1. kill -9 at seeded random moments of a run that checkpoints every step; each time it is resumed with -y 1;
#      the run ends bit-identical to an uninterrupted one (weights and AdamW state).
#   2. a file-size limit (ulimit -f) makes a checkpoint write fail: one line on stderr, exit 1, no temporary file
#      left, the last complete checkpoint intact, and a resume from it ends bit-identical.
#   3. a damaged newest checkpoint (one flipped bit): -y 1 says so in one line, falls back to the one before and
#      ends bit-identical.
#   4. two runs on one -o: the second refuses in one line naming the first's pid (the lock file) and the first
#      finishes bit-identical, so nothing is lost.
# Every run is compared with one uninterrupted reference run of the same flags. The kill delays are bash's RANDOM
# with a fixed seed (FAULT_SEED, default 15), uniform in [0, 0.25 x the faster of two uninterrupted runs' time],
# so a failure reproduces; how many of them land before the run ends depends on the machine's speed (at least 4
# must).
# Needs the demo data (make data).
set -uo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# the tiny hybrid model of test_train.sh; 8 steps, a checkpoint every step
RUN=(./train_kla --mixer attn:1,gdn:1,kaczmarz:1 --width 64 --heads 4 --lin-heads 2 --dk 16 --dv 16 -b 2 -t 32 -v 0 -m 2 -g 0 -x 8 -n 1)
LAST=00000008

pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }
same_as_reference() { cmp -s "$tmp/ref/model_$LAST.bin" "$1/model_$LAST.bin" && cmp -s "$tmp/ref/state_$LAST.bin" "$1/state_$LAST.bin"; }
now() { date +%s.%N; }

t0=$(now)
"${RUN[@]}" -o "$tmp/ref" > /dev/null 2>&1 || { fail "reference run" "exited with $?"; exit 1; }
t1=$(now)
# negative control for every comparison below: a run with another seed is not the same as the reference
"${RUN[@]}" --seed 2 -o "$tmp/other" > /dev/null 2>&1
t2=$(now)
# the run's duration is the faster of the two: the first may include a cold page cache, and kill delays scaled
# by a slow run can outlast the whole resumed run, so that too few kills land
duration=$(echo "a = $t1 - $t0; b = $t2 - $t1; if (a < b) a else b" | bc)
if same_as_reference "$tmp/other"; then fail "fault tests negative control" "a run with another seed matched the reference"; else
    pass "fault tests negative control: a run with another seed differs from the reference"; fi

# ---- 1. kill -9 at random moments, resume each time
RANDOM=${FAULT_SEED:-15}
kills=0
for attempt in $(seq 1 40); do
    [ -e "$tmp/killed/DONE_$LAST" ] && break
    "${RUN[@]}" -o "$tmp/killed" -y 1 > /dev/null 2>&1 &
    pid=$!
    sleep "$(echo "scale=3; 0.25 * $duration * $RANDOM / 32768" | bc)"
    if kill -9 "$pid" 2> /dev/null; then kills=$((kills + 1)); fi
    wait "$pid" 2> /dev/null
done
"${RUN[@]}" -o "$tmp/killed" -y 1 > /dev/null 2>&1
if [ "$kills" -ge 4 ] && same_as_reference "$tmp/killed"; then
    pass "kill -9 at $kills random moments, resumed each time: bit-identical to the uninterrupted run"
else
    fail "kill -9 and resume" "$kills kills landed (need 4); final files $(same_as_reference "$tmp/killed" && echo same || echo differ)"
fi

# ---- 2. a file-size limit while writing a checkpoint: the model file fits, the state file (m and v) does not
mkdir -p "$tmp/full" && cp "$tmp/ref/"{model,state}_00000004.bin "$tmp/ref/DONE_00000004" "$tmp/full/"
limit_kb=$(( $(stat -c %s "$tmp/ref/model_$LAST.bin") / 1024 + 64 ))
(ulimit -f "$limit_kb"; "${RUN[@]}" -o "$tmp/full" -y 1 > /dev/null 2> "$tmp/full_err")
rc=$?
msg=$(head -c 300 "$tmp/full_err")
if [ "$rc" -eq 1 ] && [ "$(wc -l < "$tmp/full_err")" -eq 1 ] && [[ "$msg" == error:*state_00000005.bin*"File too large"* ]] &&
   [ -z "$(ls "$tmp/full" | grep '\.tmp$')" ] && [ ! -e "$tmp/full/DONE_00000005" ] &&
   cmp -s "$tmp/ref/model_00000004.bin" "$tmp/full/model_00000004.bin" && cmp -s "$tmp/ref/state_00000004.bin" "$tmp/full/state_00000004.bin"; then
    pass "file-size limit while checkpointing: one line, no temporary file, checkpoint 4 intact  [$msg]"
else
    fail "file-size limit while checkpointing" "exit $rc, $(wc -l < "$tmp/full_err") lines: $msg; files: $(ls "$tmp/full" | tr '\n' ' ')"
fi
"${RUN[@]}" -o "$tmp/full" -y 1 > /dev/null 2>&1
if same_as_reference "$tmp/full"; then pass "after the failed write, resuming from checkpoint 4 ends bit-identical"; else
    fail "resume after the failed write" "final files differ from the reference"; fi

# ---- 3. one flipped bit in the newest checkpoint: -y 1 falls back to the one before, in one line
mkdir -p "$tmp/flip" && cp "$tmp/ref/"{model,state}_0000000{6,7}.bin "$tmp/ref/DONE_0000000"{6,7} "$tmp/flip/"
printf '\x55' | dd of="$tmp/flip/state_00000007.bin" bs=1 seek=5000 conv=notrunc 2> /dev/null
"${RUN[@]}" -o "$tmp/flip" -y 1 > "$tmp/flip_out" 2> "$tmp/flip_err"
msg=$(head -c 400 "$tmp/flip_err")
if [ "$(wc -l < "$tmp/flip_err")" -eq 1 ] && [[ "$msg" == *state_00000007.bin*"checksum mismatch"*"falling back to step 6"* ]] &&
   grep -q "resuming from .*model_00000006.bin" "$tmp/flip_out" && same_as_reference "$tmp/flip"; then
    pass "-y 1 with a damaged newest checkpoint: one line, falls back to step 6, bit-identical  [$msg]"
else
    fail "-y 1 fallback" "$msg"
fi

# ---- 4. two runs on one -o: the second refuses, the first loses nothing
"${RUN[@]}" -o "$tmp/two" > /dev/null 2>&1 &
first=$!
# wait for the first run to take the lock (up to 30 s: a loaded machine can be slow to start it)
for _ in $(seq 1 600); do [ -s "$tmp/two/.lock" ] && break; sleep 0.05; done
"${RUN[@]}" -o "$tmp/two" -y 1 > /dev/null 2> "$tmp/two_err"
rc=$?
wait "$first"
first_rc=$?
msg=$(head -c 300 "$tmp/two_err")
if [ "$rc" -eq 1 ] && [ "$(wc -l < "$tmp/two_err")" -eq 1 ] && [[ "$msg" == error:*"another run (pid $first)"* ]] &&
   [ "$first_rc" -eq 0 ] && same_as_reference "$tmp/two"; then
    pass "two runs on one -o: the second refuses in one line, the first ends bit-identical  [$msg]"
else
    fail "two runs on one -o" "second exit $rc ($msg), first exit $first_rc"
fi
