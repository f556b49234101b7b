#!/usr/bin/env bash
# Installs what `make run` (argument: run), `make test` (test), `make bench` (bench) or `make plot` (plot) needs
# and is missing, from Debian's packages. Data preparation (scripts/prepare_data.sh) installs its own npm packages.
set -euo pipefail
need=()
command -v node > /dev/null || need+=(nodejs)
command -v npm > /dev/null || need+=(npm)
if [ "${1:-run}" = test ] || [ "${1:-run}" = bench ]; then
    # the PyTorch reference needs Debian's torch in the system interpreter
    /usr/bin/python3 -c 'import torch' > /dev/null 2>&1 || need+=(python3-torch)
    # the fuzz tests (dev/test/test_fuzz.sh) need clang with libFuzzer and the sanitizer runtimes
    echo 'int LLVMFuzzerTestOneInput(const char* d, long n) { return 0; }' |
        clang -fsanitize=fuzzer,address,undefined -x c - -o /dev/null > /dev/null 2>&1 || need+=(clang libclang-rt-dev)
fi
if [ "${1:-run}" = test ] || [ "${1:-run}" = plot ]; then
    # scripts/plot_log.py draws with Debian's matplotlib in the system interpreter
    /usr/bin/python3 -c 'import matplotlib' > /dev/null 2>&1 || need+=(python3-matplotlib)
fi
if [ "${1:-run}" = bench ]; then
    # PyTorch at its best on CPU: Debian's torch uses the system BLAS, which is the slow reference BLAS
    # unless OpenBLAS is installed
    dpkg -s libopenblas0-pthread > /dev/null 2>&1 || need+=(libopenblas0-pthread)
fi
if [ ${#need[@]} -gt 0 ]; then
    echo "installing: ${need[*]}"
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" > /dev/null
fi
