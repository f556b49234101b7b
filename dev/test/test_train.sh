#!/usr/bin/env bash
# Process-level tests of ./train_kla: every bad input of the foundation issue gives a one-line error naming
# the file or flag and exit code 1, with nothing left behind; resume continues bit for bit; an incomplete
# checkpoint is never used; a diverged run stops and keeps its last good checkpoint; sampling with a prompt;
# --generate and --eval from a checkpoint, and their bad inputs.
# Run directories and resume (issue 18, README "Run directories"): no two runs in one -o, no silent no-op, the
# run's flags kept across -y 1, a log without duplicates, the ETA, the README's flag table, the error hints.
# Needs the demo data (make data). Prints PASS/FAIL lines.
set -uo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
TRAIN=data/demo/demo_train_*.bin
VAL=data/demo/demo_val_*.bin
# a tiny hybrid model that takes a fraction of a second per step
SMALL=(--mixer attn:1,gdn:1,kaczmarz:1 --width 64 --heads 4 --lin-heads 2 --dk 16 --dv 16 -b 2 -t 32 -v 0 -m 2 -g 0)

source dev/test/expect_error.sh

# ---- flags
expect_error "unknown flag" "--bogus" -- ./train_kla --bogus 1
expect_error "missing value" "-b" "needs a value" -- ./train_kla -b
expect_error "non-numeric value" "-b" "abc" -- ./train_kla -b abc
expect_error "non-numeric float" "-l" "fast" -- ./train_kla -l fast
expect_error "B out of range" "-b" ">= 1" -- ./train_kla -b 0
expect_error "T out of range" "-t" -- ./train_kla -t -5
expect_error "lr out of range" "-l" "> 0" -- ./train_kla -l -1
expect_error "steps out of range" "-x" -- ./train_kla -x 0
expect_error "heads do not divide width" "--heads" "divide" -- ./train_kla --width 100 --heads 3
expect_error "total batch not a multiple" "-d" "multiple" -- ./train_kla -b 2 -t 32 -d 100
expect_error "unknown schedule" "-k" -- ./train_kla -k triangle
expect_error "mixer kla is ambiguous" "kla" "kaczmarz" "kalman" -- ./train_kla --mixer kla
expect_error "unknown mixer" "--mixer" "mamba" "kalman" -- ./train_kla --mixer gdn:2,mamba:1
expect_error "bad layer count" "--mixer" -- ./train_kla --mixer gdn:x
expect_error "pattern vs depth" "--mixer" "3" -- ./train_kla --mixer gdn:2 --depth 3
expect_error "unknown norm" "--norm" "rmsnorm" -- ./train_kla --norm batchnorm
expect_error "unknown mlp" "--mlp" "swiglu" -- ./train_kla --mlp relu
expect_error "negative mlp hidden" "--mlp-hidden" -- ./train_kla --mlp-hidden -4
expect_error "gka iterations out of range" "--gka-iters" -- ./train_kla --gka-iters 0
expect_error "gka kv heads do not divide" "--gka-kv-heads" -- ./train_kla --mixer gka --lin-heads 4 --gka-kv-heads 3
expect_error "unknown kalman preset" "--kalman-preset" "mamba" -- ./train_kla --kalman-preset mamba2
expect_error "T above max_seq_len (attn)" "-t" "max_seq_len" -- ./train_kla --mixer attn:2 --max-seq-len 64 -t 128
expect_error "unknown rows layout" "--rows" "contiguous, independent" -- ./train_kla --rows foo

# ---- documented defaults (README "Patterns" and "Quick start"), so the README and the code cannot drift apart
pattern_of() { "$@" -b 1 -t 8 -x 1 -v 0 -m 1 -g 0 2>&1 | awk -F'|' '/ mixer pattern / { gsub(/ /, "", $3); print $3 }'; }
got=$(pattern_of ./train_kla --mixer kaczmarz --depth 3)
[ "$got" = kaczmarz:3 ] && pass "a one-name pattern is repeated to --depth (kaczmarz, --depth 3 -> $got)" || fail "one-name pattern repeated to --depth" "got '$got'"
got=$(pattern_of ./train_kla --mixer pdn)
[ "$got" = pdn:4 ] && pass "a one-name pattern without --depth gives the default 4 layers ($got)" || fail "one-name pattern default depth" "got '$got'"
got=$(pattern_of ./train_kla --mixer attn:1,gdn:2)
[ "$got" = attn:1,gdn:2 ] && pass "a pattern with counts gives its own depth ($got)" || fail "pattern with counts" "got '$got'"
# negative control of the helper: a pattern it must not read as four layers
[ "$(pattern_of ./train_kla --mixer gdn:1)" = gdn:1 ] && pass "an explicit count is kept (gdn:1 -> gdn:1)" || fail "explicit count" "gdn:1 repeated"
# make run's command, taken from the Makefile, trains the model the README's quick start describes
run_cmd=$(make -s -n run RUN_FLAGS= 2>/dev/null | grep '^./train_kla ' | sed "s| -o [^ ]*| -o $tmp/make_run_model|")
table=$($run_cmd -x 1 -v 0 -m 1 -g 0 -s 0 2>&1)
got="$(echo "$table" | awk -F'|' '/ mixer pattern / { gsub(/ /, "", $3); print $3 }') width $(echo "$table" | awk -F'|' '/ width C / { gsub(/ /, "", $3); print $3 }')"
if [ "$got" = "gdn:4 width 128" ] && grep -q 'trains the default model (4 `gdn` layers, width 128)' README.md; then
    pass "make run trains the README's default model ($got)"
else
    fail "make run's model vs the README" "run table: '$got' (command: $run_cmd)"
fi

# ---- data
expect_error "empty glob" "nothing_here_*.bin" -- ./train_kla "${SMALL[@]}" -i "$tmp/nothing_here_*.bin"
python3 - "$tmp" <<'PY'
import struct, sys
d = sys.argv[1]
def shard(name, toks, magic=20240520, version=1, ntok=None, extra=b"", dtype="H"):
    h = [0] * 256
    h[0], h[1], h[2] = magic, version, len(toks) if ntok is None else ntok
    with open(f"{d}/{name}", "wb") as f:
        f.write(struct.pack("<256i", *h) + struct.pack(f"<{len(toks)}{dtype}", *toks) + extra)
ok = [i % 50000 for i in range(5000)]
shard("magic_000.bin", ok, magic=12345)
shard("version_000.bin", ok, version=9)
shard("truncated_000.bin", ok, ntok=6000)
shard("extra_000.bin", ok, extra=b"\0\0\0\0")
bad = list(ok); bad[4000] = 60000
shard("badtoken_000.bin", bad)
shard("short_000.bin", ok[:40])
shard("good_000.bin", ok)
PY
expect_error "shard wrong magic" "magic_000.bin" -- ./train_kla "${SMALL[@]}" -i "$tmp/magic_*.bin"
expect_error "shard wrong version" "version_000.bin" -- ./train_kla "${SMALL[@]}" -i "$tmp/version_*.bin"
expect_error "shard truncated payload" "truncated_000.bin" -- ./train_kla "${SMALL[@]}" -i "$tmp/truncated_*.bin"
expect_error "shard with extra bytes" "extra_000.bin" -- ./train_kla "${SMALL[@]}" -i "$tmp/extra_*.bin"
expect_error "shard token id >= vocab" "badtoken_000.bin" "60000" "9024" -- ./train_kla "${SMALL[@]}" -i "$tmp/badtoken_*.bin" -b 4 -t 1024 -x 1
expect_error "shard too short for B*T+1 (--rows contiguous)" "short_000.bin" "B*T*processes + 1" -- ./train_kla "${SMALL[@]}" -i "$tmp/short_*.bin" --rows contiguous
expect_error "shard too short for one row of T+1" "short_000.bin" "one row needs T + 1 = 65" -- ./train_kla "${SMALL[@]}" -i "$tmp/short_*.bin" -t 64
expect_error "fewer rows than one batch" "short_*.bin" "1 rows of T + 1 = 33 tokens" "B*processes = 2*1" -- ./train_kla "${SMALL[@]}" -i "$tmp/short_*.bin"
expect_error "missing tokenizer" "no_tokenizer.bin" -- ./train_kla "${SMALL[@]}" -g 8 --tokenizer "$tmp/no_tokenizer.bin"

# ---- checkpoints and output dir
expect_error "missing model file" "missing.bin" -- ./train_kla "${SMALL[@]}" -e "$tmp/missing.bin"
./train_kla "${SMALL[@]}" -x 2 -o "$tmp/base" > /dev/null 2>&1 || fail "base run" "failed"
good="$tmp/base/model_00000002.bin"
# the edits below must reach the checks behind the checksums, so the edited files get their checksums recomputed
# (FORMATS.md "Checksums") with the reference's CRC32C, which needs the python3 that has torch
TORCH_PYTHON=python3
for candidate in /usr/bin/python3 python3; do
    if "$candidate" -c "import torch" 2> /dev/null; then TORCH_PYTHON=$candidate; break; fi
done
"$TORCH_PYTHON" - "$good" "$tmp" <<'PY'
import math, struct, sys
sys.path.insert(0, "scripts")
from train_kla import crc32c
src, d = sys.argv[1], sys.argv[2]
b = bytearray(open(src, "rb").read())
def put(name, data): open(f"{d}/{name}", "wb").write(data)
def resign(f):
    n = struct.unpack_from("<i", f, 48)[0]
    at = 1024 + 128 * n
    for e in range(1024, 1024 + 128 * n, 128):
        dims = struct.unpack_from("<4i", f, e + 104)[:struct.unpack_from("<i", f, e + 100)[0]]
        size = 4 * math.prod(dims)
        struct.pack_into("<I", f, e + 92, crc32c(bytes(f[at:at + size])))
        at += size
    struct.pack_into("<I", f, 4 * 34, 0)
    struct.pack_into("<I", f, 4 * 34, crc32c(bytes(f[:1024 + 128 * n])))
    return f
m = bytearray(b); m[0:4] = struct.pack("<i", 1234); put("ck_magic.bin", m)
v = bytearray(b); v[4:8] = struct.pack("<i", 99); put("ck_version.bin", v)
put("ck_truncated.bin", b[:len(b) - 100])
s = bytearray(b); off = 1024 + 128 * 3 + 104       # fourth tensor entry (h0.attn.qkv.w, (192, 64)): transposed
s[off:off + 8] = struct.pack("<2i", 64, 192); put("ck_shape.bin", resign(s))
n = bytearray(b); payload = struct.unpack("<q", b[56:64])[0]
n[payload:payload + 64] = struct.pack("<16f", *([float("nan")] * 16)); put("ck_nan.bin", resign(n))
c = bytearray(b); c[payload + 1000] ^= 4; put("ck_bitflip.bin", c)  # one bit of wte, checksums left as written
PY
expect_error "checkpoint wrong magic" "ck_magic.bin" "magic" -- ./train_kla "${SMALL[@]}" -e "$tmp/ck_magic.bin"
expect_error "checkpoint wrong version" "ck_version.bin" "version" -- ./train_kla "${SMALL[@]}" -e "$tmp/ck_version.bin"
expect_error "checkpoint truncated" "ck_truncated.bin" "truncated" -- ./train_kla "${SMALL[@]}" -e "$tmp/ck_truncated.bin"
expect_error "checkpoint tensor shape" "ck_shape.bin" "h0.attn.qkv.w" "shape" -- ./train_kla "${SMALL[@]}" -e "$tmp/ck_shape.bin"
expect_error "checkpoint bit flip in a weight" "ck_bitflip.bin" "checksum mismatch in tensor wte" -- ./train_kla "${SMALL[@]}" -e "$tmp/ck_bitflip.bin"
expect_error "checkpoint config vs flags" "model_00000002.bin" "--width" -- ./train_kla "${SMALL[@]}" -e "$good" --width 128 --heads 4
expect_error "checkpoint pattern vs flags" "model_00000002.bin" "--mixer" -- ./train_kla "${SMALL[@]}" -e "$good" --mixer gdn:3
expect_error "checkpoint trunk vs flags" "model_00000002.bin" "--mlp" -- ./train_kla "${SMALL[@]}" -e "$good" --mlp swiglu
touch "$tmp/a_file"
expect_error "output dir not creatable" "-o" "a_file/sub" -- ./train_kla "${SMALL[@]}" -o "$tmp/a_file/sub"
if [ -e "$tmp/a_file/sub" ]; then fail "nothing left behind" "output dir created"; fi

# ---- divergence: NaN weights -> the loss is NaN at step 1; the run stops and names the last good checkpoint
mkdir -p "$tmp/nan" && cp "$tmp/base/"{model,state}_00000002.bin "$tmp/base/DONE_00000002" "$tmp/nan/"
cp "$tmp/ck_nan.bin" "$tmp/nan/model_00000002.bin"
expect_error "loss becomes NaN" "step 3" "nan" "model_00000002.bin" -- ./train_kla "${SMALL[@]}" -x 4 -o "$tmp/nan" -y 1
if [ -e "$tmp/nan/DONE_00000002" ] && [ ! -e "$tmp/nan/DONE_00000004" ]; then pass "NaN run keeps the last good checkpoint and writes none"; else fail "NaN run keeps the last good checkpoint" "checkpoint files changed"; fi

# ---- resume equality: 6 steps in one run == 3 steps, stop, resume for 3 more (constant and cosine lr)
losses() { grep -o 'trl:[0-9.]*' "$1/main.log" | tail -n "$2"; }
for sched in constant cosine; do
    ./train_kla "${SMALL[@]}" -k "$sched" -x 6 -n 3 -o "$tmp/full_$sched" > /dev/null 2>&1
    if [ "$sched" = constant ]; then
        # a real stop: a 3-step run, then a 6-step run resumed from its final checkpoint
        ./train_kla "${SMALL[@]}" -k "$sched" -x 3 -o "$tmp/part_$sched" > /dev/null 2>&1
    else
        # the cosine schedule depends on -x, so take the 6-step run's step-3 checkpoint as the stop point
        mkdir -p "$tmp/part_$sched" && cp "$tmp/full_$sched/"{model_00000003.bin,state_00000003.bin,DONE_00000003} "$tmp/part_$sched/"
    fi
    ./train_kla "${SMALL[@]}" -k "$sched" -x 6 -n 3 -o "$tmp/part_$sched" -y 1 > /dev/null 2>&1
    if cmp -s "$tmp/full_$sched/model_00000006.bin" "$tmp/part_$sched/model_00000006.bin" &&
       cmp -s "$tmp/full_$sched/state_00000006.bin" "$tmp/part_$sched/state_00000006.bin" &&
       [ "$(losses "$tmp/full_$sched" 3)" = "$(losses "$tmp/part_$sched" 3)" ]; then
        pass "resume ($sched lr): 6 steps == 3 + resume 3, weights and optimizer state bit for bit"
    else
        fail "resume ($sched lr)" "the resumed run differs from the uninterrupted one"
    fi
done
# --rows contiguous is a run flag: -y 1 alone takes it back, and the resumed run ends bit for bit where the
# uninterrupted one does; the same resume under the default --rows independent refuses the state in one line
./train_kla "${SMALL[@]}" -k constant -x 6 -n 3 --rows contiguous -o "$tmp/rows_full" > /dev/null 2>&1
mkdir -p "$tmp/rows_part" && cp "$tmp/rows_full/"{model_00000003.bin,state_00000003.bin,DONE_00000003} "$tmp/rows_part/"
out=$(./train_kla -o "$tmp/rows_part" -y 1 2>&1)
if cmp -s "$tmp/rows_full/model_00000006.bin" "$tmp/rows_part/model_00000006.bin" && ! echo "$out" | grep -q overrides &&
   ! cmp -s "$tmp/rows_full/model_00000006.bin" "$tmp/full_constant/model_00000006.bin"; then
    pass "resume (--rows contiguous): -y 1 alone keeps the layout, bit for bit; the independent-rows run differs"
else
    fail "resume (--rows contiguous)" "the resumed run differs, or equals the independent-rows run: $(echo "$out" | tail -n 1)"
fi
mkdir -p "$tmp/rows_other" && cp "$tmp/rows_full/"{model_00000003.bin,state_00000003.bin,DONE_00000003} "$tmp/rows_other/"
expect_error "resume with the other --rows" "rows = contiguous in the state, independent now" "--rows contiguous" -- ./train_kla -o "$tmp/rows_other" -y 1 --rows independent
# negative control: resuming with a different data seed must NOT give the same weights
mkdir -p "$tmp/ctrl" && cp "$tmp/full_constant/"{model_00000003.bin,state_00000003.bin,DONE_00000003} "$tmp/ctrl/"
./train_kla "${SMALL[@]}" -k constant -x 6 -o "$tmp/ctrl" -y 1 -l 2e-3 > /dev/null 2>&1
if cmp -s "$tmp/full_constant/model_00000006.bin" "$tmp/ctrl/model_00000006.bin"; then
    fail "resume negative control" "a run with another lr gave identical weights"
else
    pass "resume negative control: a resumed run with another lr differs"
fi

# ---- an incomplete checkpoint (killed mid-write: no DONE marker, a stray .tmp) is never used
cp -r "$tmp/full_constant" "$tmp/killed"
rm "$tmp/killed/DONE_00000006"
head -c 1000 "$tmp/killed/model_00000006.bin" > "$tmp/killed/model_00000009.bin.tmp"
out=$(./train_kla "${SMALL[@]}" -k constant -x 6 -o "$tmp/killed" -y 1 2>&1)
if echo "$out" | grep -q "resuming from .*model_00000003.bin" && cmp -s "$tmp/full_constant/model_00000006.bin" "$tmp/killed/model_00000006.bin"; then
    pass "resume skips an incomplete checkpoint and continues from the newest complete one"
else
    fail "resume skips an incomplete checkpoint" "$(echo "$out" | grep -m1 resum)"
fi

# ---- sampling from a text prompt through the decode path
out=$(./train_kla "${SMALL[@]}" -x 1 -g 16 --prompt "The President said" 2>&1)
if echo "$out" | grep -q "^The President said"; then pass "sampling continues an encoded --prompt"; else fail "sampling with --prompt" "prompt not echoed"; fi

# ---- the pdn family, gka (with GQA) and kalman train, checkpoint and sample through their decode steps
out=$(./train_kla --mixer pdn:1,pgdn:1,pkda:1,gka:1,kalman:1 --kalman-n 8 --gka-kv-heads 1 --width 64 --heads 4 --lin-heads 2 --dk 16 --dv 16 -b 2 -t 32 -v 2 -m 2 -x 2 \
      -g 8 --prompt "We the People" -o "$tmp/pdn" 2>&1)
if echo "$out" | grep -q "^step    2/2 | val loss" && echo "$out" | grep -q "^We the People" && [ -e "$tmp/pdn/DONE_00000002" ]; then
    pass "pdn, pgdn, pkda, gka, kalman: 2 steps, validation, checkpoint, sampling"
else
    fail "pdn family run" "$(echo "$out" | tail -2)"
fi

# ---- --generate and --eval: use a checkpoint without training (the base run's step-2 model)
# Nothing is written: the checkpoint's directory is the same before and after, and the working directory holds
# no new file. A seed gives the same samples; --samples 2 starts with the --samples 1 sample (one coin stream);
# another seed gives other samples (the negative control of the two equalities); --top-k 1 is greedy, so its
# samples agree whatever the seed.
gen() { ./train_kla -e "$good" --generate 12 --prompt "The President said" "$@" 2>&1; }
before=$(ls -l --time-style=full-iso "$tmp/base"; md5sum "$tmp/base"/*)
touch "$tmp/marker"
one=$(gen --sample-seed 5)
two=$(gen --sample-seed 5 --samples 2)
other=$(gen --sample-seed 6)
greedy=$(gen --top-k 1 --samples 2 --sample-seed 5; gen --top-k 1 --sample-seed 6)
first_of_two=$(echo "$two" | sed -n 1,4p)  # generating:, ---, the sample, ---
after=$(ls -l --time-style=full-iso "$tmp/base"; md5sum "$tmp/base"/*)
new_files=$(find . "$tmp" -newer "$tmp/marker" -type f -not -path './.git/*' | head -3)
if [ "$(echo "$one" | grep -c '^The President said')" = 1 ] && [ "$(echo "$two" | grep -c '^The President said')" = 2 ] &&
   [ "$one" = "$first_of_two" ] && [ "$one" != "$other" ]; then
    pass "--generate: samples continue the prompt; a seed repeats them, --samples 2 extends --samples 1, another seed differs"
else
    fail "--generate samples" "$(echo "$one" | tr '\n' '|') vs $(echo "$two" | tr '\n' '|') vs $(echo "$other" | tr '\n' '|')"
fi
if [ "$(echo "$greedy" | grep '^The President said' | sort -u | wc -l)" = 1 ]; then
    pass "--generate --top-k 1: greedy, the same continuation for every sample and seed"
else
    fail "--generate --top-k 1" "greedy samples differ: $(echo "$greedy" | grep '^The President said' | tr '\n' '|')"
fi
if [ "$before" = "$after" ] && [ -z "$new_files" ]; then pass "--generate writes nothing"; else fail "--generate writes nothing" "changed: $new_files"; fi

# --eval on the data the run validated on, with its batch shape and -m: the same loss the run logged at that step
# (the same model, windows and order; main.log keeps 4 decimals). The perplexity is exp(loss), the line appended
# to main.log is `s:2 evl:<loss> ...` (step from the checkpoint's name). Negative control: another -m gives
# another loss, so the equality is not a constant.
cp "$tmp/base/main.log" "$tmp/base_log_before"
out=$(./train_kla -e "$good" --eval 1 -b 2 -t 32 -m 2 -o "$tmp/base" 2>&1)
logged=$(grep -o '^s:2 tel:[0-9.]*' "$tmp/base_log_before" | cut -d: -f3)
loss=$(echo "$out" | sed -n 's/.*| loss \([0-9.]*\) | perplexity \([0-9.]*\)$/\1/p')
ppl=$(echo "$out" | sed -n 's/.*| loss \([0-9.]*\) | perplexity \([0-9.]*\)$/\2/p')
control=$(./train_kla -e "$good" --eval 1 -b 2 -t 32 -m 7 2>&1 | sed -n 's/.*| loss \([0-9.]*\) |.*/\1/p')
appended=$(diff "$tmp/base_log_before" "$tmp/base/main.log" | sed -n 's/^> //p')
if [ -n "$loss" ] && [ -n "$logged" ] && [ "$(printf '%.4f' "$loss")" = "$logged" ] &&
   awk -v l="$loss" -v p="$ppl" 'BEGIN { exit !(p > 0 && (p - exp(l)) / p < 1e-5 && (exp(l) - p) / p < 1e-5) }' &&
   [ "$appended" = "s:2 evl:$logged ppl:$ppl tok:128" ] && [ -n "$control" ] && [ "$control" != "$loss" ]; then
    pass "--eval: loss == the run's logged val loss at step 2 ($loss), perplexity == exp(loss), one line appended to main.log; -m 7 differs ($control)"
else
    fail "--eval" "loss '$loss' vs logged '$logged', ppl '$ppl', appended '$appended', control '$control'"
fi
# without -m, --eval reads every batch of -j: (5000 - 1) / (2 * 32) = 78 windows of the 5000-token good shard
out=$(./train_kla -e "$good" --eval 1 -b 2 -t 32 -j "$tmp/good_*.bin" 2>&1)
if echo "$out" | grep -q "| 78 batches of 2 x 32 = 4992 tokens |"; then pass "--eval without -m: the whole split (78 batches)"; else fail "--eval whole split" "$out"; fi

expect_error "--generate without -e" "--generate" "-e" -- ./train_kla --generate 8
expect_error "--generate with a missing checkpoint" "missing.bin" -- ./train_kla --generate 8 -e "$tmp/missing.bin"
expect_error "--eval with a missing checkpoint" "missing.bin" -- ./train_kla --eval 1 -e "$tmp/missing.bin"
expect_error "--generate with a training flag" "-l" "training" -- ./train_kla --generate 8 -e "$good" -l 1e-3
expect_error "--generate with -x" "-x" "training" -- ./train_kla --generate 8 -e "$good" -x 5
expect_error "--generate with an --eval flag" "-j" "--eval" -- ./train_kla --generate 8 -e "$good" -j "$VAL"
expect_error "--eval with a --generate flag" "--prompt" "--generate" -- ./train_kla --eval 1 -e "$good" --prompt hi
expect_error "--eval with a bad -o" "-o" "main.log" -- ./train_kla --eval 1 -e "$good" -o "$tmp/no_such_dir"
mkdir -p "$tmp/eval_dir"
expect_error "--eval on a corrupt shard" "magic_000.bin" -- ./train_kla --eval 1 -e "$good" -j "$tmp/magic_*.bin" -o "$tmp/eval_dir"
if [ -z "$(ls -A "$tmp/eval_dir")" ]; then pass "--eval that fails writes no main.log"; else fail "--eval that fails" "left $(ls "$tmp/eval_dir")"; fi
expect_error "--generate flags vs checkpoint" "--width" -- ./train_kla --generate 8 -e "$good" --width 128

# ---- run directories (issue 18): no silent mixing of runs, no silent no-ops
# listing of a directory with each file's checksum, to show that a refused or empty run changed nothing
snapshot() { (cd "$1" && md5sum * 2> /dev/null); }

# a fresh run into a directory that holds a run is refused, and the directory is left as it was
./train_kla "${SMALL[@]}" -x 3 -n 1 -o "$tmp/rd" > /dev/null 2>&1 || fail "run-dir base run" "failed"
echo "mine" > "$tmp/rd/notes.txt"
before=$(snapshot "$tmp/rd")
expect_error "fresh run into a run's directory" "-o" "already holds a run" "-y 1" "--overwrite 1" -- ./train_kla "${SMALL[@]}" -x 2 -o "$tmp/rd"
if [ "$(snapshot "$tmp/rd")" = "$before" ]; then pass "the refused run left the directory unchanged"; else fail "refused run" "the directory changed"; fi
# --overwrite 1 deletes the old run's log and checkpoints (steps 1-3), keeps other files, then trains afresh
./train_kla "${SMALL[@]}" -x 2 -o "$tmp/rd" --overwrite 1 > "$tmp/out" 2>&1
left=$(cd "$tmp/rd" && ls | tr '\n' ' ')
if [ "$left" = "DONE_00000002 main.log model_00000002.bin notes.txt state_00000002.bin " ] && [ "$(grep -c trl "$tmp/rd/main.log")" = 2 ]; then
    pass "--overwrite 1 deletes only the old run's files; the log holds only the new run  [$left]"
else
    fail "--overwrite 1" "left: $left; log: $(tr '\n' ' ' < "$tmp/rd/main.log")"
fi
expect_error "--overwrite with -y 1" "--overwrite" -- ./train_kla "${SMALL[@]}" -o "$tmp/rd" -y 1 --overwrite 1

# -n and -nk without -o are errors; a run without -o says that nothing is saved
expect_error "-n without -o" "-n" "(-o)" -- ./train_kla "${SMALL[@]}" -x 2 -n 1
expect_error "-nk without -o" "-nk" "(-o)" -- ./train_kla "${SMALL[@]}" -x 2 -nk 1
out=$(./train_kla "${SMALL[@]}" -x 1 2>&1)
if echo "$out" | head -n 1 | grep -q "^note: no -o: nothing of this run is saved"; then pass "a run without -o says first that nothing is saved"; else fail "run without -o" "no note: $(echo "$out" | head -n 1)"; fi

# a resume with nothing to do says so, exits 0 and writes nothing (at and below the checkpoint's step)
before=$(snapshot "$tmp/rd")
for x in 2 1; do
    out=$(./train_kla -o "$tmp/rd" -y 1 -x $x 2>&1); rc=$?
    if [ $rc -eq 0 ] && echo "$out" | grep -q "^nothing to do: .* at step 2 " && [ "$(snapshot "$tmp/rd")" = "$before" ]; then
        pass "resume with -x $x at or below the checkpoint's step 2: says nothing to do, exit 0, no file touched"
    else
        fail "resume with nothing to do (-x $x)" "exit $rc: $(echo "$out" | tail -n 1)"
    fi
done

# -y 1 alone continues with the run's own flags: a run with non-default training flags (constant lr 2e-3, weight
# decay, validation every 2 steps, checkpoint every 2), resumed from its step-2 checkpoint with no flag but -o and
# -y, ends bit for bit where the uninterrupted run ends; main.log then equals the uninterrupted run's, line for
# line (no duplicate validation at the resume point, no steps twice)
RUN=("${SMALL[@]}" -k constant -l 2e-3 -c 0.1 -v 2 -n 2 -x 4)
./train_kla "${RUN[@]}" -o "$tmp/kept_full" > /dev/null 2>&1
cp -r "$tmp/kept_full" "$tmp/kept"
rm "$tmp/kept/DONE_00000004"   # as if killed after logging step 4 but before its checkpoint was complete
out=$(./train_kla -o "$tmp/kept" -y 1 2>&1)
if cmp -s "$tmp/kept_full/model_00000004.bin" "$tmp/kept/model_00000004.bin" && ! echo "$out" | grep -q overrides; then
    pass "-y 1 alone resumes with the run's kept flags: weights bit for bit equal to the uninterrupted run"
else
    fail "-y 1 with kept flags" "weights differ or an override was reported"
fi
if cmp -s "$tmp/kept_full/main.log" "$tmp/kept/main.log" && [ -z "$(cut -d' ' -f1-2 "$tmp/kept/main.log" | sed 's/:[0-9.]*$//' | sort | uniq -d)" ]; then
    pass "main.log of the interrupted and resumed run == the uninterrupted run's ($(wc -l < "$tmp/kept/main.log") lines, none twice)"
else
    fail "main.log after resume" "$(diff "$tmp/kept_full/main.log" "$tmp/kept/main.log" | head -3 | tr '\n' ' ')"
fi
# negative control: a flag given again overrides the kept one with one line, and the result differs
cp -r "$tmp/kept_full" "$tmp/kept_lr" && rm "$tmp/kept_lr/DONE_00000004"
out=$(./train_kla -o "$tmp/kept_lr" -y 1 -l 3e-3 2>&1)
if [ "$(echo "$out" | grep -c overrides)" = 1 ] && echo "$out" | grep -q "^-l 0.003 overrides the run's 0.002$" &&
   ! cmp -s "$tmp/kept_full/model_00000004.bin" "$tmp/kept_lr/model_00000004.bin"; then
    pass "a flag given again overrides the kept one with one line ('-l 0.003 overrides the run's 0.002'), and the weights differ"
else
    fail "override of a kept flag" "$(echo "$out" | grep overrides | tr '\n' ' ')"
fi
# a version-1 state file (no checksums, no flag block) is refused: -y 1 finds no intact checkpoint and says why
mkdir -p "$tmp/v1" && cp "$tmp/kept_full/"{model,state}_00000002.bin "$tmp/kept_full/DONE_00000002" "$tmp/v1/"
python3 - "$tmp/v1/state_00000002.bin" <<'PY'
import struct, sys
b = open(sys.argv[1], "rb").read()
h = list(struct.unpack("<256i", b[:1024]))
loader, flags = h[6], h[11]
h[1], h[8], h[9], h[10], h[11] = 1, 0, 0, 0, 0
open(sys.argv[1], "wb").write(struct.pack("<256i", *h) + b[1024:1024 + loader] + b[1024 + loader + flags:])
PY
expect_error "a version-1 state file is refused" "state_00000002.bin" "version 1" -- ./train_kla "${RUN[@]}" -o "$tmp/v1" -y 1

# the ETA counts validation: with validation at every step costing many training steps (-m 150 forward batches
# against one forward+backward), the ETA printed after step 1 is within 3x of the time the run then takes (a
# machine whose load changes during the run moves it: 2x was missed under a parallel build); the step time alone
# (the old ETA) would be far below, which the same check catches (negative control)
start_ns=$(date +%s%N)
./train_kla "${SMALL[@]}" -x 4 -v 1 -m 150 | while IFS= read -r line; do echo "$(date +%s%N) $line"; done > "$tmp/eta"
end_ns=$(date +%s%N)
read -r eta_s left_s steps_s <<< "$(awk -v end="$end_ns" '/ step    1\/4 \| loss/ {
    split($0, f, "eta "); m = f[2]; sub(/s$/, "", m); split(m, ms, "m");
    for (i = 1; i <= NF; i++) if ($(i + 1) == "ms") step_ms = $i;
    print ms[1] * 60 + ms[2], (end - $1) / 1e9, step_ms * 3 / 1000 }' "$tmp/eta")"
if awk -v e="$eta_s" -v l="$left_s" -v s="$steps_s" 'BEGIN { exit !(e >= l / 3 - 1 && e <= 3 * l + 1 && s < l / 3 - 1) }'; then
    pass "ETA after step 1 ${eta_s}s vs ${left_s}s taken (steps alone: ${steps_s}s)"
else
    fail "ETA with validation" "ETA ${eta_s}s, the run then took ${left_s}s, the steps alone ${steps_s}s"
fi

# the README's flag table names the flags of ./train_kla -h with the same defaults
cat > "$tmp/flagcheck.py" <<'PY'
import re, sys
# the flags and defaults of `./train_kla -h` (argv[1]) against the README's flag table (argv[2])
code = {}
for line in open(sys.argv[1]):
    m = re.match(r"^  (-\S+)\s.*default: (.*)$", line.rstrip("\n"))
    if m: code[m.group(1)] = m.group(2).strip()
readme, in_table = {}, False
for line in open(sys.argv[2]):
    if line.startswith("## Flags of"): in_table = True; continue
    if in_table and line.startswith("## "): break
    cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
    if not in_table or len(cells) != 3 or not cells[0].startswith("`-"): continue
    names = re.findall(r"`(-[^`]+)`", cells[0])   # a row may name several flags: `--beta1`, `--beta2`, ...
    values = [v.strip().strip("`") for v in cells[2].split(", ")] if len(names) > 1 else [cells[2].strip("`")]
    for n, v in zip(names, values): readme[n] = v
def same(a, b):   # numbers compare as numbers (1e-05 == 1e-5), "(none)" == "none", anything else as text
    a, b = ["none" if s == "(none)" else s for s in (a, b)]
    try: return float(a) == float(b)
    except ValueError: return a == b
bad = [f"{n} missing from the README" for n in code if n not in readme]
bad += [f"{n} is in the README but not in -h" for n in readme if n not in code]
bad += [f"{n}: -h default {code[n]}, README {readme[n]}" for n in code if n in readme and not same(code[n], readme[n])]
print("; ".join(bad) if bad else f"{len(code)} flags agree")
sys.exit(1 if bad else 0)
PY
./train_kla -h > "$tmp/help"
if msg=$(python3 "$tmp/flagcheck.py" "$tmp/help" README.md) && [ "$(grep -c 'default:' "$tmp/help")" -gt 40 ]; then
    pass "README flag table == ./train_kla -h: $msg"
else
    fail "README flag table vs -h" "$msg"
fi
sed 's/^| `-t` | sequence length | [0-9]* |/| `-t` | sequence length | 128 |/' README.md > "$tmp/README_bad.md"
if msg=$(python3 "$tmp/flagcheck.py" "$tmp/help" "$tmp/README_bad.md"); then
    fail "README flag table negative control" "a README with -t 128 passed"
else
    pass "README flag table negative control: a README saying -t 128 is caught ($msg)"
fi

# error hints: a text file given as a shard points to encode_shards, missing default data to make data, a
# mistyped flag to the nearest flag
expect_error "text file as a shard" "README.md" "looks like text" "encode_shards" -- ./train_kla "${SMALL[@]}" -i README.md
head -c 200 README.md > "$tmp/short.txt"
expect_error "short text file as a shard" "short.txt" "encode_shards" -- ./train_kla "${SMALL[@]}" -i "$tmp/short.txt"
# in_dir DIR COMMAND...: run COMMAND in DIR (here: where the default data paths do not exist)
in_dir() { local dir=$1; shift; (cd "$dir" && "$@"); }
mkdir -p "$tmp/nodata"
expect_error "missing default data" "data/demo/demo_train_" "make data" -- in_dir "$tmp/nodata" "$PWD/train_kla" -x 1
expect_error "missing default tokenizer" "data/tokenizer.bin" "make data" -- \
    in_dir "$tmp/nodata" "$PWD/train_kla" "${SMALL[@]}" -x 1 -g 4 -i "$PWD/$TRAIN" -j "$PWD/$VAL"
expect_error "mistyped flag" "--mixr" "did you mean --mixer" -- ./train_kla --mixr gdn
expect_error "mistyped flag (underscore)" "--lin_heads" "did you mean --lin-heads" -- ./train_kla --lin_heads 2

# scripts/fineweb.py without network: stand-ins for its packages whose download fails end in one error line
mkdir -p "$tmp/stub"
printf 'class _E:\n    eot_token = 50256\ndef get_encoding(name):\n    return _E()\n' > "$tmp/stub/tiktoken.py"
printf 'def load_dataset(*a, **k):\n    raise ConnectionError("Couldn'"'"'t reach the Hub\\nsecond line")\n' > "$tmp/stub/datasets.py"
expect_error "fineweb.py without network (dataset)" "cannot download" "HuggingFaceFW/fineweb-edu" -- env PYTHONPATH="$tmp/stub" python3 scripts/fineweb.py -o "$tmp/fw"
printf 'def get_encoding(name):\n    raise OSError("Temporary failure in name resolution")\n' > "$tmp/stub/tiktoken.py"
expect_error "fineweb.py without network (tokenizer)" "cannot download" "gpt2" -- env PYTHONPATH="$tmp/stub" python3 scripts/fineweb.py -o "$tmp/fw"
