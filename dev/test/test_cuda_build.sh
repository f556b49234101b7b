#!/usr/bin/env bash
# test_cuda_build.sh: the CUDA programs compile in both precisions, with NCCL where it is found and without it
# (CI has nvcc but no GPU; the GPU tests are dev/test/test_gpu.sh). Builds build/{train,test}_klacu_{bf16,fp32},
# and train_klacu without NCCL and the kernel labs of dev/cuda into a temporary directory. Prints one PASS/FAIL
# line per program; without nvcc, one line saying so.
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
# several GPUs (README "Multi-GPU"): make builds them with NCCL when it finds nccl.h, and the program also
# compiles without it, as the single-GPU program of a machine without NCCL
if make -s -n -B build/train_klacu_bf16 2>/dev/null | grep -q -- "-DMULTI_GPU"; then
    echo "PASS CUDA build: NCCL found, the programs above are built for several GPUs (-DMULTI_GPU)"
else
    echo "PASS CUDA build: NCCL not found, the programs above are single-GPU ones"
fi
if out=$(nvcc -O1 -gencode arch=compute_90a,code=sm_90a -std=c++17 -DENABLE_BF16 train_kla.cu -o "$tmp/train_klacu_single" -lcublasLt -lcublas 2>&1); then
    echo "PASS CUDA build: train_klacu without NCCL (the single-GPU program)"
else
    echo "FAIL CUDA build: train_klacu without NCCL"
    echo "$out" | tail -20
fi
for lab in dev/cuda/*.cu; do
    name=$(basename "$lab" .cu)
    for precision in BF16 FP32; do
        if out=$(nvcc -O1 -gencode arch=compute_90a,code=sm_90a -std=c++17 -DENABLE_$precision -I. "$lab" -o "$tmp/$name" -lcublasLt -lcublas 2>&1); then
            echo "PASS CUDA build: lab $name ($precision)"
        else
            echo "FAIL CUDA build: lab $name ($precision)"
            echo "$out" | tail -20
        fi
    done
done
rm -rf "$tmp"

# errors that need no GPU: cuDNN asked for without its headers, and (on a machine without a GPU) no CUDA device
out=$(make -s USE_CUDNN=1 CUDNN_FRONTEND_PATH=/nonexistent train_klacu 2>&1)
if [ $? -ne 0 ] && echo "$out" | grep -q "USE_CUDNN=1: cudnn-frontend headers not found"; then
    echo "PASS CUDA build: USE_CUDNN=1 without the cudnn-frontend headers stops with a one-line error"
else
    echo "FAIL CUDA build: USE_CUDNN=1 without headers: $out"
fi
if nvidia-smi -L > /dev/null 2>&1; then
    echo "PASS train_klacu without a GPU: skipped, this machine has one"
else
    out=$(./build/train_klacu_bf16 -x 1 -g 0 2>&1)
    rc=$?
    if [ $rc -eq 1 ] && [ "$(echo "$out" | wc -l)" -eq 1 ] && echo "$out" | grep -q "^error: no CUDA device found"; then
        echo "PASS train_klacu without a GPU: one line, exit 1 ($out)"
    else
        echo "FAIL train_klacu without a GPU: exit $rc, output: $out"
    fi
fi
