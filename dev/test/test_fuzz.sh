#!/usr/bin/env bash
# test_fuzz.sh [long]: runs the libFuzzer harness dev/test/fuzz.c (built with ASan/UBSan by `make fuzz-build`) on
# each reader of untrusted bytes: the shard reader, the model and state file readers, the tokenizer file reader,
# the encoder and the multiple-choice eval file reader. Bounded and seeded (-seed=15, a fixed number of inputs per target, about a minute in all on 2 cores);
# `long` (make fuzz) runs 50 times as many. A crash, a sanitizer report, a hang (-timeout=10 s per input) or an
# allocation above 512 MB fails, and libFuzzer keeps the input under dev/test/fuzz_reproducers/<target>-*; every
# reproducer kept there is replayed first, so a fixed bug stays fixed. Needs clang with libFuzzer
# (scripts/install_deps.sh test installs it) and data/tokenizer.bin (make data).
set -uo pipefail
cd "$(dirname "$0")/../.."
if ! make --no-print-directory -s fuzz-build > /dev/null 2>&1; then
    echo "FAIL fuzz build: make fuzz-build failed (clang with libFuzzer missing? run scripts/install_deps.sh test)"
    exit 1
fi
repro=dev/test/fuzz_reproducers
mkdir -p "$repro"
# everything temporary lives here, the harness's own directories too (fuzz.c makes them under $TMPDIR)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export TMPDIR=$work
log=$work/log
scale=1
[ "${1:-}" = long ] && scale=50
LIMITS=(-timeout=10 -malloc_limit_mb=512 -rss_limit_mb=2048)
# inputs per target: the tokenizer reader builds its hash tables for every input (~60 ms under ASan), the rest take
# about a millisecond; the encoder's inputs are texts up to 512 bytes, the others edit lists up to 64 bytes
declare -A runs=([shard]=4000 [model]=4000 [state]=4000 [tokenizer]=200 [encode]=20000 [evalfile]=4000)
declare -A max_len=([shard]=64 [model]=64 [state]=64 [tokenizer]=64 [encode]=512 [evalfile]=64)

first_error() { grep -m1 -E "ERROR|SUMMARY|runtime error|fuzz encode" "$log" | head -c 300; }

for t in shard model state tokenizer encode evalfile; do
    bin=build/fuzz/fuzz_$t
    replayed=0
    for f in "$repro/$t"-*; do
        [ -e "$f" ] || continue
        if "$bin" "${LIMITS[@]}" "$f" > "$log" 2>&1; then replayed=$((replayed + 1)); else
            echo "FAIL fuzz $t: the kept reproducer $f still fails: $(first_error)"; fi
    done
    n=$((runs[$t] * scale))
    if "$bin" -seed=15 -runs="$n" -max_len="${max_len[$t]}" -len_control=0 "${LIMITS[@]}" -artifact_prefix="$repro/$t-" > "$log" 2>&1; then
        echo "PASS fuzz $t: $n seeded inputs under ASan/UBSan, no crash, sanitizer report, hang or huge allocation ($replayed reproducers replayed; $(grep -o 'cov: [0-9]*' "$log" | tail -1))"
    else
        echo "FAIL fuzz $t: $(first_error); reproducer: $(ls -t "$repro/$t"-* 2> /dev/null | head -1)"
    fi
done

# negative control: the same harness with an allocation limit of 1 MB must fail (the tokenizer reader allocates
# more), so a huge allocation is caught and its input kept
leftovers() { find "$work" -maxdepth 1 -name 'fuzz_train_kla_*' | wc -l; }
left_by_targets=$(leftovers)
neg=$work/neg
mkdir "$neg"
if build/fuzz/fuzz_tokenizer -seed=15 -runs=2 -malloc_limit_mb=1 -artifact_prefix="$neg/" > "$log" 2>&1 || [ -z "$(ls "$neg")" ]; then
    echo "FAIL fuzz negative control: a 1 MB allocation limit did not fail the tokenizer reader"
else
    echo "PASS fuzz negative control: a 1 MB allocation limit fails the tokenizer reader and keeps the input"
fi
# the harness removes its temporary directory at exit; the negative control's run is ended by libFuzzer's
# allocation limit before exit, so it leaves one: the count sees leftovers
left_by_negative=$(( $(leftovers) - left_by_targets ))
if [ "$left_by_targets" -eq 0 ] && [ "$left_by_negative" -eq 1 ]; then
    echo "PASS fuzz temporary files: the targets' runs removed their directories (the negative control's, ended by its limit, left 1)"
else
    echo "FAIL fuzz temporary files: $left_by_targets directories left by the targets' runs (want 0), $left_by_negative by the negative control (want 1)"
fi
