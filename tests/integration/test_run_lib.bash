# test_run_lib.bash -- what every test_run_*.sh shares: the build's programs, a work directory removed on
# exit (after printing the warnings and errors of every child's log when the test failed), a run of
# `pdlink run` that must pass, and the check that no node or router outlived it.
# Source it first, after `set -euo pipefail`: `source "$(dirname "$0")/test_run_lib.bash" NAME PROGRAM...`.
BUILD=${PDLINK_BUILD_DIR:?PDLINK_BUILD_DIR must point at the build directory}
SRC=${PDLINK_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
RUN_TEST_NAME=$1
shift
# ctest builds every program before it runs a test, so a missing one is a broken build, not a skip.
for exe in "$@"; do
    [ -x "$BUILD/$exe" ] || { echo "FAIL: $BUILD/$exe is not built"; exit 1; }
done
WORK=$(mktemp -d "${TMPDIR:-/tmp}/$RUN_TEST_NAME.XXXXXX")
RUNPID=
run_on_exit() {
    local rc=$?
    [ -z "$RUNPID" ] || kill -KILL "$RUNPID" 2>/dev/null || true
    if [ "$rc" -ne 0 ] && ls "$WORK"/logs*/*.log >/dev/null 2>&1; then
        echo "--- warnings and errors in $WORK/logs*:"
        { grep -H -E ' (warn|error): ' "$WORK"/logs*/*.log || true; } | sed "s|$WORK/||" | tail -60
    fi
    rm -rf "$WORK"
}
trap run_on_exit EXIT

fail() { echo "FAIL: $*"; exit 1; }

# run_must_pass ARGS... : `pdlink run ARGS... --json $WORK/report.json --log-dir $WORK/logs`; fails the
# test unless it exits 0 and prints the PASS verdict for all five seed topologies.
run_must_pass() {
    local rc=0
    "$BUILD/pdlink" run "$@" --json "$WORK/report.json" --log-dir "$WORK/logs" >"$WORK/out.txt" 2>"$WORK/err.txt" ||
        rc=$?
    cat "$WORK/out.txt"
    if [ "$rc" -ne 0 ]; then
        echo "FAIL: pdlink run $* exited with $rc; stderr:"
        tail -40 "$WORK/err.txt"
        exit 1
    fi
    grep -q '^PASS: 5/5 topologies' "$WORK/out.txt" || fail "no PASS verdict line"
}

# need_vllm_router : sets ROUTER to the real vllm-router (PDLINK_VLLM_ROUTER, else the project venv's).
# Without it the test fails -- so that CI cannot pass by skipping it -- unless PDLINK_NO_VENV=1: then it
# skips (exit 77).
need_vllm_router() {
    ROUTER=${PDLINK_VLLM_ROUTER:-$SRC/.venv/bin/vllm-router}
    if [ ! -x "$ROUTER" ]; then
        if [ "${PDLINK_NO_VENV:-0}" = 1 ]; then
            echo "SKIP: PDLINK_NO_VENV=1 and $ROUTER does not exist"
            exit 77
        fi
        fail "$ROUTER does not exist (scripts/install-deps creates the venv; PDLINK_NO_VENV=1 skips)"
    fi
}

# survivors LOGDIR : pids of every node and router that wrote to a log under LOGDIR and still run.
survivors() {
    local pid out=""
    for pid in $(grep -ho 'pdlink-\(node\|router\)\[[0-9]*\]' "$1"/*.log 2>/dev/null | grep -o '[0-9]*' | sort -u); do
        if kill -0 "$pid" 2>/dev/null; then
            out="$out $pid($(tr '\0' ' ' </proc/$pid/cmdline 2>/dev/null | cut -c1-80))"
        fi
    done
    echo "$out"
}

# no_child_left LOGDIR : no child of the run may outlive it.
no_child_left() {
    local left
    left=$(survivors "$1")
    [ -z "$left" ] || fail "processes still running after the run:$left"
}
