#!/usr/bin/env bash
# test_gpu.sh: the GPU tests (make test-gpu), run on a machine with an NVIDIA GPU and torch: the reference dumps,
# test_klacu in both precisions, the out-of-memory error, then the kernel labs' validations (dev/cuda/*.cu, each
# exits 1 on a failed check). Ends with "N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
# the reference dumps of dev/test/parity_configs.txt (made here when absent: torch is on the GPU machine);
# test_klacu runs those whose mixers train_kla.cu has
bash scripts/make_reference.sh || exit 1
log=$(mktemp)
for p in fp32 bf16; do
    echo "== test_klacu $p"
    ./build/test_klacu_$p dev/test/ref 2>&1 | tee -a "$log"
done
# out of memory: a batch far too large for the GPU stops with one line that names the flags to lower
if [ -d data/demo ]; then
    out=$(./build/train_klacu_bf16 -b 240 -t 4096 -x 1 -g 0 --mixer gdn:12 --width 1536 --heads 12 --lin-heads 6 --dk 256 --dv 256 \
        -i data/demo/demo_train_000000.bin -j data/demo/demo_train_000000.bin 2>&1)
    rc=$?
    if [ $rc -eq 1 ] && echo "$out" | tail -n 1 | grep -q "^error: out of GPU memory.*lower the batch size -b"; then
        echo "PASS out of GPU memory: one line naming -b, -t and -r, exit 1" | tee -a "$log"
    else
        echo "FAIL out of GPU memory: exit $rc, last line: $(echo "$out" | tail -n 1)" | tee -a "$log"
    fi
fi
# the labs: built into build/labs when absent, then run from dev/cuda (each runs its default version's validation)
mkdir -p build/labs
for lab in gdn_chunk_fwd gdn_chunk_bwd shortconv attention trunk kalman_scan pdn_core gka_core; do
    for precision in bf16 fp32; do
        bin=build/labs/${lab}_${precision}_bin
        if [ ! -x "$bin" ] && ! nvcc -O3 -arch=sm_90 -std=c++17 -lineinfo -DENABLE_${precision^^} -I. "dev/cuda/$lab.cu" \
                -o "$bin" -lcublasLt -lcublas; then
            echo "FAIL lab $lab ($precision): does not build" | tee -a "$log"
            continue
        fi
        echo "== $bin"
        if (cd dev/cuda && "../../$bin") > "$log.lab" 2>&1; then
            echo "PASS lab $lab ($precision)" | tee -a "$log"
        else
            echo "FAIL lab $lab ($precision)" | tee -a "$log"
        fi
        grep -E "PASS|FAIL|ms|TFLOP|GB/s" "$log.lab" | head -40
        rm -f "$log.lab"
    done
done
passed=$(grep -c '^PASS' "$log"); failed=$(grep -c '^FAIL' "$log")
echo "$passed passed, $failed failed"
rm -f "$log"
[ "$failed" -eq 0 ]
