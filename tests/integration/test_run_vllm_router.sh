#!/usr/bin/env bash
# test_run_vllm_router.sh -- `pdlink run --router vllm-router`: the real vllm-router (PyPI wheel 0.1.17,
# installed into the project venv by scripts/install-deps) started with the seed's exact flags in front
# of pdlink-nodes, on every seed topology (1p1d, 2p1d, 1p2d, p4d8, p8d4) with the "tiny" preset, and the
# same checks as with pdlink-router: parity n/n with a single node, every KV byte verified, releases =
# expected, 0 expired, 0 held. The router's own log must show it ran consistent_hash in MoRIIO mode.
# Exit 77 (skip) when pdlink is not built, or when PDLINK_NO_VENV=1 and there is no vllm-router; a
# missing vllm-router is a failure otherwise, so that CI cannot pass by skipping it.
set -u
BUILD=${PDLINK_BUILD_DIR:?PDLINK_BUILD_DIR must point at the build directory}
SRC=${PDLINK_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
for exe in pdlink pdlink-node; do
    [ -x "$BUILD/$exe" ] || { echo "SKIP: $BUILD/$exe is not built yet"; exit 77; }
done
ROUTER=${PDLINK_VLLM_ROUTER:-$SRC/.venv/bin/vllm-router}
if [ ! -x "$ROUTER" ]; then
    if [ "${PDLINK_NO_VENV:-0}" = 1 ]; then
        echo "SKIP: PDLINK_NO_VENV=1 and $ROUTER does not exist"
        exit 77
    fi
    echo "FAIL: $ROUTER does not exist (scripts/install-deps creates the venv; PDLINK_NO_VENV=1 skips)"
    exit 1
fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/test_run_vllm_router.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

PDLINK_VLLM_ROUTER=$ROUTER "$BUILD/pdlink" run --router vllm-router --model tiny --requests 12 --concurrency 4 \
    --prompt-tokens 8-80 --max-tokens 8 --json "$WORK/report.json" --log-dir "$WORK/logs" \
    >"$WORK/out.txt" 2>"$WORK/err.txt"
rc=$?
cat "$WORK/out.txt"
if [ "$rc" -ne 0 ]; then
    echo "FAIL: pdlink run --router vllm-router exited with $rc; stderr:"
    tail -40 "$WORK/err.txt"
    for f in "$WORK"/logs/*router.log; do echo "--- $f"; tail -20 "$f"; done
    exit 1
fi
grep -q '^PASS: 5/5 topologies' "$WORK/out.txt" || { echo "FAIL: no PASS verdict line"; exit 1; }

/usr/bin/python3 - "$WORK/report.json" "$WORK/logs" <<'PY' || exit 1
import json, os, sys
r = json.load(open(sys.argv[1]))
logs = sys.argv[2]
names = [t["name"] for t in r["topologies"]]
assert names == ["1p1d", "2p1d", "1p2d", "p4d8", "p8d4"], names
assert r["pass"] is True and r["passed"] == 5, r["passed"]
for t in r["topologies"]:
    n = t["name"]
    assert t["ok"] == t["requests"] == 12 and t["failed"] == 0, (n, t["ok"], t["failed"])
    assert t["parity_ok"] == t["parity_total"] == 12, (n, t["parity_ok"])
    assert t["bytes_mismatched"] == 0 and t["bytes_verified"] > 0, n
    assert t["expired"] == 0 and t["held_blocks"] == 0, (n, t["expired"], t["held_blocks"])
    assert t["releases_sent"] == t["releases_received"] == t["releases_expected"], \
        (n, t["releases_sent"], t["releases_received"], t["releases_expected"])
    assert t["pulls"] == 12, (n, t["pulls"])
    # The real router, not pdlink-router: its own log lines, consistent_hash in MoRIIO READ mode.
    log = open(os.path.join(logs, n + "-router.log"), errors="replace").read()
    assert "kv_connector=MoriIO" in log, n
    assert "MoRI-IO transfer mode set to Read" in log, n
    assert log.count("Consistent hash routing") >= 2 * 12, (n, log.count("Consistent hash routing"))
print("ok: all five seed topologies behind vllm-router: parity, bytes, releases, 0 expired, 0 held")
PY
