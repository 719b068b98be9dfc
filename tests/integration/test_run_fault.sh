#!/usr/bin/env bash
# test_run_fault.sh -- `pdlink run` when things go wrong:
#   1. a decode node is killed mid-run (hidden --fault kill-decode-after=N): the run exits 1, names the
#      dead node ("decode-0 (pdlink-node TP4, port ...)"), shows its last log lines, and leaves no
#      pdlink-node / pdlink-router process behind;
#   2. SIGINT while the workload runs: the run stops every child and exits non-zero;
#   3. usage errors exit 2 (unknown topology, --mode write before WRITE exists).
set -euo pipefail
source "$(dirname "$0")/test_run_lib.bash" test_run_fault pdlink pdlink-node pdlink-router

# 1. A decode node dies mid-run.
rc=0
"$BUILD/pdlink" run --model tiny --topology 1p2d --requests 60 --concurrency 2 --prompt-tokens 8-64 --max-tokens 8 \
    --fault kill-decode-after=6 --log-dir "$WORK/logs1" --json "$WORK/fault.json" >"$WORK/out1.txt" 2>"$WORK/err1.txt" ||
    rc=$?
cat "$WORK/out1.txt" "$WORK/err1.txt"
[ "$rc" -eq 1 ] || fail "pdlink run exited with $rc after a decode node was killed (want 1)"
grep -q 'decode-0 (pdlink-node TP4, port [0-9]*) was killed by signal 9' "$WORK/err1.txt" ||
    fail "stderr does not name the dead node"
grep -q 'decode-0 (pdlink-node TP4, port [0-9]*) was killed by signal 9' "$WORK/out1.txt" ||
    fail "the report does not name the dead node"
grep -q '    | ' "$WORK/err1.txt" || fail "no log lines of the dead node were shown"
grep -q '^FAIL: 0/1 topologies passed; failed: 1p2d' "$WORK/out1.txt" || fail "no FAIL verdict"
/usr/bin/python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
t = r["topologies"][0]
assert r["pass"] is False and t["pass"] is False
assert any("decode-0" in n for n in t["notes"]), t["notes"]
assert t["ok"] < t["requests"]
' "$WORK/fault.json" || fail "JSON report of the fault run"
sleep 0.2
no_child_left "$WORK/logs1"

# 2. SIGINT during the workload.
"$BUILD/pdlink" run --model tiny --topology 2p1d --requests 4000 --concurrency 2 --prompt-tokens 8-16 \
    --max-tokens 2 --log-dir "$WORK/logs2" >"$WORK/out2.txt" 2>"$WORK/err2.txt" &
RUNPID=$!
for _ in $(seq 1 600); do
    grep -q '\[2p1d\] all registered' "$WORK/err2.txt" 2>/dev/null && break
    kill -0 "$RUNPID" 2>/dev/null || break
    sleep 0.1
done
grep -q '\[2p1d\] all registered' "$WORK/err2.txt" || { cat "$WORK/err2.txt"; fail "the cluster never came up"; }
sleep 0.5
kill -INT "$RUNPID"
rc=0
wait "$RUNPID" || rc=$?
RUNPID=
tail -5 "$WORK/err2.txt"
[ "$rc" -ne 0 ] || fail "pdlink run exited 0 after SIGINT"
grep -q 'Interrupt received, stopping' "$WORK/err2.txt" || fail "no interruption message"
sleep 0.2
no_child_left "$WORK/logs2"

# 3. Usage errors.
rc=0
"$BUILD/pdlink" run --topology 3p3d >/dev/null 2>"$WORK/err3.txt" || rc=$?
[ $rc -eq 2 ] || fail "unknown topology should exit 2"
grep -q "unknown topology '3p3d'" "$WORK/err3.txt" || fail "unknown topology message"
rc=0
"$BUILD/pdlink" run --mode push >/dev/null 2>"$WORK/err3.txt" || rc=$?
[ $rc -eq 2 ] || fail "--mode push should exit 2"
grep -q "push" "$WORK/err3.txt" || fail "--mode message should name the value"
"$BUILD/pdlink" run --help >"$WORK/help.txt" || fail "--help exited with $?"
grep -q -- '--prompt-tokens MIN-MAX' "$WORK/help.txt" || fail "--help"
echo "PASS"
