#!/usr/bin/env bash
# test_gpu.sh: the GPU tests, run on a machine with an NVIDIA GPU from the repository root after `make cuda-both`
# test_klacu in both precisions, then the
# kernel labs' validations (dev/cuda/*.cu, each exits 1 on a failed check). Ends with "N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
# the four reference configurations test_klacu compares against (made here when absent: torch is on the GPU machine)
bash scripts/make_reference.sh attn gdn kaczmarz hybrid || exit 1
log=$(mktemp)
for p in fp32 bf16; do
    echo "== test_klacu $p"
    ./build/test_klacu_$p dev/test/ref 2>&1 | tee -a "$log"
done
# the labs: build when absent, then each version's validation
build_lab() {  # name extra-flags
    local src=dev/cuda/$1.cu bin=dev/cuda/$1$2_bin
    [ -x "$bin" ] || nvcc -O3 -arch=sm_90 -std=c++17 -lineinfo $3 -I. "$src" -o "$bin" -lcublasLt -lcublas || return 1
    echo "$bin"
}
for lab in gdn_chunk_fwd gdn_chunk_bwd shortconv attention trunk; do
    for variant in "" _fp32; do
        flag=""; [ "$variant" = _fp32 ] && flag=-DENABLE_FP32
        bin=$(build_lab $lab "$variant" "$flag") || { echo "FAIL lab $lab$variant: does not build" | tee -a "$log"; continue; }
        echo "== $bin"
        if (cd dev/cuda && ./"$(basename "$bin")") > /tmp/lab.out 2>&1; then
            echo "PASS lab $lab$variant" | tee -a "$log"
        else
            echo "FAIL lab $lab$variant" | tee -a "$log"
        fi
        grep -E "PASS|FAIL|ms|TFLOP|GB/s" /tmp/lab.out | head -40
    done
done
passed=$(grep -c '^PASS' "$log"); failed=$(grep -c '^FAIL' "$log")
echo "$passed passed, $failed failed"
rm -f "$log"
[ "$failed" -eq 0 ]
