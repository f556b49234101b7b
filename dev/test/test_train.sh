#!/usr/bin/env bash
# Process-level tests of ./train_kla: every bad input of the foundation issue gives a one-line error naming
# the file or flag and exit code 1, with nothing left behind; resume continues bit for bit; an incomplete
# checkpoint is never used; a diverged run stops and keeps its last good checkpoint; sampling with a prompt.
# Needs the demo data (make data). Prints PASS/FAIL lines.
set -uo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
TRAIN=data/demo/demo_train_*.bin
VAL=data/demo/demo_val_*.bin
# a tiny hybrid model that takes a fraction of a second per step
SMALL=(--mixer attn:1,gdn:1,kaczmarz:1 --width 64 --heads 4 --lin-heads 2 --dk 16 --dv 16 -b 2 -t 32 -v 0 -m 2 -g 0)

pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }

# expect_error NAME SUBSTRING... -- COMMAND...: exit 1, exactly one line on stderr, starting "error:" and
# containing every SUBSTRING
expect_error() {
    local name=$1; shift
    local subs=()
    while [ "$1" != "--" ]; do subs+=("$1"); shift; done
    shift
    "$@" > "$tmp/out" 2> "$tmp/err"
    local rc=$? lines
    lines=$(wc -l < "$tmp/err")
    local msg
    msg=$(head -c 300 "$tmp/err")
    if [ $rc -ne 1 ]; then fail "$name" "exit code $rc, expected 1 ($msg)"; return; fi
    if [ "$lines" -ne 1 ]; then fail "$name" "$lines lines on stderr, expected 1 ($msg)"; return; fi
    case "$msg" in error:*) ;; *) fail "$name" "message does not start with 'error:' ($msg)"; return;; esac
    for s in "${subs[@]}"; do
        case "$msg" in *"$s"*) ;; *) fail "$name" "message lacks '$s' ($msg)"; return;; esac
    done
    pass "$name  [$msg]"
}

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
expect_error "shard too short for B*T+1" "short_000.bin" -- ./train_kla "${SMALL[@]}" -i "$tmp/short_*.bin"
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
