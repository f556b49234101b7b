#!/usr/bin/env bash
# Process-level tests of ./encode_shards: -h; one document split inside with -p, and its tokens == the
# JavaScript GPT-2 encoder's (gpt-3-encoder, dev/test/tokenizer_oracle.js) for the whole text; a 3 MB document
# encoded in 1 MiB pieces == the same encoder (negative control: cutting it at arbitrary bytes differs);
# stdin and list inputs give the same shards as file arguments; the -v split; the progress line; every bad input
# is one line naming the file or flag, exit code 1, no shards left behind. Needs make data. Prints PASS/FAIL lines.
set -uo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source dev/test/expect_error.sh
make --no-print-directory -s encode_shards

# tokens DIR NAME SPLIT: the token ids of the split's shards, one per line (after the 1024-byte headers)
tokens() { for f in "$1/$2_$3"_*.bin; do tail -c +1025 "$f" | od -An -v -tu2 -w2; done | tr -d ' '; }
# oracle_tokens FILE: the JavaScript encoder's ids of FILE, one per line
oracle_tokens() {
    node dev/test/tokenizer_oracle.js "$tmp/oracle.bin" "$1" > /dev/null
    python3 - "$tmp/oracle.bin" <<'PY'
import struct, sys
b = open(sys.argv[1], "rb").read()
u = lambda o: struct.unpack_from("<I", b, o)[0]
o = 4
for _ in range(u(0)): o += 4 + u(o)             # the vocabulary
o += 4                                           # the number of files (1)
n = u(o); o += 4
print("\n".join(str(x) for x in struct.unpack_from(f"<{n}I", b, o)))
PY
}

# ---- -h
out=$(./encode_shards -h); rc=$?
if [ $rc -eq 0 ] && echo "$out" | grep -q '^usage: ./encode_shards' && echo "$out" | grep -q -- '-p F'; then pass "-h prints the usage and the flags"; else fail "-h" "rc $rc"; fi

# a 3 MB text of whole lines from the demo corpus (valid UTF-8), and one small document
xargs cat < data/demo/documents.txt 2> /dev/null | head -c 3000000 | sed '$d' > "$tmp/big.txt"
sed -n 1,200p "$tmp/big.txt" > "$tmp/small.txt"
oracle_tokens "$tmp/big.txt" > "$tmp/big.oracle"
oracle_tokens "$tmp/small.txt" > "$tmp/small.oracle"

# ---- one document, split inside by -p 0.1: train = EOT + head, val = EOT + tail, and head + tail == the encoder's
# tokens of the whole text; val holds about 10% of them
./encode_shards -o "$tmp/one" -n one -p 0.1 "$tmp/small.txt" > /dev/null 2>&1
tokens "$tmp/one" one train > "$tmp/one.train"; tokens "$tmp/one" one val > "$tmp/one.val"
n_all=$(wc -l < "$tmp/small.oracle"); n_val=$(($(wc -l < "$tmp/one.val") - 1))
if [ "$(head -1 "$tmp/one.train")" = 50256 ] && [ "$(head -1 "$tmp/one.val")" = 50256 ] &&
   cmp -s <(tail -n +2 "$tmp/one.train"; tail -n +2 "$tmp/one.val") "$tmp/small.oracle" &&
   [ $((n_val * 100 / n_all)) -ge 8 ] && [ $((n_val * 100 / n_all)) -le 12 ]; then
    pass "one document with -p 0.1: EOT + head to train, EOT + tail to val ($n_val of $n_all tokens), together == the JavaScript encoder"
else
    fail "one document with -p 0.1" "$n_val of $n_all tokens to val, or the tokens differ from the encoder's"
fi

# ---- a 3 MB document is encoded in 1 MiB pieces cut at safe places: == the encoder's tokens of the whole
./encode_shards -o "$tmp/big" -n big -v 0 "$tmp/big.txt" > /dev/null 2>&1
if cmp -s <(tokens "$tmp/big" big train | tail -n +2) "$tmp/big.oracle"; then
    pass "a 3 MB document encoded in 1 MiB pieces == the JavaScript encoder on the whole ($(wc -l < "$tmp/big.oracle") tokens)"
else
    fail "3 MB document in pieces" "tokens differ from the encoder's"
fi
# negative control: the same text cut at 1 MiB boundaries in the middle of a word, the parts encoded separately
python3 - "$tmp/big.txt" "$tmp/parts" <<'PY'
import os, sys
text = open(sys.argv[1], "rb").read()
os.makedirs(sys.argv[2])
cuts, at = [0], 1 << 20
while at < len(text):
    while not (text[at - 1:at].isalpha() and text[at:at + 1].isalpha()): at += 1   # inside a word
    cuts.append(at); at += 1 << 20
cuts.append(len(text))
for i in range(len(cuts) - 1): open(f"{sys.argv[2]}/part_{i}.txt", "wb").write(text[cuts[i]:cuts[i + 1]])
PY
./encode_shards -o "$tmp/parts_out" -n parts -v 0 "$tmp/parts"/part_*.txt > /dev/null 2>&1
if cmp -s <(tokens "$tmp/parts_out" parts train | grep -vx 50256) "$tmp/big.oracle"; then
    fail "negative control" "parts cut inside words gave the same tokens, so the comparison above cannot fail"
else
    pass "negative control: the same text cut inside words gives other tokens"
fi

# ---- stdin, a list file, a list on stdin: the same shards as file arguments
printf 'A first document.\n' > "$tmp/d1.txt"; printf 'The second one.\n' > "$tmp/d2.txt"; printf 'And a third.\n' > "$tmp/d3.txt"
./encode_shards -o "$tmp/args" -n x -v 2 "$tmp/d1.txt" "$tmp/d2.txt" "$tmp/d3.txt" > "$tmp/args.out" 2>&1
printf '%s\n' "$tmp/d3.txt" "" "$tmp/d1.txt" "$tmp/d2.txt" > "$tmp/list.txt"
./encode_shards -o "$tmp/list" -n x -v 2 -f "$tmp/list.txt" > /dev/null 2>&1
./encode_shards -o "$tmp/stdinlist" -n x -v 2 -f - < "$tmp/list.txt" > /dev/null 2>&1
./encode_shards -o "$tmp/stdin1" -n x -v 0 - < "$tmp/small.txt" > /dev/null 2>&1
./encode_shards -o "$tmp/file1" -n x -v 0 "$tmp/small.txt" > /dev/null 2>&1
same=1
for d in list stdinlist; do for f in x_train_000000.bin x_val_000000.bin; do cmp -s "$tmp/args/$f" "$tmp/$d/$f" || same=0; done; done
cmp -s "$tmp/stdin1/x_train_000000.bin" "$tmp/file1/x_train_000000.bin" || same=0
if [ $same = 1 ] && [ ! -e "$tmp/stdin1/x_val_000000.bin" ]; then pass "a list file, a list on stdin (-f -) and a document on stdin (-) give the shards of file arguments"; else fail "stdin and list inputs" "shards differ"; fi
# -v 2: the 1st and 3rd documents in sorted order go to val
if grep -q '^train: 1 documents' "$tmp/args.out" && grep -q '^val: 2 documents' "$tmp/args.out" &&
   [ "$(tokens "$tmp/args" x val | grep -c 50256)" = 2 ]; then pass "-v 2: documents 1 and 3 to val, 2 to train"; else fail "-v 2" "$(tail -2 "$tmp/args.out")"; fi

# ---- a progress line on inputs above 8 MiB (the demo corpus, 10.7 MB), ending at 100%
./encode_shards -o "$tmp/demo" -n demo -f data/demo/documents.txt > /dev/null 2> "$tmp/progress"
if grep -q "(100%), 372 of 372 documents" "$tmp/progress"; then pass "progress line on a large input: $(tr '\r' '\n' < "$tmp/progress" | tail -1)"; else fail "progress line" "$(tr '\r' '\n' < "$tmp/progress" | tail -1)"; fi
# and the demo shards are the ones make data wrote
same=1; for f in data/demo/demo_*.bin; do cmp -s "$f" "$tmp/demo/$(basename "$f")" || same=0; done
if [ $same = 1 ]; then pass "the demo corpus encodes to the shards of make data"; else fail "demo shards" "differ"; fi

# ---- bad input: one line naming the file or flag, exit 1, no shards left
: > "$tmp/empty.txt"
mkdir -p "$tmp/adir"
printf 'hello' > "$tmp/nocut.txt"
expect_error "empty document" "empty.txt" "empty" -- ./encode_shards -o "$tmp/e1" -n e "$tmp/d1.txt" "$tmp/empty.txt"
expect_error "empty stdin" "stdin" "empty" -- ./encode_shards -o "$tmp/e1" -n e -v 0 - < "$tmp/empty.txt"
expect_error "missing document" "nope.txt" -- ./encode_shards -o "$tmp/e1" -n e "$tmp/d1.txt" "$tmp/nope.txt"
expect_error "missing list" "nolist.txt" -- ./encode_shards -o "$tmp/e1" -n e -f "$tmp/nolist.txt"
expect_error "a directory" "adir" "directory" -- ./encode_shards -o "$tmp/e1" -n e "$tmp/d1.txt" "$tmp/adir"
expect_error "one document with the default -v" "d1.txt" "-p" -- ./encode_shards -o "$tmp/e1" -n e "$tmp/d1.txt"
expect_error "-v 1" "-v" -- ./encode_shards -o "$tmp/e1" -n e -v 1 "$tmp/d1.txt" "$tmp/d2.txt"
expect_error "-p out of range" "-p" "fraction" -- ./encode_shards -o "$tmp/e1" -n e -p 1.5 "$tmp/d1.txt"
expect_error "-p with -v" "-p" "-v" -- ./encode_shards -o "$tmp/e1" -n e -v 5 -p 0.1 "$tmp/d1.txt"
expect_error "-s not a number" "-s" "abc" -- ./encode_shards -o "$tmp/e1" -n e -s abc "$tmp/d1.txt"
expect_error "unknown flag" "-z" -- ./encode_shards -z 1 "$tmp/d1.txt"
expect_error "no documents" "no documents" -- ./encode_shards -o "$tmp/e1" -n e
expect_error "stdin twice" "standard input" -- ./encode_shards -o "$tmp/e1" -n e -f - - < "$tmp/list.txt"
expect_error "missing tokenizer" "no_tok.bin" -- ./encode_shards -t "$tmp/no_tok.bin" -o "$tmp/e1" -n e "$tmp/d1.txt" "$tmp/d2.txt"
expect_error "old shards of the same name" "already holds" "x_train_000000.bin" -- ./encode_shards -o "$tmp/args" -n x "$tmp/d1.txt" "$tmp/d2.txt"
if [ -z "$(ls -A "$tmp/e1" 2>/dev/null)" ]; then pass "no shards left behind by the errors above"; else fail "nothing left behind" "$(ls "$tmp/e1")"; fi
# an error after shards were written (the 2nd document has no place to split, after the 1st filled shards of
# 20000 tokens) removes them again
expect_error "-p: a document with no place to split" "nocut.txt" "-p" -- ./encode_shards -o "$tmp/e2" -n e -s 20000 -p 0.1 "$tmp/big.txt" "$tmp/nocut.txt"
if [ -z "$(ls -A "$tmp/e2")" ]; then pass "a failed run removes the shards it wrote"; else fail "failed run cleanup" "$(ls "$tmp/e2" | head -3)"; fi
