#!/usr/bin/env bash
# test_tokenizer.sh: the tokenizer oracle test. Encodes tokenizer_cases.txt, each of its lines as a text of
# its own (so that every case is also seen at the very end of a text), and every document of the demo
# corpus with the npm package gpt-3-encoder (tokenizer_oracle.js) and with tokenizer.h (./test_tokenizer),
# and compares them token for token. Needs `make data`. Prints PASS/FAIL lines; exit status 1 on a failure.
set -euo pipefail
cd "$(dirname "$0")/../.."

for need in data/tokenizer.bin data/npm/node_modules/gpt-3-encoder data/demo/documents.txt; do
    if [ ! -e "$need" ]; then
        echo "FAIL tokenizer test setup: $need is missing (run make data)"
        exit 1
    fi
done
make --no-print-directory -s test_tokenizer

work=data/test_tokenizer   # kept after the run, for looking into a failure
rm -rf "$work"
mkdir -p "$work/lines"
LC_ALL=C awk -v dir="$work/lines" '{ f = sprintf("%s/line_%03d.txt", dir, NR); printf "%s", $0 > f; close(f) }' \
    dev/test/tokenizer_cases.txt
mapfile -t docs < data/demo/documents.txt
files=(dev/test/tokenizer_cases.txt "$work"/lines/*.txt "${docs[@]}")

if ! node dev/test/tokenizer_oracle.js "$work/oracle.bin" "${files[@]}"; then
    echo "FAIL tokenizer oracle: node dev/test/tokenizer_oracle.js failed"
    exit 1
fi
./test_tokenizer data/tokenizer.bin "$work/oracle.bin" "${files[@]}"
