#!/usr/bin/env bash
# test_flood.sh -- services that do not fall over under a flood of idle connections: a 1P1D cluster
# (tcp backend) whose every listening port gets 1,100 idle connections while the services run at
# ulimit -n 1024 (tools/flood-check). /health of each service, a handshake on each handshake port and a
# completion through the router whose first pull connects under the flood must all be answered, every
# service must still be alive, and the logs stay bounded. Before the data port's and the ROUTERs' shares
# of the descriptor limit, this killed both nodes: libzmq's bind aborts when out of descriptors
# ("Too many open files (src/ip_resolver.cpp:542)"), and libmicrohttpd, once at EMFILE, accepted nothing
# until an idle connection timed out.
set -euo pipefail
source "$(dirname "$0")/test_run_lib.bash" test_flood pdlink-node pdlink-router
rc=0

/usr/bin/python3 "$SRC/tools/flood-check" --build "$BUILD" --conns 1100 --nofile 1024 --log-dir "$WORK/logs" \
    --json >"$WORK/flood.json" 2>"$WORK/err.txt" || rc=$?
cat "$WORK/flood.json" "$WORK/err.txt"
[ "$rc" -eq 0 ] || fail "flood-check exited with $rc"
/usr/bin/python3 - "$WORK/flood.json" <<'PY' || fail "flood-check's report"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["result"] == "pass", r
assert r["connections"] >= 1100, r["connections"]  # at least one port's worth got through the kernel
for name, c in r["checks"].items():
    assert c["ok"], (name, c)
assert all(r["alive"].values()), r["alive"]
assert r["decode kv bytes mismatched"] == "0", r["decode kv bytes mismatched"]
for name, n in r["log_bytes"].items():  # a few rate-limited lines, not one per refused connection
    assert n < 64 * 1024, (name, n)
for name, pct in r["cpu_percent_idle"].items():  # a listener spinning on EMFILE burns a whole core
    assert pct < 25.0, (name, pct)
PY
echo "PASS: test_flood"
