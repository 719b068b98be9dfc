#!/usr/bin/env bash
# test_run_seed.sh -- `pdlink run` end to end on every seed topology (1p1d, 2p1d, 1p2d, p4d8, p8d4) with
# the small "tiny" preset (8 KV heads, so P4/D8 and P8/D4 split heads), a short workload, and the JSON
# report checked with /usr/bin/python3: every topology passes, parity n/n, 0 mismatched bytes, 0 expired
# transfers, 0 blocks held, KV moved and verified, releases sent == received. Then: no child left.
# Exit 77 (skip) when pdlink-node or pdlink-router is not built.
set -u
BUILD=${PDLINK_BUILD_DIR:?PDLINK_BUILD_DIR must point at the build directory}
for exe in pdlink pdlink-node pdlink-router; do
    if [ ! -x "$BUILD/$exe" ]; then
        echo "SKIP: $BUILD/$exe is not built yet"
        exit 77
    fi
done
WORK=$(mktemp -d "${TMPDIR:-/tmp}/test_run_seed.XXXXXX")
# On failure, the warnings and errors of every child's log (the log directory is removed with $WORK).
on_exit() {
    local rc=$?
    if [ "$rc" -ne 0 ] && ls "$WORK"/logs/*.log >/dev/null 2>&1; then
        echo "--- warnings and errors in $WORK/logs:"
        grep -H -E ' (warn|error): ' "$WORK"/logs/*.log | sed "s|$WORK/logs/||" | tail -60
    fi
    rm -rf "$WORK"
}
trap on_exit EXIT

"$BUILD/pdlink" run --model tiny --requests 12 --concurrency 4 --prompt-tokens 8-80 --max-tokens 8 \
    --json "$WORK/report.json" --log-dir "$WORK/logs" >"$WORK/out.txt" 2>"$WORK/err.txt"
rc=$?
cat "$WORK/out.txt"
if [ "$rc" -ne 0 ]; then
    echo "FAIL: pdlink run exited with $rc; stderr:"
    cat "$WORK/err.txt"
    exit 1
fi
grep -q '^PASS: 5/5 topologies' "$WORK/out.txt" || { echo "FAIL: no PASS verdict line"; exit 1; }

/usr/bin/python3 - "$WORK/report.json" <<'PY' || exit 1
import json, sys
r = json.load(open(sys.argv[1]))
names = [t["name"] for t in r["topologies"]]
assert names == ["1p1d", "2p1d", "1p2d", "p4d8", "p8d4"], names
assert r["pass"] is True and r["passed"] == 5, r["passed"]
assert r["model"] == "tiny" and r["backend"] == "shm" and r["mode"] == "read"
assert r["ceiling"]["gbps"] is None or r["ceiling"]["gbps"] > 0
for t in r["topologies"]:
    n = t["name"]
    assert t["requests"] == 12 and t["ok"] == 12 and t["failed"] == 0, (n, t["ok"], t["failed"])
    assert t["parity_ok"] == t["parity_total"] == 12, (n, t["parity_ok"])
    assert t["streaming"] == 3, (n, t["streaming"])
    assert t["bytes_mismatched"] == 0, (n, t["bytes_mismatched"])
    assert t["expired"] == 0 and t["held_blocks"] == 0, (n, t["expired"], t["held_blocks"])
    assert t["kv_bytes"] > 0 and t["bytes_verified"] > 0 and t["bytes_verified"] <= t["kv_bytes"], n
    assert t["descriptors"] > 0, n
    # Every consumer rank releases every producer rank of its group: max(P, D) releases per request.
    assert t["releases_sent"] == t["releases_received"] == t["releases_expected"], (n, t["releases_sent"], t["releases_received"], t["releases_expected"])
    assert t["pulls"] == 12, (n, t["pulls"])
    assert t["ttft_p50_ms"] is not None and 0 < t["ttft_p50_ms"] <= t["ttft_p99_ms"], n
    assert t["transfer_gbps"] is not None and t["transfer_gbps"] > 0, n
    assert t["metrics_complete"] is True and t["pass"] is True, n
# The split-head topologies move the same KV as the homogeneous one, in more descriptors.
by = {t["name"]: t for t in r["topologies"]}
assert by["p4d8"]["kv_bytes"] == by["1p1d"]["kv_bytes"], (by["p4d8"]["kv_bytes"], by["1p1d"]["kv_bytes"])
print("report OK:", ", ".join("%s %d/%d" % (t["name"], t["parity_ok"], t["parity_total"]) for t in r["topologies"]))
PY

# No child may outlive the run: every pid that logged must be gone.
leaked=0
for pid in $(grep -ho 'pdlink-\(node\|router\)\[[0-9]*\]' "$WORK"/logs/*.log | grep -o '[0-9]*' | sort -u); do
    if kill -0 "$pid" 2>/dev/null; then
        echo "FAIL: process $pid ($(tr '\0' ' ' </proc/$pid/cmdline 2>/dev/null | cut -c1-80)) is still running"
        leaked=1
    fi
done
[ "$leaked" -eq 0 ] || exit 1
echo "PASS"
