#!/usr/bin/env bash
# Runs every test program and prints the total: "N passed, M failed". Each test prints one line per check,
# starting with PASS or FAIL; a program that exits non-zero without a FAIL line counts as one failure.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
log=$(mktemp)
trap 'rm -f "$log"' EXIT
run() {
    echo "== $*"
    "$@" 2>&1 | tee -a "$log.one"
    local rc=${PIPESTATUS[0]}
    cat "$log.one" >> "$log"
    if [ "$rc" -ne 0 ] && ! grep -q '^FAIL' "$log.one"; then
        echo "FAIL $*: exited with status $rc" | tee -a "$log"
    fi
    rm -f "$log.one"
}
run bash scripts/make_reference.sh
run ./test_kla dev/test/ref
run ./test_dataloader
run ./test_ranks
run ./test_tasks
run bash dev/test/test_task_train.sh
run bash dev/test/test_tokenizer.sh
run bash dev/test/test_train.sh
run bash dev/test/test_hellaswag.sh
run bash dev/test/test_encode_shards.sh
run bash dev/test/test_plot_log.sh
run bash dev/test/test_docs.sh
run bash dev/test/test_faults.sh
run bash dev/test/test_sanitize.sh
run bash dev/test/test_fuzz.sh
run bash dev/test/test_cuda_build.sh
run bash dev/emu/run.sh
# the numpy checks of kernel algorithms (Debian's python3 has numpy: python3-torch brings it)
py=/usr/bin/python3
"$py" -c 'import numpy' 2> /dev/null || py=python3
run "$py" dev/cuda/gka_chunked_backward_check.py
run "$py" dev/cuda/pkda_chunk_check.py --negative
run "$py" dev/cuda/gka_solve_precision.py
passed=$(grep -c '^PASS' "$log")
failed=$(grep -c '^FAIL' "$log")
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
