#!/usr/bin/env bash
# test_cuda_build.sh: the CUDA programs compile in both precisions (CI has nvcc but no GPU; the GPU tests are
# dev/test/test_gpu.sh). Builds build/{train,test}_klacu_{bf16,fp32} and the kernel labs of dev/cuda into a
# temporary directory. Prints one PASS/FAIL line per program; without nvcc, one line saying so.
set -uo pipefail
cd "$(dirname "$0")/../.."
if ! command -v nvcc > /dev/null; then
    echo "PASS CUDA build: skipped, nvcc not found (the CPU programs do not need it)"
    exit 0
fi
for target in build/train_klacu_bf16 build/train_klacu_fp32 build/test_klacu_bf16 build/test_klacu_fp32; do
    if out=$(make -s "$target" 2>&1); then
        echo "PASS CUDA build: $target"
    else
        echo "FAIL CUDA build: $target"
        echo "$out" | tail -20
    fi
done
tmp=$(mktemp -d)
for lab in dev/cuda/*.cu; do
    name=$(basename "$lab" .cu)
    for precision in BF16 FP32; do
        if out=$(nvcc -O1 -arch=sm_90 -std=c++17 -DENABLE_$precision -I. "$lab" -o "$tmp/$name" -lcublasLt -lcublas 2>&1); then
            echo "PASS CUDA build: lab $name ($precision)"
        else
            echo "FAIL CUDA build: lab $name ($precision)"
            echo "$out" | tail -20
        fi
    done
done
rm -rf "$tmp"
