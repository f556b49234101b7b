#!/usr/bin/env bash
# make_reference.sh: generate the PyTorch reference dumps that test_kla.c compares train_kla.c against.
# Writes dev/test/ref/<config>_model.bin and <config>_debug.bin (FORMATS.md) for seventeen configurations:
# attn (GPT-2), gdn, kaczmarz and a hybrid (LayerNorm, GELU MLP), then the trunk options: rmsnorm (RMSNorm with a
# non-default eps), swiglu (SwiGLU MLP) and nomlp (RMSNorm, no MLP), then the Preconditioned DeltaNet family: pdn,
# pgdn (RMSNorm, SwiGLU), pkda, and mixed (those six mixers in one model), then Gated KalmaNet: gka, and mixed7 (all
# seven mixers in one model), then Kalman Linear Attention: kalman (plain preset, expand 2, N 8), kalman_mamba
# (mamba preset, expand 1, N 16, RMSNorm, no MLP), all8 (all eight mixers in one model), and gka_gqa (gka with GQA:
# 8 heads reading 2 key/value heads, header slot 33). A configuration whose
# two files are newer than scripts/train_kla.py is skipped. Run from anywhere; paths are relative to the repository
# root. Arguments, if any, name the configurations to make (default: all).
set -euo pipefail
cd "$(dirname "$0")/.."

SCRIPT=scripts/train_kla.py
OUT=dev/test/ref

# Debian's python3-torch lives in /usr/bin/python3; the python3 first on PATH may lack torch
PYTHON=""
for candidate in /usr/bin/python3 "$(command -v python3 || true)"; do
    if [ -x "$candidate" ] && "$candidate" -c "import torch" 2>/dev/null; then
        PYTHON=$candidate
        break
    fi
done
if [ -z "$PYTHON" ]; then
    echo "error: no python3 that imports torch (tried /usr/bin/python3 and python3 on PATH); install python3-torch" >&2
    exit 1
fi

mkdir -p "$OUT"

# make NAME ARGS...: run the reference for one configuration unless its outputs are up to date
# with arguments, only the configurations named (e.g. the four the GPU test uses: attn gdn kaczmarz hybrid)
ONLY=" $* "
make_config() {
    local name=$1
    shift
    if [ "$ONLY" != "  " ] && [[ "$ONLY" != *" $name "* ]]; then return; fi
    local prefix=$OUT/$name
    if [ "$prefix"_model.bin -nt "$SCRIPT" ] && [ "$prefix"_debug.bin -nt "$SCRIPT" ]; then
        echo "$name: up to date"
        return
    fi
    echo "$name:"
    "$PYTHON" "$SCRIPT" "$@" --out "$prefix"
}

make_config attn     --mixer attn:2 --depth 2 --width 64 --heads 4 --max-seq-len 64 --B 2 --T 37 --seed 1
make_config gdn      --mixer gdn:2 --depth 2 --width 64 --heads 4 --lin-heads 2 --dk 16 --dv 24 --B 2 --T 80 --seed 2
make_config kaczmarz --mixer kaczmarz:2 --depth 2 --width 64 --heads 4 --lin-heads 2 --dk 16 --dv 24 --B 2 --T 80 --seed 3
make_config hybrid   --mixer gdn:1,attn:1,kaczmarz:1 --depth 3 --width 64 --heads 4 --lin-heads 2 --dk 16 --dv 24 \
                     --max-seq-len 128 --B 2 --T 80 --seed 4
make_config rmsnorm  --mixer gdn:2 --norm rmsnorm --norm-eps 1e-6 --depth 2 --width 64 --heads 4 --lin-heads 2 \
                     --dk 16 --dv 24 --B 2 --T 80 --seed 5
make_config swiglu   --mixer attn:1,kaczmarz:1 --mlp swiglu --depth 2 --width 64 --heads 4 --lin-heads 2 --dk 16 \
                     --dv 24 --max-seq-len 128 --B 2 --T 80 --seed 6
make_config nomlp    --mixer gdn:1,attn:1 --norm rmsnorm --mlp none --depth 2 --width 64 --heads 4 --lin-heads 2 \
                     --dk 16 --dv 24 --max-seq-len 128 --B 2 --T 80 --seed 7
make_config pdn      --mixer pdn:2 --depth 2 --width 64 --heads 4 --lin-heads 2 --dk 16 --dv 24 --B 2 --T 80 --seed 8
make_config pgdn     --mixer pgdn:2 --norm rmsnorm --mlp swiglu --depth 2 --width 64 --heads 4 --lin-heads 2 --dk 16 \
                     --dv 24 --B 2 --T 80 --seed 9
make_config pkda     --mixer pkda:2 --depth 2 --width 64 --heads 4 --lin-heads 2 --dk 16 --dv 24 --B 2 --T 80 --seed 10
make_config mixed    --mixer attn:1,gdn:1,kaczmarz:1,pdn:1,pgdn:1,pkda:1 --depth 6 --width 64 --heads 4 --lin-heads 2 \
                     --dk 16 --dv 24 --max-seq-len 128 --B 2 --T 80 --seed 11
make_config gka      --mixer gka:2 --depth 2 --width 64 --heads 4 --lin-heads 2 --dk 16 --dv 24 --B 2 --T 80 --seed 12
make_config mixed7   --mixer attn:1,gdn:1,kaczmarz:1,pdn:1,pgdn:1,pkda:1,gka:1 --depth 7 --width 64 --heads 4 \
                     --lin-heads 2 --dk 16 --dv 24 --max-seq-len 128 --B 2 --T 80 --seed 13
make_config kalman   --mixer kalman:2 --kalman-preset plain --kalman-expand 2 --kalman-n 8 --depth 2 --width 64 \
                     --heads 4 --B 2 --T 80 --seed 14
make_config kalman_mamba --mixer kalman:2 --kalman-preset mamba --kalman-expand 1 --kalman-n 16 --norm rmsnorm \
                     --mlp none --depth 2 --width 64 --heads 4 --B 2 --T 80 --seed 15
make_config all8     --mixer attn:1,gdn:1,kaczmarz:1,kalman:1,gka:1,pdn:1,pgdn:1,pkda:1 --depth 8 --width 64 \
                     --heads 4 --lin-heads 2 --dk 16 --dv 24 --kalman-n 8 --max-seq-len 128 --B 2 --T 80 --seed 16
make_config gka_gqa  --mixer gka:2 --depth 2 --width 64 --heads 8 --lin-heads 4 --gka-kv-heads 2 --dk 16 --dv 24 \
                     --B 2 --T 80 --seed 17
