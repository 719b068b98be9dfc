# test_run_lib.bash -- what every test_run_*.sh shares: the build's programs, a work directory removed on
# exit (after printing the warnings and errors of every child's log when the test failed), a run of
# `pdlink run` that must pass, and the check that no node or router outlived it.
# Source it first: `source "$(dirname "$0")/test_run_lib.bash" NAME PROGRAM...`.
set -u
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
    [ -n "$RUNPID" ] && kill -KILL "$RUNPID" 2>/dev/null
    if [ "$rc" -ne 0 ] && ls "$WORK"/logs*/*.log >/dev/null 2>&1; then
        echo "--- warnings and errors in $WORK/logs*:"
        grep -H -E ' (warn|error): ' "$WORK"/logs*/*.log | sed "s|$WORK/||" | tail -60
    fi
    rm -rf "$WORK"
}
trap run_on_exit EXIT

fail() { echo "FAIL: $*"; exit 1; }

# run_must_pass ARGS... : `pdlink run ARGS... --json $WORK/report.json --log-dir $WORK/logs`; fails the
# test unless it exits 0 and prints the PASS verdict for all five seed topologies.
run_must_pass() {
    "$BUILD/pdlink" run "$@" --json "$WORK/report.json" --log-dir "$WORK/logs" >"$WORK/out.txt" 2>"$WORK/err.txt"
    local rc=$?
    cat "$WORK/out.txt"
    if [ "$rc" -ne 0 ]; then
        echo "FAIL: pdlink run $* exited with $rc; stderr:"
        tail -40 "$WORK/err.txt"
        exit 1
    fi
    grep -q '^PASS: 5/5 topologies' "$WORK/out.txt" || fail "no PASS verdict line"
}

# survivors LOGDIR : pids of every node and router that wrote to a log under LOGDIR and still run.
survivors() {
    local pid out=""
    for pid in $(grep -ho 'pdlink-\(node\|router\)\[[0-9]*\]' "$1"/*.log 2>/dev/null | grep -o '[0-9]*' | sort -u); do
        kill -0 "$pid" 2>/dev/null && out="$out $pid($(tr '\0' ' ' </proc/$pid/cmdline 2>/dev/null | cut -c1-80))"
    done
    echo "$out"
}

# no_child_left LOGDIR : no child of the run may outlive it.
no_child_left() {
    local left
    left=$(survivors "$1")
    [ -z "$left" ] || fail "processes still running after the run:$left"
}
