# expect_error.sh: sourced by the process-level test scripts (test_train.sh, test_encode_shards.sh,
# test_task_train.sh). Needs $tmp, a scratch directory of the caller.

pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }

# expect_error NAME SUBSTRING... -- COMMAND...: exit 1, exactly one line on stderr, starting "error:" and
# containing every SUBSTRING
expect_error() {
    local name=$1; shift
    local subs=()
    while [ "$1" != "--" ]; do subs+=("$1"); shift; done
    shift
    "$@" > "$tmp/out" 2> "$tmp/err"
    local rc=$? lines
    lines=$(wc -l < "$tmp/err")
    local msg
    msg=$(head -c 300 "$tmp/err")
    if [ $rc -ne 1 ]; then fail "$name" "exit code $rc, expected 1 ($msg)"; return; fi
    if [ "$lines" -ne 1 ]; then fail "$name" "$lines lines on stderr, expected 1 ($msg)"; return; fi
    case "$msg" in error:*) ;; *) fail "$name" "message does not start with 'error:' ($msg)"; return;; esac
    for s in "${subs[@]}"; do
        case "$msg" in *"$s"*) ;; *) fail "$name" "message lacks '$s' ($msg)"; return;; esac
    done
    pass "$name  [$msg]"
}
