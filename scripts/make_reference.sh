#!/usr/bin/env bash
# make_reference.sh: generate the PyTorch reference dumps that test_kla.c compares train_kla.c against.
# Writes dev/test/ref/<config>_model.bin and <config>_debug.bin (FORMATS.md) for each configuration of
# dev/test/parity_configs.txt (the one list of parity models; its comments say what each tests). A configuration
# whose two files are newer than scripts/train_kla.py and the list is skipped. Run from anywhere; paths are relative
# to the repository root. Arguments, if any, name the configurations to make (default: all).
set -euo pipefail
cd "$(dirname "$0")/.."

SCRIPT=scripts/train_kla.py
OUT=dev/test/ref
CONFIGS=dev/test/parity_configs.txt

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
    if [ "$prefix"_model.bin -nt "$SCRIPT" ] && [ "$prefix"_debug.bin -nt "$SCRIPT" ] &&
       [ "$prefix"_model.bin -nt "$CONFIGS" ]; then
        echo "$name: up to date"
        return
    fi
    echo "$name:"
    "$PYTHON" "$SCRIPT" "$@" --out "$prefix"
}

# one configuration per line of dev/test/parity_configs.txt (the list test_kla and test_klacu share)
while read -r name args; do
    case "$name" in ''|'#'*) continue ;; esac
    # shellcheck disable=SC2086  # the arguments are words
    make_config "$name" $args
done < "$CONFIGS"
