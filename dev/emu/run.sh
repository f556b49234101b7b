#!/usr/bin/env bash
# dev/emu/run.sh: runs a kernel check on the CPU emulator (dev/emu/emu.h), no GPU needed, only nvcc for the host
# compiler. Transforms kernels/gka.cuh and the headers it includes (dev/emu/transform.py), builds
# dev/emu/gka_backward.cu, runs it on the lab's shapes
# (dk, dv = 16, 24 and 32, 48 at T = 150; EMU_FULL=1 adds 128, 128 at T = 130, about 10 minutes on 2 cores), then
# the negative control: the same kernels with Zend^T left out of pass 3a's cross-chunk term must fail.
# Exit status 1 if a check or the control fails.
set -uo pipefail
cd "$(dirname "$0")/../.."
if ! command -v nvcc > /dev/null; then
    echo "PASS emulator: skipped, nvcc not found (it compiles the kernels as host code)"
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# the headers gka.cuh includes, and nothing else (the emulator runs the gka kernels only)
mkdir -p "$tmp/src" "$tmp/ok/kernels" "$tmp/neg"
cp kernels/common.cuh kernels/column_sum.cuh kernels/chunk_tiles.cuh kernels/gka.cuh "$tmp/src/"
cp utils.h "$tmp/ok/"
python3 dev/emu/transform.py "$tmp/src" "$tmp/ok/kernels" || exit 1
cp dev/emu/emu.h dev/emu/gka_backward.cu "$tmp/ok/"
(cd "$tmp/ok" && nvcc -std=c++20 -O1 -DENABLE_FP32 -I. gka_backward.cu -o gka_backward) || { echo "FAIL emulator build"; exit 1; }
failures=0
shapes=("150 16 24" "150 32 48")
[ "${EMU_FULL:-0}" = 1 ] && shapes+=("130 128 128")
for shape in "${shapes[@]}"; do
    # shellcheck disable=SC2086
    "$tmp/ok/gka_backward" $shape || failures=$((failures + 1))
done
# negative control: Zend^T dropped from pass 3a's Zend + Zend^T + Bend
cp -r "$tmp/ok/." "$tmp/neg/"
sed -i 's/adjn\[(size_t)i \* dk + j\] + adjn\[(size_t)j \* dk + i\] + /adjn[(size_t)i * dk + j] + /' "$tmp/neg/kernels/gka.cuh"
if cmp -s "$tmp/ok/kernels/gka.cuh" "$tmp/neg/kernels/gka.cuh"; then
    echo "FAIL negative control: the term to drop was not found"; failures=$((failures + 1))
elif (cd "$tmp/neg" && nvcc -std=c++20 -O1 -DENABLE_FP32 -I. gka_backward.cu -o gka_backward) && ! "$tmp/neg/gka_backward" 150 16 24 > "$tmp/neg.out"; then
    echo "PASS negative control: without Zend^T the check fails ($(grep -o 'dk [0-9.e+-]*' "$tmp/neg.out"))"
else
    echo "FAIL negative control: not caught"; failures=$((failures + 1))
fi
[ $failures -eq 0 ]
