#!/usr/bin/env bash
# test_gpu.sh: the GPU tests (make test-gpu), run on a machine with an NVIDIA GPU and torch: the reference dumps,
# test_klacu in both precisions, the out-of-memory error, a synthetic task and the HellaSwag-style evaluation
# against the CPU trainer, then the kernel labs' validations (dev/cuda/*.cu, each exits 1 on a failed check).
# Ends with "N passed, M failed".
set -uo pipefail
cd "$(dirname "$0")/../.."
# the reference dumps of dev/test/parity_configs.txt (made here when absent: torch is on the GPU machine);
# test_klacu runs every one
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
# synthetic tasks on the GPU (README "Synthetic tasks"; the loss counts the labelled positions only). The FP32
# build follows the CPU trainer step for step: the 10 losses of a gdn + gka model on stack agree within 1e-4
# relative (fp32 round-off in other summation orders, grown through 10 AdamW steps at lr 1e-2; test_klacu's 10
# steps on the reference models agree within 1.1e-7); the negative control, another seed, must miss that bound.
# The test accuracy of the same runs (the GPU's argmax_rows against tasks.h's task_count_correct on the CPU) agrees
# within 0.002, a few of the ~2000 labelled positions: after 10 steps the logits are nearly flat, and the 1e-6 that
# the two builds' logits differ by can flip a near tie; seed 8's accuracy (negative control) must miss that bound.
# Then a tiny model learns the task in the BF16 build, as dev/test/test_task_train.sh asks of the CPU trainer.
tdir=$(mktemp -d)
losses_of() { sed -n 's/^step *[0-9]*\/[0-9]* | loss \([0-9.]*\) .*/\1/p' "$1" | tr '\n' ' '; }
test_accuracy() { sed -n 's/^step *[0-9]*\/[0-9]* | test len [0-9]* | loss [0-9.]* | accuracy \([0-9.]*\)$/\1/p' "$1"; }
# max relative difference of two equally long lists of losses ("" when they differ in length or are empty)
max_rel() { awk -v a="$1" -v b="$2" 'BEGIN { n = split(a, x, " "); m = split(b, y, " "); if (n != m || n == 0) { exit };
    w = 0; for (i = 1; i <= n; i++) { d = x[i] - y[i]; d = d < 0 ? -d : d; r = d / (y[i] < 0 ? -y[i] : y[i]); if (r > w) { w = r } }
    printf "%.2e", w }'; }
abs_diff() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "") { exit }; d = a - b; printf "%.4f", d < 0 ? -d : d }'; }
TASK=(--task stack --task-len 30 --mixer gdn:1,gka:1 --width 32 --heads 2 -b 16 -l 1e-2 -u 10 -k constant -m 8 -x 10 -v 0)
./train_kla "${TASK[@]}" --seed 7 > "$tdir/cpu.out" 2>&1
./build/train_klacu_fp32 "${TASK[@]}" --seed 7 > "$tdir/gpu.out" 2>&1
./build/train_klacu_fp32 "${TASK[@]}" --seed 8 > "$tdir/other.out" 2>&1
cpu=$(losses_of "$tdir/cpu.out"); gpu=$(losses_of "$tdir/gpu.out"); other=$(losses_of "$tdir/other.out")
rel=$(max_rel "$gpu" "$cpu"); rel_other=$(max_rel "$other" "$cpu")
if [ -n "$rel" ] && awk -v r="$rel" 'BEGIN { exit !(r <= 1e-4) }'; then
    echo "PASS task on the GPU: fp32 losses of 10 steps on stack within $rel of the CPU trainer's (tol 1e-4)" | tee -a "$log"
else
    echo "FAIL task on the GPU: fp32 losses '$gpu' against the CPU's '$cpu' (max rel '$rel', tol 1e-4)" | tee -a "$log"
fi
if [ -n "$rel_other" ] && awk -v r="$rel_other" 'BEGIN { exit !(r > 1e-4) }'; then
    echo "PASS task on the GPU: negative control (seed 8 against seed 7 differs by $rel_other, caught)" | tee -a "$log"
else
    echo "FAIL task on the GPU: negative control (seed 8 against seed 7: '$rel_other', not caught)" | tee -a "$log"
fi
acc_cpu=$(test_accuracy "$tdir/cpu.out"); acc_gpu=$(test_accuracy "$tdir/gpu.out"); acc_other=$(test_accuracy "$tdir/other.out")
d=$(abs_diff "$acc_gpu" "$acc_cpu"); d_other=$(abs_diff "$acc_other" "$acc_cpu")
if [ -n "$d" ] && awk -v d="$d" 'BEGIN { exit !(d <= 0.002) }'; then
    echo "PASS task on the GPU: fp32 test accuracy $acc_gpu, the CPU trainer's $acc_cpu (within 0.002)" | tee -a "$log"
else
    echo "FAIL task on the GPU: fp32 test accuracy '$acc_gpu' against the CPU's '$acc_cpu' (tol 0.002)" | tee -a "$log"
fi
if [ -n "$d_other" ] && awk -v d="$d_other" 'BEGIN { exit !(d > 0.002) }'; then
    echo "PASS task on the GPU: accuracy negative control (seed 8: $acc_other, off by $d_other, caught)" | tee -a "$log"
else
    echo "FAIL task on the GPU: accuracy negative control (seed 8: '$acc_other' against '$acc_cpu', not caught)" | tee -a "$log"
fi
./build/train_klacu_bf16 --task stack --task-len 30 --mixer gdn:2 --width 32 --heads 2 -b 16 -l 1e-2 -u 10 -k constant \
    -m 8 -x 500 -v 0 --seed 7 -o "$tdir/learn" > "$tdir/learn.out" 2>&1
acc=$(sed -n 's/^s:500 test_len:30 loss:[0-9.]* acc:\([0-9.]*\)$/\1/p' "$tdir/learn/main.log" 2> /dev/null)
if [ -n "$acc" ] && awk -v a="$acc" 'BEGIN { exit !(a > 0.2) }'; then
    echo "PASS task on the GPU: tiny gdn model learns stack (length 30) in 500 steps, bf16: test accuracy $acc > 0.2 (chance 0.04)" | tee -a "$log"
else
    echo "FAIL task on the GPU: tiny gdn model learns stack, bf16: test accuracy '$acc': $(tail -2 "$tdir/learn.out")" | tee -a "$log"
fi
# HellaSwag-style evaluation (README "HellaSwag") on the GPU: the FP32 build counts the same correct examples as the
# CPU trainer on the same checkpoint (a model of attn and gdn trained 30 steps on the CPU), on two files cut out of
# the demo val split: the true continuation against random tokens (the model is right on most), and against spans
# of other documents (near chance: many close calls, so the per-row scores of both trainers must order alike; fp32
# round-off, ~1e-6 relative, flips a pick only on a near-tie). The BF16 build's counts are printed, not compared.
if [ -d data/demo ]; then
    VAL="data/demo/demo_val_*.bin"
    /usr/bin/python3 scripts/hellaswag.py --from-shards "$VAL" -n 60 --context 16 --completion 4 --distractors random -o "$tdir/random.bin" > /dev/null
    /usr/bin/python3 scripts/hellaswag.py --from-shards "$VAL" -n 100 -o "$tdir/spans.bin" > /dev/null
    ./train_kla --mixer attn:1,gdn:1 --width 64 --heads 2 -b 8 -t 32 -x 30 -v 0 -m 1 -g 0 -o "$tdir/hella" > /dev/null 2>&1
    hella() { "$@" -e "$tdir/hella/model_00000030.bin" --eval 1 -m 1 2>&1 | sed -n 's/^step 30 | hellaswag \([0-9]*\/[0-9]*\) = .*/\1/p'; }
    for f in random spans; do
        cpu=$(hella ./train_kla --hellaswag "$tdir/$f.bin")
        gpu=$(hella ./build/train_klacu_fp32 --hellaswag "$tdir/$f.bin")
        bf16=$(hella ./build/train_klacu_bf16 --hellaswag "$tdir/$f.bin")
        if [ -n "$cpu" ] && [ "$gpu" = "$cpu" ]; then
            echo "PASS hellaswag on the GPU ($f distractors): fp32 $gpu correct, as the CPU trainer (bf16: $bf16)" | tee -a "$log"
        else
            echo "FAIL hellaswag on the GPU ($f distractors): fp32 '$gpu' correct, the CPU trainer '$cpu'" | tee -a "$log"
        fi
    done
fi
rm -rf "$tdir"
# several GPUs: data-parallel training on 2 ranks, and on 4 where there are 4 GPUs (dev/test/test_multigpu.sh;
# mpirun's launch too where there is one)
if [ "$(nvidia-smi -L 2> /dev/null | wc -l)" -ge 2 ]; then
    echo "== multi-GPU"
    mpirun_cmd=""
    command -v mpirun > /dev/null && mpirun_cmd="mpirun --allow-run-as-root -np"
    MPIRUN=$mpirun_cmd bash dev/test/test_multigpu.sh 2>&1 | tee -a "$log"
    if [ "$(nvidia-smi -L | wc -l)" -ge 4 ]; then
        MULTIGPU_RANKS=4 MPIRUN=$mpirun_cmd bash dev/test/test_multigpu.sh 2>&1 | tee -a "$log"
    fi
else
    echo "note: one GPU: the multi-GPU tests (dev/test/test_multigpu.sh) need 2"
fi
# the labs: built into build/labs when absent, then run from dev/cuda (each runs its default version's validation);
# GPU_TEST_LABS="gka_core pdn_core" runs only those, GPU_TEST_LABS=none none of them
mkdir -p build/labs
LABS=${GPU_TEST_LABS:-gdn_chunk_fwd gdn_chunk_bwd shortconv attention trunk kalman_scan pdn_core gka_core}
[ "$LABS" = none ] && LABS=""
for lab in $LABS; do
    for precision in bf16 fp32; do
        bin=build/labs/${lab}_${precision}_bin
        if [ ! -x "$bin" ] && ! nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -lineinfo -DENABLE_${precision^^} -I. "dev/cuda/$lab.cu" \
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
