#!/usr/bin/env bash
# Tests of scripts/plot_log.py (and make plot): from generated main.log files and from a real ./train_kla run, a
# PNG with a valid header and the expected size (2 panels, 3 with -t), the curve drawn in its colour, the same log
# twice gives the same bytes and a different log different bytes; bad input (a malformed line, a missing or empty
# log, a bad -t) is one line naming the file and line, exit 1, no PNG. Needs Debian's python3-matplotlib
# (scripts/install_deps.sh test installs it). Prints PASS/FAIL lines.
set -uo pipefail
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source dev/test/expect_error.sh
PY=/usr/bin/python3
if ! $PY -c 'import matplotlib' 2> /dev/null; then
    fail "plot_log setup" "matplotlib is missing from /usr/bin/python3 (scripts/install_deps.sh test installs python3-matplotlib)"
    exit 1
fi

# gen_log FILE FLOOR: 200 steps of a loss decaying to FLOOR, val every 50 steps, warmup then constant lr
gen_log() {
    mkdir -p "$(dirname "$1")"
    awk -v floor="$2" 'BEGIN { for (s = 0; s < 200; s++) {
        printf "s:%d trl:%.4f lr:%.6f norm:%.2f\n", s, floor + 8 * exp(-s / 40), 1e-3 * (s < 20 ? (s + 1) / 20 : 1), 1.0
        if (s % 50 == 0) printf "s:%d tel:%.4f\n", s, floor + 0.2 + 8 * exp(-s / 40) } }' > "$1"
}
# png_info FILE: "<width> <height> <pixels in matplotlib's first colour C0 #1f77b4, any alpha>", or "bad" if the
# file does not start with the PNG signature and an IHDR chunk
png_info() {
    $PY - "$1" <<'PY'
import struct, sys
b = open(sys.argv[1], "rb").read()
if b[:8] != b"\x89PNG\r\n\x1a\n" or b[12:16] != b"IHDR":
    print("bad"); sys.exit()
w, h = struct.unpack(">II", b[16:24])
import matplotlib.image
img = matplotlib.image.imread(sys.argv[1])
r, g, bl = img[..., 0], img[..., 1], img[..., 2]
# C0 blended over white with any alpha keeps the ratios of (1 - colour): near 0x1f,0x77,0xb4 along that line
near = ((1 - r) > 0.05) & (abs((1 - g) / (1 - r + 1e-9) - (1 - 0x77 / 255) / (1 - 0x1f / 255)) < 0.08) & \
       (abs((1 - bl) / (1 - r + 1e-9) - (1 - 0xb4 / 255) / (1 - 0x1f / 255)) < 0.08)
print(w, h, int(near.sum()))
PY
}

gen_log "$tmp/a/main.log" 3.0
gen_log "$tmp/b/main.log" 4.0
$PY scripts/plot_log.py "$tmp/a" > /dev/null 2>&1
$PY scripts/plot_log.py "$tmp/a/main.log" -o "$tmp/a_again.png" > /dev/null 2>&1
$PY scripts/plot_log.py "$tmp/b" > /dev/null 2>&1
read -r w h blue <<< "$(png_info "$tmp/a/loss.png")"
if [ "$w" = 1200 ] && [ "$h" = 450 ] && [ "$blue" -gt 500 ]; then
    pass "one log -> loss.png beside it: PNG header, 1200 x 450 (loss and lr panels), $blue pixels of the curve's colour"
else
    fail "one log" "png_info: $w $h $blue"
fi
if cmp -s "$tmp/a/loss.png" "$tmp/a_again.png" && ! cmp -s "$tmp/a/loss.png" "$tmp/b/loss.png"; then
    pass "the same log gives the same PNG bytes, another log different ones"
else
    fail "PNG determinism" "same log differs, or different logs give the same PNG"
fi
# several logs, and -t adds the tokens panel
$PY scripts/plot_log.py "$tmp/a" "$tmp/b" -t 512,1024 -o "$tmp/ab.png" > /dev/null 2>&1
read -r w h blue <<< "$(png_info "$tmp/ab.png")"
if [ "$w" = 1800 ] && [ "$h" = 450 ] && [ "$blue" -gt 500 ]; then pass "two logs with -t: 1800 x 450 (loss by step, by tokens, lr)"; else fail "two logs with -t" "png_info: $w $h $blue"; fi
# a real main.log: a 4-step run validating every 2 steps, then an --eval line appended
./train_kla --mixer gdn:2 --width 64 --heads 4 --dk 16 --dv 16 -b 2 -t 32 -x 4 -v 2 -m 2 -g 0 -o "$tmp/run" > /dev/null 2>&1
./train_kla -e "$tmp/run/model_00000004.bin" --eval 1 -b 2 -t 32 -m 2 -o "$tmp/run" > /dev/null 2>&1
if make -s --no-print-directory plot LOG="$tmp/run" PLOT_FLAGS="-o $tmp/run.png" > /dev/null 2>&1 && [ "$(png_info "$tmp/run.png" | cut -d' ' -f1-2)" = "1200 450" ] &&
   grep -q "evl:" "$tmp/run/main.log"; then
    pass "make plot LOG=<run dir> draws a train_kla main.log (with an --eval line)"
else
    fail "make plot on a real run" "$(tail -2 "$tmp/run/main.log")"
fi

# ---- bad input
gen_log "$tmp/bad/main.log" 3.0
sed -i '7s/.*/s:abc trl:1.0/' "$tmp/bad/main.log"
expect_error "malformed line" "main.log:7" "s:abc" -- $PY scripts/plot_log.py "$tmp/bad" -o "$tmp/bad.png"
printf 's:3 trl:2.5 lr\n' > "$tmp/nocolon.log"
expect_error "a field without a value" "nocolon.log:1" -- $PY scripts/plot_log.py "$tmp/nocolon.log" -o "$tmp/bad.png"
: > "$tmp/empty.log"
expect_error "empty log" "empty.log" "no train or val loss" -- $PY scripts/plot_log.py "$tmp/empty.log" -o "$tmp/bad.png"
expect_error "missing log" "nope.log" -- $PY scripts/plot_log.py "$tmp/nope.log" -o "$tmp/bad.png"
expect_error "-t not a number" "-t" "many" -- $PY scripts/plot_log.py "$tmp/a" -t many -o "$tmp/bad.png"
expect_error "-t count vs logs" "-t" "3 values for 2 logs" -- $PY scripts/plot_log.py "$tmp/a" "$tmp/b" -t 1,2,3 -o "$tmp/bad.png"
if [ ! -e "$tmp/bad.png" ]; then pass "no PNG written on bad input"; else fail "no PNG on bad input" "$tmp/bad.png exists"; fi
